"""Recorded loops whose model outputs sequences [n, T, V] and whose loss is
the mean token cross-entropy over integer tokens y [n, T]: the recorder
stores them as a sequence data set (include/pathkernel/sequence.h) and
`pathkernel verify --position t` closes the identity at position t."""
import json
import math
import os

import numpy as np

from _helpers import F, Recorder, TempDirTest, batches, cli_json, need_binary, nn, torch
from pathkernel.record import RecorderError

MAX_REL_ERROR = 1e-12
MAX_ROUNDING = 1e-10
V, T, D = 5, 4, 6


class TinyCausal(nn.Module):
    """Token and position embeddings, one causal self-attention, a readout
    of V logits at every position."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.pos = nn.Parameter(0.3 * torch.randn(T, D))
        self.q = nn.Linear(D, D)
        self.k = nn.Linear(D, D)
        self.v = nn.Linear(D, D)
        self.out = nn.Linear(D, V)
        self.scale = 1 / math.sqrt(D)

    def forward(self, x):
        h = self.embed(x) + self.pos
        scores = self.q(h) @ self.k(h).transpose(1, 2) * self.scale
        t = x.shape[1]
        future = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        att = scores.masked_fill(future, float("-inf")).softmax(-1)
        return self.out(torch.tanh(h + att @ self.v(h)))


def sequences(n, seed):
    """Tokens x [n, T] and the next token at every position y [n, T] of a
    noisy counting sequence."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, V, (n, 1), generator=g)
    steps = torch.randint(1, 3, (n, T + 1), generator=g).cumsum(1)
    tokens = (start + steps) % V
    return tokens[:, :T].contiguous(), tokens[:, 1:].contiguous()


def tiny_causal():
    torch.manual_seed(0)
    return TinyCausal().double()


def record_sequence_loop(run, every_step, vocabulary=None, steps=9):
    x, y = sequences(20, 1)
    xt, yt = sequences(5, 2)
    model = tiny_causal()
    opt = torch.optim.Adam(model.parameters(), lr=0.03)
    with Recorder(run, model, opt, x, y, test_x=xt, test_y=yt, every_step=every_step,
                  vocabulary=vocabulary) as rec:
        for idx in batches(20, 5, steps):
            opt.zero_grad()
            logits = model(x[idx])
            F.cross_entropy(logits.flatten(0, 1), y[idx].flatten()).backward()
            opt.step()
            rec.step(idx)
    with torch.no_grad():
        return F.log_softmax(model(xt), dim=-1).numpy()


class RecordedSequences(TempDirTest):
    def setUp(self):
        super().setUp()
        need_binary(self)

    def verify(self, run, position):
        return cli_json(self, ["verify", run, "--test", "5", "--position", str(position)], cwd=self.tmp)

    def assert_exact_at(self, run, positions, final):
        """verify closes at each position, where the engine's f(w_N) is the
        model's own log-probabilities ``final`` [n, T, V] there."""
        for t in positions:
            with self.subTest(position=t):
                j = self.verify(run, t)
                self.assertEqual(j["position"], t, j)
                self.assertLessEqual(j["max_rel_error"], MAX_REL_ERROR, j)
                self.assertLessEqual(j["max_abs_rounding"], MAX_ROUNDING, j)
                self.assertTrue(j.get("updates_explained", True), j)
                out = self.path("explain-%s-%d" % (os.path.basename(run), t))
                cli_json(self, ["explain", run, "--test", "5", "--position", str(t), "--out", out], cwd=self.tmp)
                with open(os.path.join(out, "explain.json")) as f:
                    points = json.load(f)["points"]
                self.assertEqual(len(points), 5)
                for p in points:
                    np.testing.assert_allclose(p["f_final"], final[p["test_index"], t], rtol=0, atol=1e-12)

    def test_stored_as_a_sequence_data_set(self):
        run = self.path("seq")
        record_sequence_loop(run, every_step=True)
        with open(os.path.join(run, "manifest.json")) as f:
            data = json.load(f)["data"]
        self.assertEqual((data["sequence_length"], data["num_classes"], data["input_shape"]), (T, V, [T]))
        y = np.load(os.path.join(run, "data", "train_y.npy"))
        self.assertEqual((y.dtype, y.shape), (np.int64, (20, T)))
        np.testing.assert_array_equal(y, sequences(20, 1)[1].numpy())
        with open(os.path.join(run, "data", "vocabulary.json")) as f:
            self.assertEqual(json.load(f), ["<%d>" % i for i in range(V)])

    def test_verify_at_two_positions_every_step(self):
        run = self.path("every")
        final = record_sequence_loop(run, every_step=True, vocabulary=list("abcde"))
        with open(os.path.join(run, "data", "vocabulary.json")) as f:
            self.assertEqual(json.load(f), list("abcde"))
        self.assert_exact_at(run, (0, T - 1), final)

    def test_verify_at_two_positions_compact(self):
        run = self.path("compact")
        final = record_sequence_loop(run, every_step=False)
        self.assert_exact_at(run, (1, T - 1), final)


class RefusedSequences(TempDirTest):
    def test_labels_not_tokens(self):
        x, y = sequences(10, 1)
        model = tiny_causal()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with self.assertRaisesRegex(RecorderError, r"train_y has shape \[10\], but the model outputs sequences "
                                                   r"\[n, T, V\] = \[10, 4, 5\]; expected tokens of shape \[n, T\]"):
            Recorder(self.path("a"), model, opt, x, y[:, -1])
        with self.assertRaisesRegex(RecorderError, r"vocabulary holds 3 strings, but the model outputs V = 5"):
            Recorder(self.path("b"), model, opt, x, y, vocabulary=["a", "b", "c"])
        with self.assertRaisesRegex(RecorderError, r"loss 'mse' takes outputs \[n, K\]"):
            Recorder(self.path("c"), model, opt, x, y, loss="mse")

"""Recorded loops with BatchNorm in training mode (docs/math.md §15): the
recorder stores the module's running statistics μ at every checkpoint, as
pathkernel's own runs do, and `pathkernel verify` closes the identity
f(w_N) = f(w_0) + Σ C + R + E + S on them, every step stored or compact."""
import json
import os

import numpy as np

from _helpers import F, Recorder, TempDirTest, batches, cli_json, need_binary, nn, torch
from pathkernel._files import crc32, npy_bytes
from pathkernel.record import RecorderError

MAX_REL_ERROR = 1e-12
MAX_ROUNDING = 1e-10  # |E| of a loop the declaration describes: rounding

OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-3),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.02, weight_decay=0.05),
}


class SmallCNN(nn.Module):
    """conv -> BatchNorm2d (affine, running statistics) -> tanh -> linear.
    The convolution has no bias, as usual before a BatchNorm: the batch's
    mean removes it, so its gradient is zero but for rounding, which Adam's
    normalisation would blow up to steps of the order of the learning rate
    (a path no decomposition follows to 1e-12; docs/own-model.md)."""

    def __init__(self, track_running_stats=True, momentum=0.1):
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3, bias=False)
        self.bn = nn.BatchNorm2d(3, momentum=momentum, track_running_stats=track_running_stats)
        self.out = nn.Linear(27, 3)

    def forward(self, x):
        return self.out(torch.tanh(self.bn(self.conv(x))).flatten(1))


def images(n, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    x = torch.randn(n, 1, 5, 5, generator=g, dtype=torch.float64) + y.view(-1, 1, 1, 1).double()
    return x, y


def small_cnn(**kw):
    torch.manual_seed(0)
    return SmallCNN(**kw).double()


def record_bn_loop(run, optimizer, every_step, steps=10, momentum=0.1):
    """A user's loop over a BatchNorm CNN in training mode; returns the
    model's buffers after every step (the reference the run must hold) and
    the test outputs (log-probabilities) of the model in eval mode before and
    after training."""
    x, y = images(24, 3)
    xt, _ = images(6, 4)
    model = small_cnn(momentum=momentum)
    opt = OPTIMIZERS[optimizer](model.parameters())
    outputs = [eval_outputs(model, xt)]
    buffers = []
    with Recorder(run, model, opt, x, y, test_x=xt, test_y=torch.arange(6) % 3, every_step=every_step) as rec:
        for idx in batches(24, 6, steps):
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
            rec.step(idx)
            buffers.append(np.concatenate([b.detach().double().reshape(-1).numpy() for b in model.buffers()]))
    outputs.append(eval_outputs(model, xt))
    return buffers, outputs


def eval_outputs(model, x):
    """The model's log-probabilities in eval mode (its running statistics),
    its mode then given back."""
    model.eval()
    with torch.no_grad():
        out = F.log_softmax(model(x), dim=1).numpy()
    model.train()
    return out


class RecordedBatchNorm(TempDirTest):
    def setUp(self):
        super().setUp()
        need_binary(self)

    def verify(self, run):
        return cli_json(self, ["verify", run, "--test", "4"], cwd=self.tmp)

    def assert_run_holds_buffers(self, run, buffers):
        """Every checkpoint lists μ_s, bit for bit the model's buffers after
        step s - 1 (running_mean, running_var, num_batches_tracked)."""
        with open(os.path.join(run, "manifest.json")) as f:
            manifest = json.load(f)
        checkpoints = manifest["checkpoints"]
        self.assertGreater(len(checkpoints), 2)
        for c in checkpoints:
            mu = np.load(os.path.join(run, c["module_buffers"]["file"]))
            self.assertEqual(mu.dtype, np.float64)
            if c["step"] == 0:
                np.testing.assert_array_equal(mu, np.concatenate([np.zeros(3), np.ones(3), [0.0]]))
            else:
                np.testing.assert_array_equal(mu, buffers[c["step"] - 1])
                self.assertEqual(mu[-1], c["step"])  # num_batches_tracked
        return manifest

    def assert_outputs(self, run, outputs):
        """The engine's f(w_0, μ_0; x) and f(w_N, μ_N; x) are the model's own
        eval-mode outputs before and after the loop."""
        out = self.path("explain-" + os.path.basename(run))
        j = cli_json(self, ["explain", run, "--test", "3", "--out", out], cwd=self.tmp)
        with open(os.path.join(out, "explain.json")) as f:
            points = json.load(f)["points"]
        self.assertEqual(len(points), 3, j)
        for p in points:
            i = p["test_index"]
            np.testing.assert_allclose(p["f_initial"], outputs[0][i], rtol=0, atol=1e-12)
            np.testing.assert_allclose(p["f_final"], outputs[1][i], rtol=0, atol=1e-12)

    def assert_exact(self, run):
        j = self.verify(run)
        self.assertLessEqual(j["max_rel_error"], MAX_REL_ERROR, j)
        self.assertLessEqual(j["max_abs_rounding"], MAX_ROUNDING, j)
        self.assertTrue(j.get("updates_explained", True), j)
        # The running statistics moved the test outputs: S is there, not zero.
        self.assertGreater(j["max_abs_statistics"], 1e-6, j)
        return j

    def assert_recorded_loop(self, optimizer, every_step):
        """Records the loop in one format and checks μ bit for bit, the
        identity and the engine's outputs; returns the manifest and verify's
        JSON."""
        run = self.path(("every-" if every_step else "compact-") + optimizer)
        buffers, outputs = record_bn_loop(run, optimizer, every_step=every_step)
        manifest = self.assert_run_holds_buffers(run, buffers)
        j = self.assert_exact(run)
        self.assert_outputs(run, outputs)
        return manifest, j

    def test_every_step_sgd_momentum_adamw(self):
        for optimizer in OPTIMIZERS:
            with self.subTest(optimizer=optimizer):
                manifest, _ = self.assert_recorded_loop(optimizer, every_step=True)
                self.assertEqual(len(manifest["checkpoints"]), 11)

    def test_compact_sgd_momentum_adamw(self):
        """The engine replays the steps between checkpoints from μ at the
        checkpoint before them, and rejoins the recorded μ at the next."""
        for optimizer in OPTIMIZERS:
            with self.subTest(optimizer=optimizer):
                manifest, j = self.assert_recorded_loop(optimizer, every_step=False)
                self.assertLess(len(manifest["checkpoints"]), 11)
                drift = j.get("replay_drift", {})
                self.assertEqual(drift.get("max_abs_diff", 0), 0, j)

    def test_compact_replay_rejoins_the_recorded_statistics(self):
        """A checkpoint's μ that the replay does not reproduce (here moved by
        hand) is drift, reported at that checkpoint; the path rejoins the
        recorded μ there, so the identity still closes."""
        run = self.path("moved")
        record_bn_loop(run, "momentum", every_step=False)
        with open(os.path.join(run, "manifest.json")) as f:
            manifest = json.load(f)
        steps = [c["step"] for c in manifest["checkpoints"]]
        k = next(i for i in range(1, len(steps) - 1) if steps[i] - steps[i - 1] > 1)  # ends a replayed segment
        record = manifest["checkpoints"][k]["module_buffers"]
        mu = np.load(os.path.join(run, record["file"]))
        mu[0] += 0.25  # the first running mean
        data = npy_bytes(mu)
        with open(os.path.join(run, record["file"]), "wb") as f:
            f.write(data)
        record.update(bytes=len(data), crc32=crc32(data))
        with open(os.path.join(run, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=2)
        j = self.verify(run)
        self.assertLessEqual(j["max_rel_error"], MAX_REL_ERROR, j)
        drift = j["replay_drift"]
        self.assertEqual(drift["at_checkpoint_step"], steps[k], j)
        self.assertAlmostEqual(drift["max_abs_diff"], 0.25, delta=1e-12)

    def test_cumulative_average(self):
        """momentum=None: the running statistics are the cumulative average,
        which the counter num_batches_tracked (one of μ's buffers) drives."""
        run = self.path("cumulative")
        record_bn_loop(run, "momentum", every_step=False, momentum=None)
        self.assert_exact(run)


class RefusedBatchNorm(TempDirTest):
    def setUp(self):
        super().setUp()
        self.x, self.y = images(12, 1)

    def test_no_running_statistics(self):
        model = small_cnn(track_running_stats=False)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with self.assertRaisesRegex(RecorderError, r"the BatchNorm 'bn' \(BatchNorm2d\) has track_running_stats=False "
                                                   r"and no running statistics, expected track_running_stats=True"):
            Recorder(self.path("run"), model, opt, self.x, self.y)
        model.bn.eval()  # eval mode without running statistics still normalises by the batch
        with self.assertRaisesRegex(RecorderError, r"track_running_stats=False"):
            Recorder(self.path("run2"), model, opt, self.x, self.y)

    def test_sync_batch_norm(self):
        model = small_cnn()
        model.bn = nn.SyncBatchNorm(3).double()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with self.assertRaisesRegex(RecorderError, r"the BatchNorm 'bn' is a SyncBatchNorm in training mode: .* "
                                                   r"expected nn.BatchNorm1d/2d/3d"):
            Recorder(self.path("run"), model, opt, self.x, self.y)

    def test_traced_in_training_mode(self):
        """A trace bakes the BatchNorm's training mode into the graph, so the
        saved module could not evaluate test points with running statistics."""
        model = small_cnn()
        traced = torch.jit.trace(model, self.x[:4], check_trace=False)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with self.assertRaisesRegex(RecorderError, r"outputs on train_x\[:8\] are not the model's .*\(a traced module "
                                                   r"keeps the mode it was traced in"):
            Recorder(self.path("run"), model, opt, self.x, self.y, script=traced)

    def test_two_forwards_in_a_step(self):
        """Gradient accumulation over two halves moves the running statistics
        twice, with other statistics than the whole batch's."""
        model = small_cnn()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with self.assertRaisesRegex(RecorderError, r"step 0: the BatchNorm 'bn' saw 2 training-mode forward\(s\) in "
                                                   r"the step \(num_batches_tracked 0 -> 2\), expected 1"):
            with Recorder(self.path("run"), model, opt, self.x, self.y) as rec:
                opt.zero_grad()
                for half in (torch.arange(0, 3), torch.arange(3, 6)):
                    (F.cross_entropy(model(self.x[half]), self.y[half]) / 2).backward()
                opt.step()
                rec.step(torch.arange(6))

    def test_mode_changed(self):
        model = small_cnn()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with self.assertRaisesRegex(RecorderError, r"step 0: the BatchNorm 'bn' is in eval mode, but it was in "
                                                   r"training mode when the Recorder was created"):
            with Recorder(self.path("run"), model, opt, self.x, self.y) as rec:
                model.eval()
                opt.zero_grad()
                F.cross_entropy(model(self.x[:6]), self.y[:6]).backward()
                opt.step()
                rec.step(torch.arange(6))

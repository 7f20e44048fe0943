"""Recorded loops decomposed by the C++ engine: `pathkernel verify` on runs
recorded from PyTorch loops with every supported optimizer and loss, and a
loop that does something it did not declare (clipping) is caught, at its step.

These need the engine that reads a recorded path (issue 18's C++ side)."""
import json
import re

from _helpers import (F, Recorder, TempDirTest, batches, blobs, cli, cli_json, clip_grad_norm_, loss_fn, mlp, need_binary,
                      nn, record_cross_entropy, torch)

MAX_REL_ERROR = 1e-12
# |E|, the rounding term, of a loop the declaration describes: rounding of a
# few float64 steps of outputs of order 1.
MAX_ROUNDING = 1e-10

OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-3),
    "nesterov": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True, weight_decay=1e-3),
    "adam": lambda p: torch.optim.Adam(p, lr=0.02, weight_decay=1e-3),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.02, weight_decay=0.05),
    # torch's multi-tensor steps: the same arithmetic, replayed bit for bit.
    "adam-foreach": lambda p: torch.optim.Adam(p, lr=0.02, weight_decay=1e-3, foreach=True),
    "momentum-foreach": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, foreach=True),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=0.01, alpha=0.9, weight_decay=1e-3),
    "rmsprop-centered": lambda p: torch.optim.RMSprop(p, lr=0.01, centered=True, foreach=True),
    "rmsprop-momentum": lambda p: torch.optim.RMSprop(p, lr=0.005, momentum=0.8, weight_decay=1e-3),
    "rmsprop-momentum-foreach": lambda p: torch.optim.RMSprop(p, lr=0.005, momentum=0.5, centered=True,
                                                              foreach=True),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.05, initial_accumulator_value=0.1,
                                             weight_decay=1e-3),
    "adagrad-eps": lambda p: torch.optim.Adagrad(p, lr=0.1, eps=1e-6),
}

SCHEDULERS = {
    "sgd": None,
    "momentum": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.7),
    "nesterov": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: min(1.0, (s + 1) / 4)),
    "adam": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=10),
    "adamw": lambda o: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.9),
    "rmsprop": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=4, gamma=0.5),
    "rmsprop-centered": None,
    "rmsprop-momentum": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=10),
    "rmsprop-momentum-foreach": None,
    "adam-foreach": None,
    "momentum-foreach": None,
    "adagrad": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=10),
    "adagrad-eps": None,
}


def record(directory, optimizer, loss, steps=10, clip=None, declare_clip=True, clip_at=None, output=None,
           every_step=False):
    """A user's loop: their sampler, their scheduler, their loss."""
    x, y = blobs(40)
    xt, yt = blobs(12, seed=5)
    model = mlp(log_softmax=(loss == "nll"))
    if loss == "mse":
        y, yt = F.one_hot(y, 3).double(), F.one_hot(yt, 3).double()
    opt = OPTIMIZERS[optimizer](model.parameters())
    sched = SCHEDULERS[optimizer](opt) if SCHEDULERS[optimizer] else None
    kw = {} if output is None else {"output": output}
    rec = Recorder(directory, model, opt, x, y, test_x=xt, test_y=yt, loss=loss, every_step=every_step, **kw)
    fn = loss_fn(loss)
    for s, idx in enumerate(batches(40, 8, steps)):
        opt.zero_grad()
        fn(model(x[idx]), y[idx]).backward()
        if clip is not None and (clip_at is None or s == clip_at):
            if declare_clip:
                clip_grad_norm_(model.parameters(), clip)
            else:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        rec.step(idx)
        if sched is not None:
            sched.step()
    rec.close()
    return rec


class VerifyRecordedRuns(TempDirTest):
    def setUp(self):
        super().setUp()
        need_binary(self)

    def verify(self, run):
        rc, out, err = cli(["--quiet", "--json", "verify", run, "--test", "3"], cwd=self.tmp)
        return rc, out, err

    def assert_exact(self, run):
        rc, out, err = self.verify(run)
        self.assertEqual(rc, 0, "verify failed:\n%s\n%s" % (out, err[-3000:]))
        j = json.loads(out[out.find("{"):])
        self.assertLessEqual(j["max_rel_error"], MAX_REL_ERROR, out)
        self.assertLessEqual(j["max_abs_rounding"], MAX_ROUNDING, out)
        self.assertTrue(j.get("updates_explained", True), out)
        return j

    def test_every_optimizer_and_loss(self):
        for optimizer in OPTIMIZERS:
            for loss in ("cross_entropy", "nll", "mse"):
                with self.subTest(optimizer=optimizer, loss=loss):
                    run = self.path("%s-%s" % (optimizer, loss))
                    record(run, optimizer, loss)
                    j = self.assert_exact(run)
                    # The replay took the loop's own steps: every checkpoint bit for bit.
                    drift = j["replay_drift"]
                    self.assertEqual(drift["bit_for_bit"], drift["checkpoints"], drift)

    def test_logits_output_and_declared_clipping(self):
        run = self.path("logits")
        record(run, "momentum", "cross_entropy", output="logits")
        self.assert_exact(run)
        run = self.path("clipped")
        record(run, "adam", "cross_entropy", clip=0.05)
        self.assert_exact(run)

    def test_undeclared_clipping_in_a_compact_run_is_found_in_its_segment(self):
        """A compact run replays the declared steps between checkpoints 6 and
        9, so the undeclared clipping at step 6 shows as drift at checkpoint
        9, carried by the segment's last step (8)."""
        run = self.path("hidden-clip-compact")
        record(run, "sgd", "cross_entropy", clip=1e-3, declare_clip=False, clip_at=6, every_step=False)
        rc, out, err = self.verify(run)
        self.assertEqual(rc, 0, out + err)
        j = json.loads(out[out.find("{"):])
        self.assertLessEqual(j["max_rel_error"], MAX_REL_ERROR, out)
        self.assertEqual((j["updates_explained"], j["first_unexplained_step"]), (False, 8), out)
        self.assertEqual(j["replay_drift"]["at_checkpoint_step"], 9, out)
        self.assertIn("replayed from step 6", j["replay_drift"]["message"])

    def test_undeclared_clipping_is_found_at_its_step(self):
        run = self.path("hidden-clip")
        record(run, "sgd", "cross_entropy", clip=1e-3, declare_clip=False, clip_at=6, every_step=True)
        rc, out, err = self.verify(run)
        text = out + "\n" + err
        # Far above rounding, and the message names step 6 (the first step
        # the declaration does not describe).
        self.assertRegex(text, r"\bstep 6\b", "verify does not name step 6:\n%s" % text[-3000:])
        start = out.find("{")
        if start >= 0:
            j = json.loads(out[start:])
            self.assertGreater(j["max_abs_rounding"], 1e3 * MAX_ROUNDING, out)
            # The kernel machine still equals the network: E carries the difference.
            self.assertLessEqual(j["max_rel_error"], MAX_REL_ERROR, out)
            self.assertFalse(j.get("updates_explained", False), out)
            self.assertEqual(j.get("first_unexplained_step", 6), 6, out)


class MoreOutputsThanLabels(TempDirTest):
    """K is the model's output width, also when the labels use fewer classes."""

    def test_four_outputs_three_labels(self):
        need_binary(self)
        x, y = blobs(30)
        model = mlp(k=4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        run = self.path("k4")
        record_cross_entropy(run, model, opt, x, y, 6, 6)
        rc, out, err = cli(["--quiet", "--json", "verify", run, "--test", "3"], cwd=self.tmp)
        self.assertEqual(rc, 0, "verify failed:\n%s\n%s" % (out, err[-3000:]))
        j = json.loads(out[out.find("{"):])
        self.assertLessEqual(j["max_rel_error"], MAX_REL_ERROR, out)


class TokenModel(TempDirTest):
    """Integer inputs (token ids) through an embedding, AdamW with a warm-up,
    and check-path on the recorded run (it checks the files; nothing to replay)."""

    def test_tokens_adamw(self):
        need_binary(self)

        class Tokens(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(7, 4)
                self.out = nn.Linear(8, 3)

            def forward(self, t):
                return self.out(torch.tanh(self.embed(t).flatten(1)))

        torch.manual_seed(0)
        model = Tokens().double()
        g = torch.Generator().manual_seed(2)
        tokens = torch.randint(0, 7, (30, 2), generator=g)
        labels = (tokens[:, 0] + tokens[:, 1]) % 3
        opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.2, total_iters=4)
        run = self.path("tokens")
        with Recorder(run, model, opt, tokens, labels, test_x=tokens[:5], test_y=labels[:5]) as rec:
            for idx in batches(30, 6, 8):
                opt.zero_grad()
                F.cross_entropy(model(tokens[idx]), labels[idx]).backward()
                opt.step()
                rec.step(idx)
                sched.step()
        rc, out, err = cli(["--quiet", "check-path", run], cwd=self.tmp)
        self.assertEqual(rc, 0, "check-path failed:\n%s\n%s" % (out, err[-3000:]))
        rc, out, err = cli(["--quiet", "--json", "verify", run, "--test", "3"], cwd=self.tmp)
        self.assertEqual(rc, 0, "verify failed:\n%s\n%s" % (out, err[-3000:]))
        j = json.loads(out[out.find("{"):])
        self.assertLessEqual(j["max_rel_error"], MAX_REL_ERROR, out)
        self.assertLessEqual(j["max_abs_rounding"], MAX_ROUNDING, out)


class ReluModel(TempDirTest):
    """A ReLU network: the engine cuts each step at kinks on the recorded path."""

    def test_relu_adam(self):
        need_binary(self)

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc1 = nn.Linear(4, 8)
                self.out = nn.Linear(8, 3)

            def forward(self, x):
                return self.out(torch.relu(self.fc1(x)))

        torch.manual_seed(0)
        model = Net().double()
        x, y = blobs(40)
        opt = torch.optim.Adam(model.parameters(), lr=0.05)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
        run = self.path("relu")
        with Recorder(run, model, opt, x, y, test_x=x[:6], test_y=y[:6]) as rec:
            for idx in batches(40, 10, 10):
                opt.zero_grad()
                F.cross_entropy(model(x[idx]), y[idx]).backward()
                opt.step()
                rec.step(idx)
                sched.step()
        rc, out, err = cli(["--quiet", "--json", "verify", run, "--test", "3"], cwd=self.tmp)
        self.assertEqual(rc, 0, "verify failed:\n%s\n%s" % (out, err[-3000:]))
        j = json.loads(out[out.find("{"):])
        self.assertLessEqual(j["max_rel_error"], MAX_REL_ERROR, out)
        self.assertTrue(re.match(r"float64", j.get("dtype", "float64")))


class Dropout(nn.Module):
    """Two nn.Dropout sites, one on a ReLU layer, one on a tanh layer."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 12)
        self.drop1 = nn.Dropout(0.3)
        self.fc2 = nn.Linear(12, 12)
        self.drop2 = nn.Dropout(0.2)
        self.out = nn.Linear(12, 3)

    def forward(self, x):
        return self.out(self.drop2(torch.tanh(self.fc2(self.drop1(torch.relu(self.fc1(x)))))))


class PooledCNN(nn.Module):
    """Convolutions, ReLU and nn.MaxPool2d(2), as a LeNet-like model has them."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.out = nn.Linear(8 * 2 * 2, 3)

    def forward(self, x):
        h = self.pool(torch.relu(self.conv1(x)))
        h = self.pool(torch.relu(self.conv2(h)))
        return self.out(torch.flatten(h, 1))


class MaxPoolLoop(TempDirTest):
    """A recorded CNN with max-pooling: its pools' argmax switches are kinks
    the engine locates, so each step is integrated piece by piece with the
    exact rule, L = 3 nodes per piece for log-softmax outputs (docs/math.md
    §7). Without them the pieces would hold unseen switches: the adaptive rule
    then spends many times that, and the error grows."""

    def test_pieces_are_integrated_exactly(self):
        need_binary(self)
        torch.manual_seed(0)
        x = torch.randn(64, 1, 8, 8, dtype=torch.float64)
        y = torch.randint(0, 3, (64,))
        model = PooledCNN().double()
        run = self.path("cnn")
        record_cross_entropy(run, model, OPTIMIZERS["momentum"](model.parameters()), x, y, 16, 15, test=4)
        j = cli_json(self, ["verify", run, "--test", "4"], cwd=self.tmp)
        self.assertEqual(j["route"], "structured", j)
        self.assertLessEqual(j["max_rel_error"], MAX_REL_ERROR, j)
        self.assertTrue(j["updates_explained"], j)
        self.assertGreater(j["mean_kinks_per_step"], 0, j)
        # L nodes per piece, and a little more where a piece is taken again.
        self.assertLessEqual(j["mean_evaluations_per_step"], 4 * (j["mean_kinks_per_step"] + 1), j)


class DropoutLoop(TempDirTest):
    """A loop whose model has dropout: the recorder has it draw pathkernel's
    own masks, seeded per step, site and example, so the C++ engine computes
    each training point's gradient under the mask it had, and every recorded
    update is explained. Drawn by torch instead, the updates are not."""

    def record(self, run, optimizer="momentum"):
        x, y = blobs(40)
        torch.manual_seed(3)
        model = Dropout().double()
        record_cross_entropy(run, model, OPTIMIZERS[optimizer](model.parameters()), x, y, 8, 12, test=6)

    def verify(self, run):
        return cli_json(self, ["verify", run, "--test", "3"], cwd=self.tmp)

    def test_masks_are_the_engines(self):
        need_binary(self)
        original = F.dropout
        for optimizer in ("sgd", "momentum", "adamw"):
            with self.subTest(optimizer=optimizer):
                run = self.path("drop-" + optimizer)
                self.record(run, optimizer)
                j = self.verify(run)
                self.assertLessEqual(j["max_rel_error"], MAX_REL_ERROR, j)
                self.assertLessEqual(j["max_abs_rounding"], MAX_ROUNDING, j)
                self.assertTrue(j["updates_explained"], j)
        self.assertIs(F.dropout, original)  # torch's own again once the recorders closed

    def test_torchs_own_masks_leave_the_updates_unexplained(self):
        need_binary(self)
        import pathkernel.record as record_module

        class TorchMasks:  # the recorder without pathkernel's masks
            def __init__(self, *args):
                pass

            def remove(self):
                pass

        saved = record_module.SeededForward
        record_module.SeededForward = TorchMasks
        try:
            run = self.path("torch-masks")
            self.record(run, "sgd")
        finally:
            record_module.SeededForward = saved
        j = self.verify(run)
        self.assertFalse(j["updates_explained"], j)
        self.assertEqual(j["first_unexplained_step"], 0, j)

    def test_a_dropout_the_recorder_cannot_see_is_refused_at_its_forward(self):
        class Direct(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 3)

            def forward(self, x):
                return torch.dropout(self.fc(x), 0.3, self.training)  # a graph site, not a call of F.dropout

        x, y = blobs(20)
        model = Direct().double()
        rec = Recorder(self.path("direct"), model, torch.optim.SGD(model.parameters(), lr=0.1), x, y)
        with self.assertRaisesRegex(Exception, r"step 0: the model's forward called dropout 0 time\(s\), but its "
                                               r"TorchScript graph holds 1 dropout site\(s\).*nn.Dropout modules"):
            model(x[:5])
        rec.close()

    def test_a_mode_change_is_refused_at_its_step(self):
        original = F.dropout
        x, y = blobs(20)
        model = Dropout().double()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        rec = Recorder(self.path("modes"), model, opt, x, y)
        idx = torch.arange(5)
        model.eval()  # evaluating, and training on without model.train()
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
        with self.assertRaisesRegex(Exception, r"step 0: the model's modes \(train/eval\) are not those it had"):
            rec.step(idx)
        self.assertIsNot(F.dropout, original)  # pathkernel's masks while the recorder is open
        rec.close()
        self.assertIs(F.dropout, original)

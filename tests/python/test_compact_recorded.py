"""Compact recordings (the recorder's default): checkpoints every ~√N steps in
the model's dtype, the steps between replayed by the engine with the saved
TorchScript module and LibTorch's optimizer. `pathkernel verify` decomposes
them exactly; replay reproduces the loop's checkpoints bit for bit (the
Python loop and the engine run the same LibTorch kernels); a checkpoint the
replay does not reproduce is reported as drift at that checkpoint."""
import json
import os
import zlib

from _helpers import (MLP, F, Recorder, TempDirTest, batches, blobs, cli, clip_grad_norm_, mlp, need_binary, np,
                      thread_counts_kept, torch)

from pathkernel._environment import _openblas_library

MAX_REL_ERROR = 1e-12

# Every optimizer with weight decay, each with a scheduler.
OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1, weight_decay=1e-3),
    "momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-3),
    "nesterov": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True, weight_decay=1e-3),
    "adam": lambda p: torch.optim.Adam(p, lr=0.02, weight_decay=1e-3),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.02, weight_decay=0.05),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=0.01, centered=True, weight_decay=1e-3),
    "rmsprop-momentum": lambda p: torch.optim.RMSprop(p, lr=0.005, momentum=0.7, weight_decay=1e-3),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=0.05, lr_decay=0.01, weight_decay=1e-3),
}

SCHEDULERS = {
    "sgd": lambda o: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.95),
    "momentum": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.7),
    "nesterov": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: min(1.0, (s + 1) / 4)),
    "adam": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=10),
    "adamw": lambda o: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.9),
    "rmsprop": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=5, gamma=0.5),
    "rmsprop-momentum": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=5, gamma=0.5),
    "adagrad": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=10),
}


def record(directory, optimizer, dtype=torch.float64, steps=20, clip=0.3, **kw):
    """A user's loop with their scheduler, clipping and weight decay."""
    x, y = blobs(40, dtype=dtype)
    xt, yt = blobs(12, seed=5, dtype=dtype)
    model = mlp().to(dtype)
    opt = OPTIMIZERS[optimizer](model.parameters())
    sched = SCHEDULERS[optimizer](opt)
    with Recorder(directory, model, opt, x, y, test_x=xt, test_y=yt, **kw) as rec:
        for idx in batches(40, 8, steps):
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            clip_grad_norm_(model.parameters(), clip)
            opt.step()
            rec.step(idx)
            sched.step()
    return rec


def manifest(run):
    with open(os.path.join(run, "manifest.json")) as f:
        return json.load(f)


class CompactRecordings(TempDirTest):
    def setUp(self):
        super().setUp()
        need_binary(self)

    def verify(self, run):
        rc, out, err = cli(["--quiet", "--json", "verify", run, "--test", "3"], cwd=self.tmp)
        self.assertEqual(rc, 0, "verify failed:\n%s\n%s" % (out, err[-3000:]))
        return json.loads(out[out.find("{"):])

    def test_every_optimizer_and_dtype_verifies_and_replays_bit_for_bit(self):
        for dtype in (torch.float64, torch.float32):
            for optimizer in OPTIMIZERS:
                with self.subTest(optimizer=optimizer, dtype=dtype):
                    run = self.path("%s-%s" % (optimizer, str(dtype)[6:]))
                    record(run, optimizer, dtype)
                    m = manifest(run)
                    self.assertEqual([c["step"] for c in m["checkpoints"]], [0, 1, 2, 4, 6, 9, 12, 16, 20])
                    j = self.verify(run)
                    self.assertLessEqual(j["max_rel_error"], MAX_REL_ERROR, j)
                    self.assertTrue(j["updates_explained"], j)
                    drift = j["replay_drift"]
                    # The loop and the replay run the same LibTorch arithmetic.
                    self.assertEqual(drift["max_abs_diff"], 0, drift)
                    self.assertEqual(drift["bit_for_bit"], drift["checkpoints"], drift)
                    self.assertIsNone(drift["at_checkpoint_step"], drift)
                    self.assertIn("bit for bit", drift["message"])

    def test_checkpoints_are_in_the_model_dtype_and_every_sqrt_expected_steps(self):
        run = self.path("f32")
        record(run, "adam", torch.float32, steps=23, expected_steps=25)
        m = manifest(run)
        self.assertEqual([c["step"] for c in m["checkpoints"]], [0, 5, 10, 15, 20, 23])
        self.assertEqual(m["training"]["checkpoint_every"], 5)
        for c in m["checkpoints"]:
            files = [c["file"]] + [b["file"] for b in c["optimizer_state"]["buffers"].values()]
            for f in files:
                self.assertEqual(np.load(os.path.join(run, f)).dtype, np.float32, f)
        self.assertLessEqual(self.verify(run)["max_rel_error"], MAX_REL_ERROR)
        rc, out, err = cli(["--quiet", "check-path", run], cwd=self.tmp)
        self.assertEqual(rc, 0, out + err)

    def test_every_step_keeps_the_float64_format(self):
        run = self.path("every")
        record(run, "momentum", torch.float32, steps=6, every_step=True)
        m = manifest(run)
        self.assertEqual([c["step"] for c in m["checkpoints"]], list(range(7)))
        self.assertEqual(m["training"]["checkpoint_every"], 1)
        self.assertEqual(np.load(os.path.join(run, m["checkpoints"][3]["file"])).dtype, np.float64)
        j = self.verify(run)
        self.assertLessEqual(j["max_rel_error"], MAX_REL_ERROR)
        self.assertNotIn("replay_drift", j)

    def test_a_loop_whose_openblas_ran_on_more_threads_than_torch_replays_bit_for_bit(self):
        """torch.set_num_threads leaves OpenBLAS's own thread count alone, and
        a float32 product split over two threads may add in another order
        than on one: the recorder records OpenBLAS's count, and the replay
        runs OpenBLAS at it (at torch's count, none of this run's replayed
        checkpoints was reproduced on an AMD EPYC), in turn with the walk;
        a loop after set_threads(1), one thread of each, replays ahead, and
        so does the other where one thread reproduces its shortest replayed
        segment (machine-dependent: tests/path/replay_ahead_test.cpp forces
        both outcomes)."""
        from pathkernel.record import set_threads
        lib = _openblas_library()
        if lib is None:
            self.skipTest("torch does not run on OpenBLAS here")
        x, y = blobs(256, d=100, k=10, dtype=torch.float32)
        xt, yt = blobs(12, d=100, k=10, seed=5, dtype=torch.float32)

        def loop(run, blas):
            with thread_counts_kept():
                set_threads(1)
                lib.openblas_set_num_threads(blas)
                torch.manual_seed(0)
                model = MLP(d=100, h=100, k=10).float()
                opt = torch.optim.Adam(model.parameters(), lr=1e-3)
                with Recorder(run, model, opt, x, y, test_x=xt, test_y=yt, expected_steps=16) as rec:
                    for idx in batches(256, 64, 16):
                        opt.zero_grad()
                        F.cross_entropy(model(x[idx]), y[idx]).backward()
                        opt.step()
                        rec.step(idx)
            environment = manifest(run)["environment"]
            self.assertEqual((environment["threads"], environment["blas_threads"]), (1, blas), environment)
            rc, out, err = cli(["--quiet", "--json", "--threads", "2", "verify", run, "--test", "3"], cwd=self.tmp)
            self.assertEqual(rc, 0, "verify failed:\n%s\n%s" % (out, err[-3000:]))
            j = json.loads(out[out.find("{"):])
            drift = j["replay_drift"]
            self.assertEqual(drift["bit_for_bit"], drift["checkpoints"], drift)
            self.assertLessEqual(j["max_rel_error"], MAX_REL_ERROR, j)
            return j

        two = loop(self.path("blas-threads-2"), 2)
        if "replay_in_turn_reason" in two:
            self.assertIn("the loop ran on 1 torch thread(s) and 2 OpenBLAS thread(s), and one thread does not "
                          "reproduce its shortest replayed segment", two["replay_in_turn_reason"])
            self.assertEqual(two["seconds_by_part"]["replay_ahead"], 0)
        else:
            self.assertGreater(two["seconds_by_part"]["replay_ahead"], 0)
        ahead = loop(self.path("blas-threads-1"), 1)
        self.assertNotIn("replay_in_turn_reason", ahead)
        self.assertGreater(ahead["seconds_by_part"]["replay_ahead"], 0)

    def test_a_loop_on_several_torch_threads_replays_beside_the_walk_bit_for_bit(self):
        """LibTorch splits an operation by the calling thread's OpenMP team
        (a convolution's gradient over the batch among them), so a loop on two
        torch threads is not reproduced on one. The replay's own thread then
        runs a team of the loop's size, the walk's threads keeping theirs: it
        still runs beside the walk, every checkpoint bit for bit. Where one
        thread reproduces the loop (machine-dependent) it runs on one."""
        from pathkernel.record import set_threads
        g = torch.Generator().manual_seed(0)
        x = torch.randn(256, 1, 12, 12, generator=g)
        y = torch.arange(256) % 4
        xt = torch.randn(8, 1, 12, 12, generator=g)
        run = self.path("torch-threads-2")
        with thread_counts_kept():
            set_threads(2)
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                        torch.nn.Flatten(), torch.nn.Linear(8 * 5 * 5, 4))
            opt = torch.optim.Adam(model.parameters(), lr=1e-2)
            with Recorder(run, model, opt, x, y, test_x=xt, test_y=y[:8], expected_steps=16) as rec:
                for idx in batches(256, 64, 16):
                    opt.zero_grad()
                    F.cross_entropy(model(x[idx]), y[idx]).backward()
                    opt.step()
                    rec.step(idx)
        self.assertEqual(manifest(run)["environment"]["threads"], 2)
        rc, out, err = cli(["--quiet", "--json", "--threads", "2", "verify", run, "--test", "2"], cwd=self.tmp)
        self.assertEqual(rc, 0, "verify failed:\n%s\n%s" % (out, err[-3000:]))
        j = json.loads(out[out.find("{"):])
        self.assertNotIn("replay_in_turn_reason", j)
        self.assertIn(j.get("replay_openmp_threads", 1), (1, 2))
        drift = j["replay_drift"]
        self.assertEqual(drift["bit_for_bit"], drift["checkpoints"], drift)
        self.assertGreater(j["seconds_by_part"]["replay_ahead"], 0)
        self.assertLessEqual(j["max_rel_error"], MAX_REL_ERROR, j)

    def test_drift_is_reported_at_its_checkpoint(self):
        """A checkpoint the replay does not reproduce (here: changed after
        the loop) is drift at that checkpoint; the decomposition rejoins it
        and still closes against the recorded final weights."""
        run = self.path("drift")
        record(run, "momentum", steps=12, expected_steps=16)  # checkpoints 0, 4, 8, 12
        m = manifest(run)
        c = m["checkpoints"][2]
        self.assertEqual(c["step"], 8)
        path = os.path.join(run, c["file"])
        w = np.load(path)
        w[3] += 1e-4
        np.save(path, w)
        with open(path, "rb") as f:
            data = f.read()
        c["bytes"], c["crc32"] = len(data), zlib.crc32(data)
        with open(os.path.join(run, "manifest.json"), "w") as f:
            json.dump(m, f, indent=2)
        j = self.verify(run)
        drift = j["replay_drift"]
        per = {p["step"]: p["max_abs_diff"] for p in drift["per_checkpoint"]}
        # Replay reaches w_4 bit for bit, and w_8 off by the change exactly;
        # w_12 is replayed from the changed w_8, so it drifts by about as much.
        self.assertEqual(per[4], 0, drift)
        self.assertAlmostEqual(per[8], 1e-4, delta=1e-12)
        self.assertGreater(per[12], 0, drift)
        worst = max(per, key=lambda k: per[k])
        self.assertEqual((drift["at_checkpoint_step"], drift["max_abs_diff"]), (worst, per[worst]), drift)
        self.assertEqual(drift["bit_for_bit"], 1, drift)
        self.assertIn("checkpoint of step %d" % worst, drift["message"])
        self.assertLessEqual(j["max_rel_error"], MAX_REL_ERROR, j)
        rc, out, err = cli(["--quiet", "check-path", run], cwd=self.tmp)
        self.assertEqual(rc, 0, out + err)
        self.assertIn("first differing at step 8", out + err)

    def test_an_interrupted_loop_reads_up_to_its_last_checkpoint(self):
        run = self.path("interrupted")
        x, y = blobs(40)
        model = mlp()
        opt = torch.optim.Adam(model.parameters(), lr=0.02)
        with self.assertRaises(KeyboardInterrupt):
            with Recorder(run, model, opt, x, y, test_x=x[:4], test_y=y[:4]) as rec:
                for s, idx in enumerate(batches(40, 8, 11)):
                    if s == 11 - 1:
                        raise KeyboardInterrupt
                    opt.zero_grad()
                    F.cross_entropy(model(x[idx]), y[idx]).backward()
                    opt.step()
                    rec.step(idx)
        m = manifest(run)
        self.assertEqual((m["status"], m["steps"]), ("running", 9))  # checkpoints 0, 1, 2, 4, 6, 9
        self.assertEqual(m["checkpoints"][-1]["step"], 9)
        self.assertLessEqual(self.verify(run)["max_rel_error"], MAX_REL_ERROR)

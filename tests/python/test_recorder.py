"""The recorder's run directory: what it stores, that the CLI reads it, and
what it refuses (each refusal with its message)."""
import glob
import json
import os
import zlib

from _helpers import (F, MLP, Recorder, TempDirTest, batches, blobs, cli, cli_json, clip_grad_norm_, mlp, need_binary,
                      nn, np, project_version, thread_counts_kept, torch)

import pathkernel
from pathkernel.record import RecorderError
from pathkernel._environment import _openblas_library


def record_loop(directory, model, opt, x, y, steps=12, b=10, sched=None, clip=None, loss="cross_entropy",
                explicit_clip=False, **kw):
    """A user's loop with the three recorder lines; returns what the loop saw:
    the weights after every step, the batches, the lrs used, the clip factors
    and the Adam/SGD state after every step. The run stores every step
    (every_step=True, the uncompressed format) unless told otherwise;
    test_compact_recorded.py tests the compact default."""
    kw.setdefault("every_step", True)
    fn = {"cross_entropy": F.cross_entropy, "nll": F.nll_loss, "mse": F.mse_loss}[loss]
    rec = Recorder(directory, model, opt, x, y, loss=loss, **kw)
    seen = {"w": [torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()], "idx": [], "lr": [],
            "clip": [], "loss": [], "state": []}
    for idx in batches(x.shape[0], b, steps):
        opt.zero_grad()
        value = fn(model(x[idx]), y[idx])
        value.backward()
        factor = None
        if clip is not None:
            if explicit_clip:
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
                factor = float(torch.clamp(clip / (norm + 1e-6), max=1.0))
            else:
                norm = clip_grad_norm_(model.parameters(), clip)
                factor = float(torch.clamp(clip / (norm + 1e-6), max=1.0))
        seen["lr"].append(opt.param_groups[0]["lr"])
        opt.step()
        rec.step(idx, clip_factor=factor if explicit_clip else None)
        if sched is not None:
            sched.step()
        seen["w"].append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone())
        seen["idx"].append(idx.clone())
        seen["clip"].append(1.0 if factor is None else factor)
        seen["loss"].append(float(value))
        seen["state"].append({k: torch.cat([opt.state[p][k].reshape(-1) for p in model.parameters()]).clone()
                              for k in ("momentum_buffer", "exp_avg", "exp_avg_sq")
                              if opt.state[model.fc1.weight].get(k) is not None})
    rec.close()
    return rec, seen


class RecordedRunFormat(TempDirTest):
    def setUp(self):
        super().setUp()
        self.x, self.y = blobs(40)
        self.xt, self.yt = blobs(12, seed=5)

    def test_adam_run_holds_every_step_as_the_loop_saw_it(self):
        model = mlp()
        opt = torch.optim.Adam(model.parameters(), lr=0.02, weight_decay=1e-3)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=12)
        d = self.path("run")
        rec, seen = record_loop(d, model, opt, self.x, self.y, sched=sched, clip=0.3, test_x=self.xt,
                                test_y=self.yt)
        run = pathkernel.read_run(d)
        self.assertEqual(run.status, "complete")
        self.assertEqual(run.steps, 12)
        self.assertEqual(run.checkpoint_steps, list(range(13)))
        for s in range(13):
            self.assertTrue(np.array_equal(run.weights(s), seen["w"][s].numpy()), "weights of step %d" % s)
        for s in range(12):
            st = run.optimizer_state(s + 1)
            self.assertEqual(st["step"], s + 1)
            for k in ("exp_avg", "exp_avg_sq"):
                self.assertTrue(np.array_equal(st["buffers"][k], seen["state"][s][k].numpy()), "%s %d" % (k, s))
        self.assertEqual(run.optimizer_state(0), {"step": 0, "buffers": {}})
        self.assertEqual(run.learning_rates.tolist(), seen["lr"])
        self.assertNotEqual(seen["lr"][0], seen["lr"][5])  # the scheduler moved it
        for s in range(12):
            self.assertEqual(run.batches[s].tolist(), seen["idx"][s].tolist())
        self.assertEqual(run.clip_factors.tolist(), seen["clip"])
        self.assertTrue(any(c < 1.0 for c in seen["clip"]))
        m = run.metrics
        self.assertEqual(m["step"].tolist(), list(range(12)))
        self.assertEqual(m["lr"].tolist(), seen["lr"])
        np.testing.assert_allclose(m["loss"], seen["loss"], rtol=1e-12)
        by_name = run.weights(12, by_name=True)
        self.assertEqual(list(by_name), ["fc1.weight", "fc1.bias", "out.weight", "out.bias"])
        self.assertTrue(np.array_equal(by_name["fc1.weight"], model.fc1.weight.detach().numpy()))
        self.assertGreater(rec.bytes_per_step, 3 * 8 * run.parameter_count)

    def test_manifest_fields(self):
        model = mlp()
        opt = torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.8, 0.99), eps=1e-7, weight_decay=0.05)
        d = self.path("run")
        record_loop(d, model, opt, self.x, self.y, steps=5)
        with open(os.path.join(d, "manifest.json")) as f:
            m = json.load(f)
        self.assertEqual(m["format"], "pathkernel-run")
        self.assertEqual(m["format_version"], 1)
        self.assertEqual(m["pathkernel_version"], project_version())
        self.assertEqual(pathkernel.__version__, project_version())
        self.assertRegex(m["libtorch_version"], r"^\d+\.\d+\.\d+$")
        self.assertEqual(m["optimizer"], {"name": "adamw", "lr": 0.01, "beta1": 0.8, "beta2": 0.99, "eps": 1e-7,
                                          "weight_decay": 0.05})
        self.assertEqual(m["model"]["spec"], "torchscript:model.pt")
        self.assertEqual(m["model"]["output"], "logsoftmax")
        self.assertEqual(m["dtype"], "float64")
        t = m["training"]
        self.assertEqual((t["schedule"], t["checkpoint_every"], t["recorded"], t["loss"], t["batch_size"]),
                         ("recorded", 1, True, "cross_entropy", 10))
        self.assertNotIn("clip_factors", t)
        data = m["data"]
        self.assertEqual(data["spec"], "npy:data")
        self.assertEqual(data["source"]["directory"], "data")
        self.assertTrue(data["source"]["in_run"])
        self.assertEqual((data["num_train"], data["num_test"], data["input_shape"], data["num_classes"]),
                         (40, 0, [4], 3))
        x = np.load(os.path.join(d, "data", "train_x.npy"))
        y = np.load(os.path.join(d, "data", "train_y.npy"))
        self.assertEqual((x.dtype, y.dtype), (np.float64, np.int64))
        self.assertEqual(np.load(os.path.join(d, "data", "test_x.npy")).shape, (0, 4))
        self.assertEqual(data["train_crc32"], zlib.crc32(y.tobytes(), zlib.crc32(x.tobytes())))
        for key in ("cpu", "cpu_capability", "blas", "blas_kernels", "libtorch", "threads"):
            self.assertIn(key, m["environment"])
        lib = _openblas_library()
        if lib is not None:  # OpenBLAS's own count, which torch's does not set
            self.assertEqual(m["environment"]["blas_threads"], lib.openblas_get_num_threads())
        self.assertEqual(m["summary"]["test_accuracy"], None)
        # The module's initial weights are w_0.
        module = torch.jit.load(os.path.join(d, "model.pt"))
        w0 = torch.cat([p.detach().reshape(-1) for p in module.parameters()]).numpy()
        self.assertTrue(np.array_equal(w0, pathkernel.read_run(d).weights(0)))

    def test_set_threads_sets_torch_and_openblas(self):
        from pathkernel.record import set_threads
        lib = _openblas_library()
        with thread_counts_kept():
            for n in (1, 2):
                set_threads(n)
                self.assertEqual(torch.get_num_threads(), n)
                if lib is not None:
                    self.assertEqual(lib.openblas_get_num_threads(), n)
            for bad in (0, -1, 1.5, "2", True):
                with self.assertRaisesRegex(ValueError, "set_threads: n is .*, expected a whole number >= 1"):
                    set_threads(bad)

    def test_a_compact_loop_on_several_threads_is_warned_of_its_replay(self):
        # A compact run replays at the loop's counts. The engine follows
        # Debian's OpenBLAS 0.3.21 on several threads on one thread, and
        # torch's own threads with a team on the replay's thread: those loops
        # are not warned of, nor one that stores every step. A loop on
        # several OpenBLAS threads of another OpenBLAS may replay in turn
        # (ThreadsWarning, naming both counts and set_threads).
        import warnings
        import pathkernel.record as record
        from pathkernel.record import ThreadsWarning, set_threads
        lib = _openblas_library()

        def warned(n, every_step=False):
            set_threads(n)
            model = mlp()
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                Recorder(self.path(f"run{n}{every_step}"), model, torch.optim.SGD(model.parameters(), lr=0.1),
                         self.x, self.y, every_step=every_step, overwrite=True).close()
            return [w for w in seen if issubclass(w.category, ThreadsWarning)]

        with thread_counts_kept():
            self.assertEqual(warned(1), [])
            followed = lib is not None and record._threads_followed(lib.openblas_get_config().decode().strip())
            self.assertEqual(len(warned(2)), 0 if followed or lib is None else 1)
            saved = record._threads_followed
            record._threads_followed = lambda blas: False  # as another OpenBLAS
            try:
                several = warned(2)
                self.assertEqual(warned(2, every_step=True), [])
            finally:
                record._threads_followed = saved
            if lib is not None:
                self.assertEqual(len(several), 1)
                self.assertEqual(several[0].filename, __file__)  # the user's line, not the recorder's
                self.assertIn("2 torch thread(s) and 2 OpenBLAS thread(s)", str(several[0].message))
                self.assertIn("set_threads(1)", str(several[0].message))
            debian = "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH NO_AFFINITY Cooperlake MAX_THREADS=64"
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                record._warn_threads(1, 2, debian, "Cooperlake")
                record._warn_threads(1, 2, debian.replace("Cooperlake", "Haswell"), "Haswell", "float64")
                record._warn_threads(2, 2, debian, "Cooperlake")  # torch's threads: a team on the replay's thread
                record._warn_threads(4, 1, "", "")  # no OpenBLAS threads at all
                self.assertEqual(seen, [])
                record._warn_threads(1, 2, "OpenBLAS 0.3.26 DYNAMIC_ARCH NO_AFFINITY Haswell MAX_THREADS=64",
                                     "Haswell", "float64")  # another OpenBLAS's driver is not followed
                record._warn_threads(1, 2, "OpenBLAS 0.3.21 NO_LAPACKE Haswell MAX_THREADS=64", "Haswell")  # nor one kernel set's
                self.assertEqual([w.category for w in seen], [ThreadsWarning] * 2)
                self.assertIn("float64 loop", str(seen[0].message))

    def test_manifest_round_trips_through_the_schema(self):
        # manifest.json -> pathkernel._manifest.Manifest -> the same bytes.
        from pathkernel._files import json_text
        from pathkernel._manifest import Manifest
        model = mlp()
        opt = torch.optim.Adam(model.parameters(), lr=0.02)
        d = self.path("run")
        record_loop(d, model, opt, self.x, self.y, steps=7, clip=0.3, test_x=self.xt, test_y=self.yt)
        with open(os.path.join(d, "manifest.json"), "rb") as f:
            text = f.read()
        m = Manifest.from_json(json.loads(text))
        self.assertEqual((m.steps, len(m.checkpoints), m.training.clip_factors.file), (7, 8, "clip_factors.npy"))
        self.assertEqual(sorted(m.checkpoints[7].optimizer_buffers), ["exp_avg", "exp_avg_sq"])
        self.assertEqual(json_text(m.to_json()).encode(), text)

    def test_sgd_kinds(self):
        cases = [(dict(lr=0.1), {"name": "sgd", "lr": 0.1, "weight_decay": 0.0}, []),
                 (dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=1e-3),
                  {"name": "momentum", "lr": 0.1, "momentum": 0.9, "dampening": 0.1, "weight_decay": 1e-3},
                  ["momentum_buffer"]),
                 (dict(lr=0.1, momentum=0.8, nesterov=True),
                  {"name": "nesterov", "lr": 0.1, "momentum": 0.8, "dampening": 0.0, "weight_decay": 0.0},
                  ["momentum_buffer"])]
        for i, (kw, decl, buffers) in enumerate(cases):
            with self.subTest(decl["name"]):
                model = mlp()
                opt = torch.optim.SGD(model.parameters(), **kw)
                d = self.path("run%d" % i)
                _, seen = record_loop(d, model, opt, self.x, self.y, steps=4)
                run = pathkernel.read_run(d)
                self.assertEqual(run.optimizer, decl)
                for s in range(1, 5):
                    st = run.optimizer_state(s)
                    self.assertEqual(st["step"], 0)
                    self.assertEqual(sorted(st["buffers"]), buffers)
                    for k in buffers:
                        self.assertTrue(np.array_equal(st["buffers"][k], seen["state"][s - 1][k].numpy()))

    def test_cli_info_reads_the_run(self):
        need_binary(self)
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        d = self.path("run")
        rec, _ = record_loop(d, model, opt, self.x, self.y, steps=6, test_x=self.xt, test_y=self.yt)
        info = cli_json(self, ["info", d], cwd=self.tmp)
        self.assertEqual(info["path_bytes"], round(rec.bytes_per_step * 6))
        self.assertEqual((info["status"], info["steps"], info["checkpoints"]), ("complete", 6, 7))
        self.assertEqual(info["optimizer"]["name"], "momentum")
        self.assertEqual((info["num_train"], info["num_test"]), (40, 12))

    def test_files_are_atomic_and_listed_with_their_crc(self):
        model = mlp()
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        d = self.path("run")
        rec = Recorder(d, model, opt, self.x, self.y, every_step=True)
        for s, idx in enumerate(batches(40, 8, 60)):
            opt.zero_grad()
            F.cross_entropy(model(self.x[idx]), self.y[idx]).backward()
            opt.step()
            rec.step(idx, clip_factor=0.5 if s == 3 else None)
        # Mid-run: the manifest of the last flush (step 50) lists complete files only.
        with open(os.path.join(d, "manifest.json")) as f:
            m = json.load(f)
        self.assertEqual((m["status"], m["steps"]), ("running", 50))
        self.assertEqual(len(m["checkpoints"]), 51)
        self.assertEqual(sum(b["steps"] for b in m["batches"]), 50)
        self.assertEqual(m["training"]["clip_factors"]["file"], "clip_factors_00000050.npy")
        run = pathkernel.read_run(d)
        self.assertEqual(run.clip_factors[3], 0.5)
        self.assertTrue(np.array_equal(run.weights(50), run.weights(50)))
        if need_binary_quiet():
            cli_json(self, ["info", d], cwd=self.tmp)
        rec.close()
        self.assertEqual(glob.glob(os.path.join(d, "**", "*.tmp.*"), recursive=True), [])
        self.assertFalse(os.path.exists(os.path.join(d, "clip_factors_00000050.npy")))
        run = pathkernel.read_run(d)
        self.assertEqual((run.status, run.steps), ("complete", 60))
        self.assertEqual(run.training["clip_factors"]["file"], "clip_factors.npy")
        listed = {c["file"] for c in run.manifest["checkpoints"]}
        listed |= {f["file"] for c in run.manifest["checkpoints"] for f in c["optimizer_state"]["buffers"].values()}
        listed |= {b["file"] for b in run.manifest["batches"]}
        for f in listed:
            self.assertTrue(os.path.isfile(os.path.join(d, f)), f)
        for s in range(61):
            run.weights(s)
            run.optimizer_state(s)
        self.assertEqual(len(run.batches), 60)
        # A corrupted checkpoint is caught on read, naming the file.
        path = os.path.join(d, "checkpoints", "w_00000007.npy")
        with open(path, "rb") as f:
            data = bytearray(f.read())
        data[-1] ^= 1
        with open(path, "wb") as f:
            f.write(bytes(data))
        with self.assertRaisesRegex(pathkernel.RunFormatError, r"w_00000007\.npy' has CRC-32 .* corrupt"):
            pathkernel.read_run(d).weights(7)

    def test_context_manager_and_loop_error(self):
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        d = self.path("run")
        with self.assertRaises(ZeroDivisionError):
            with Recorder(d, model, opt, self.x, self.y, every_step=True) as rec:
                for s, idx in enumerate(batches(40, 10, 3)):
                    opt.zero_grad()
                    F.cross_entropy(model(self.x[idx]), self.y[idx]).backward()
                    opt.step()
                    rec.step(idx)
                1 / 0
        run = pathkernel.read_run(d)
        self.assertEqual((run.status, run.steps), ("running", 3))
        self.assertIn("ZeroDivisionError", run.manifest["message"])
        d2 = self.path("run2")
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with Recorder(d2, model, opt, self.x, self.y) as rec:
            opt.zero_grad()
            F.cross_entropy(model(self.x[:5]), self.y[:5]).backward()
            opt.step()
            rec.step([0, 1, 2, 3, 4])
        self.assertEqual(pathkernel.read_run(d2).status, "complete")

    def test_float32_model_and_integer_inputs(self):
        class Tokens(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(10, 4)
                self.out = nn.Linear(8, 3)

            def forward(self, t):
                return self.out(self.embed(t).flatten(1))

        torch.manual_seed(0)
        model = Tokens().float()
        tokens = torch.randint(0, 10, (30, 2), dtype=torch.int32)
        labels = (tokens[:, 0] % 3).long()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        d = self.path("run")
        rec = Recorder(d, model, opt, tokens, labels)
        ws = []
        for idx in batches(30, 6, 5):
            opt.zero_grad()
            F.cross_entropy(model(tokens[idx]), labels[idx]).backward()
            opt.step()
            rec.step(idx)
            ws.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double().numpy())
        rec.close()
        run = pathkernel.read_run(d)
        self.assertEqual(run.dtype, "float32")
        self.assertTrue(np.array_equal(run.weights(5), ws[-1]))
        self.assertTrue(run.manifest["data"]["integer_inputs"])
        self.assertEqual(run.manifest["data"]["source"]["inputs"], "integer")
        arrays = run.data()
        self.assertEqual(arrays["train_x"].dtype, np.int64)
        self.assertTrue(np.array_equal(arrays["train_x"], tokens.numpy()))
        # The CRC-32 is of the data as pathkernel loads it: inputs in the run's dtype.
        self.assertEqual(run.manifest["data"]["train_crc32"],
                         zlib.crc32(arrays["train_y"].tobytes(), zlib.crc32(arrays["train_x"].astype(np.float32).tobytes())))

    def test_mse_targets_and_nll(self):
        model = mlp(log_softmax=True)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        d = self.path("nll")
        record_loop(d, model, opt, self.x, self.y, steps=3, loss="nll")
        m = pathkernel.read_run(d).manifest
        self.assertEqual((m["model"]["output"], m["training"]["loss"]), ("logits", "nll"))
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        targets = F.one_hot(self.y, 3).double()
        d = self.path("mse")
        record_loop(d, model, opt, self.x, targets, steps=3, loss="mse", summary_accuracy=True)
        run = pathkernel.read_run(d)
        self.assertEqual((run.manifest["model"]["output"], run.training["loss"]), ("logits", "mse"))
        arrays = run.data()
        self.assertEqual((arrays["train_y"].dtype, arrays["train_y"].shape), (np.float64, (40, 3)))
        self.assertEqual(arrays["test_y"].shape, (0, 3))
        # Regression targets have no classes: accuracy 0, as pathkernel's training writes it.
        self.assertEqual(run.metrics["batch_accuracy"].tolist(), [0.0] * 3)
        self.assertEqual(run.summary["train_accuracy"], 0.0)
        x, y = arrays["train_x"], arrays["train_y"]
        self.assertEqual(run.manifest["data"]["train_crc32"], zlib.crc32(y.tobytes(), zlib.crc32(x.tobytes())))

    def test_numpy_data_and_list_batches(self):
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        xn, yn = self.x.numpy(), self.y.numpy().astype(np.int32)
        d = self.path("run")
        with Recorder(d, model, opt, xn, yn, test_x=xn[:5], test_y=yn[:5]) as rec:
            for idx in ([0, 1, 2], np.array([3, 4]), range(5, 12)):
                opt.zero_grad()
                i = torch.as_tensor(np.asarray(idx), dtype=torch.long)
                F.cross_entropy(model(self.x[i]), self.y[i]).backward()
                opt.step()
                rec.step(idx)
        run = pathkernel.read_run(d)
        self.assertTrue(run.recorded)
        self.assertEqual([b.tolist() for b in run.batches], [[0, 1, 2], [3, 4], list(range(5, 12))])
        self.assertEqual(run.training["batch_size"], 7)
        self.assertEqual(run.data()["train_y"].dtype, np.int64)

    def test_scalar_regression(self):
        model = mlp(k=1)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        targets = self.x[:, :1] * 2 - 1
        d = self.path("run")
        _, seen = record_loop(d, model, opt, self.x, targets, steps=3, loss="mse")
        run = pathkernel.read_run(d)
        self.assertEqual(run.manifest["data"]["num_classes"], 1)
        np.testing.assert_allclose(run.metrics["loss"], seen["loss"], rtol=1e-12)

    def test_clip_factor_given_explicitly(self):
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        d = self.path("run")
        _, seen = record_loop(d, model, opt, self.x, self.y, steps=4, clip=0.2, explicit_clip=True)
        self.assertEqual(pathkernel.read_run(d).clip_factors.tolist(), seen["clip"])
        self.assertTrue(all(c < 1 for c in seen["clip"]))

    def test_scheduler_created_after_the_recorder(self):
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        d = self.path("run")
        rec = Recorder(d, model, opt, self.x, self.y)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        used = []
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for idx in batches(40, 10, 6):
                opt.zero_grad()
                F.cross_entropy(model(self.x[idx]), self.y[idx]).backward()
                used.append(opt.param_groups[0]["lr"])
                opt.step()
                rec.step(idx)
                sched.step()
        rec.close()
        self.assertEqual(pathkernel.read_run(d).learning_rates.tolist(), used)
        self.assertEqual(used, [0.1, 0.1, 0.05, 0.05, 0.025, 0.025])


    def test_scheduler_stepped_before_rec_step(self):
        # The lr is the one optimizer.step() ran with, read when it ran, so a
        # loop that steps its scheduler before rec.step is still right.
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
        sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5)
        rec = Recorder(self.path("run"), model, opt, self.x, self.y)
        used = []
        for idx in batches(40, 10, 4):
            opt.zero_grad()
            F.cross_entropy(model(self.x[idx]), self.y[idx]).backward()
            used.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
            rec.step(idx)
        rec.close()
        self.assertEqual(pathkernel.read_run(self.path("run")).learning_rates.tolist(), used)
        self.assertEqual(used, [0.1, 0.05, 0.025, 0.0125])

    def test_training_a_scripted_module_and_given_losses(self):
        scripted = torch.jit.script(mlp())
        opt = torch.optim.Adam(scripted.parameters(), lr=0.01)
        rec = Recorder(self.path("run"), scripted, opt, self.x, self.y)
        losses = []
        for idx in batches(40, 10, 3):
            opt.zero_grad()
            value = F.cross_entropy(scripted(self.x[idx]), self.y[idx])
            value.backward()
            opt.step()
            rec.step(idx, loss=value, accuracy=0.25)
            losses.append(float(value))
        rec.close()
        run = pathkernel.read_run(self.path("run"))
        self.assertEqual(run.metrics["loss"].tolist(), losses)
        self.assertEqual(run.metrics["batch_accuracy"].tolist(), [0.25] * 3)
        self.assertEqual([t["name"] for t in run.parameters], ["fc1.weight", "fc1.bias", "out.weight", "out.bias"])

    def test_diverged_loop(self):
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        d = self.path("run")
        rec = Recorder(d, model, opt, self.x, self.y)
        for s, idx in enumerate(batches(40, 10, 3)):
            opt.zero_grad()
            F.cross_entropy(model(self.x[idx]), self.y[idx]).backward()
            if s == 2:
                model.fc1.weight.grad[0, 0] = float("inf")
            opt.step()
            if s < 2:
                rec.step(idx)
        with self.assertRaisesRegex(RecorderError, r"step 2: the weights are not finite after the step; the run ends "
                                                   r"at step 2 \(status diverged\)"):
            rec.step(idx)
        run = pathkernel.read_run(d)
        self.assertEqual((run.status, run.steps, len(run.batches)), ("diverged", 2, 2))
        self.assertIn("not finite", run.manifest["message"])
        if need_binary_quiet():
            cli_json(self, ["info", d], cwd=self.tmp)


def need_binary_quiet():
    from _helpers import binary
    return binary() is not None


class Refusals(TempDirTest):
    """Each refusal says what is wrong and what to do."""

    def setUp(self):
        super().setUp()
        self.x, self.y = blobs(20)

    def refuse(self, pattern, *args, **kw):
        with self.assertRaisesRegex(RecorderError, pattern):
            Recorder(self.path("run"), *args, **kw)
        self.assertFalse(os.path.exists(self.path("run", "manifest.json")))

    def test_inputs_that_are_not_finite(self):
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for bad in (float("nan"), float("inf"), -float("inf")):
            for name in ("train_x", "test_x"):
                with self.subTest(value=bad, array=name):
                    x = self.x.clone()
                    x[7, 2] = bad
                    data = {"train_x": x, "test_x": self.x} if name == "train_x" else \
                        {"train_x": self.x, "test_x": x}
                    self.refuse(name + r" holds a value that is not finite \(NaN or infinite\)", model, opt,
                                data["train_x"], self.y, test_x=data["test_x"], test_y=self.y)

    def test_unsupported_optimizers(self):
        model = mlp()
        self.refuse(r"optimizer torch\.optim\.adadelta\.Adadelta is not supported; supported: torch\.optim\.SGD.*"
                    r"Adam.*AdamW.*RMSprop.*Adagrad",
                    model, torch.optim.Adadelta(model.parameters(), lr=0.1), self.x, self.y)
        self.refuse(r"RMSprop momentum must be in \[0, 1\) \(got 1\.5\)",
                    model, torch.optim.RMSprop(model.parameters(), lr=0.1, momentum=1.5), self.x, self.y)
        self.refuse(r"Adagrad with foreach=True is not supported: its multi-tensor step takes the rate in float32",
                    model, torch.optim.Adagrad(model.parameters(), lr=0.1, foreach=True), self.x, self.y)
        self.refuse(r"Adam with amsgrad=True is not supported",
                    model, torch.optim.Adam(model.parameters(), amsgrad=True), self.x, self.y)
        self.refuse(r"SGD with maximize=True is not supported",
                    model, torch.optim.SGD(model.parameters(), lr=0.1, maximize=True), self.x, self.y)
        groups = [{"params": [model.fc1.weight, model.fc1.bias]}, {"params": [model.out.weight, model.out.bias],
                                                                    "lr": 0.01}]
        self.refuse(r"parameter group 1 has hyper-parameters \(lr\) that differ",
                    model, torch.optim.SGD(groups, lr=0.1), self.x, self.y)
        self.refuse(r"does not train parameter\(s\) 'out.weight', 'out.bias'",
                    model, torch.optim.SGD([model.fc1.weight, model.fc1.bias], lr=0.1), self.x, self.y)
        other = nn.Linear(2, 2).double()
        self.refuse(r"trains 2 tensor\(s\) that are not parameters of the model",
                    model, torch.optim.SGD(list(model.parameters()) + list(other.parameters()), lr=0.1),
                    self.x, self.y)

    def test_optimizer_that_already_stepped(self):
        model = mlp()
        opt = torch.optim.Adam(model.parameters())
        F.cross_entropy(model(self.x), self.y).backward()
        opt.step()
        self.refuse(r"already taken steps", model, opt, self.x, self.y)
        # Adagrad makes its state when it is made: that state is fresh, a stepped one is not.
        for init in (0.0, 0.1):
            with self.subTest(initial_accumulator_value=init):
                model = mlp()
                opt = torch.optim.Adagrad(model.parameters(), lr=0.1, initial_accumulator_value=init)
                with Recorder(self.path("adagrad-fresh-%g" % init), model, opt, self.x, self.y):
                    pass
                F.cross_entropy(model(self.x), self.y).backward()
                opt.step()
                self.refuse(r"already taken steps", model, opt, self.x, self.y)

    def test_unscriptable_model(self):
        class Unscriptable(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 3)

            def forward(self, x):
                return self.fc(x) * float(np.sqrt(2.0))

        model = Unscriptable().double()
        self.refuse(r"cannot be scripted with torch\.jit\.script \(.*\).*script=torch\.jit\.trace",
                    model, torch.optim.SGD(model.parameters(), lr=0.1), self.x, self.y)
        other = Unscriptable().double()
        self.refuse(r"parameter 'fc.weight' holds other values than the model's", model,
                    torch.optim.SGD(model.parameters(), lr=0.1), self.x, self.y,
                    script=torch.jit.trace(other, self.x[:2]))
        # Traced, it is accepted.
        traced = torch.jit.trace(model, self.x[:2])
        Recorder(self.path("traced"), model, torch.optim.SGD(model.parameters(), lr=0.1), self.x, self.y,
                 script=traced).close()

    def test_mismatched_data(self):
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        self.refuse(r"train_y has 19 rows but train_x has 20", model, opt, self.x, self.y[:19])
        self.refuse(r"labels in \[3, 5\], but the model has 3 outputs", model, opt, self.x, self.y + 3)
        self.refuse(r"the model fails on train_x\[:8\]", model, opt, self.x[:, :3], self.y)
        self.refuse(r"test_x has examples of shape \[5\], train_x \[4\]", model, opt, self.x, self.y,
                    test_x=torch.zeros(3, 5), test_y=torch.zeros(3, dtype=torch.long))
        self.refuse(r"give both test_x and test_y", model, opt, self.x, self.y, test_x=self.x)
        self.refuse(r"loss 'mse' takes float targets of shape \[n, K\] = \[20, 3\] .*F\.one_hot", model, opt, self.x,
                    torch.zeros(20, 2), loss="mse")
        self.refuse(r"expected integer class labels", model, opt, self.x, self.y.double())
        self.refuse(r"loss 'nll' takes log-probabilities.*log_softmax", model, opt, self.x, self.y, loss="nll")
        self.refuse(r"loss 'hinge' is not supported", model, opt, self.x, self.y, loss="hinge")

        class Flat(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 1)

            def forward(self, x):
                return self.fc(x).flatten()

        flat = Flat().double()
        self.refuse(r"maps train_x\[:8\] to \[8\]; expected outputs of shape \[8, K\]",
                    flat, torch.optim.SGD(flat.parameters(), lr=0.1), self.x, self.y)

    def test_batchnorm_and_dropout(self):
        class WithNorm(nn.Module):
            def __init__(self, norm):
                super().__init__()
                self.fc = nn.Linear(4, 6)
                self.norm = norm
                self.out = nn.Linear(6, 3)

            def forward(self, x):
                return self.out(self.norm(self.fc(x)))

        # BatchNorm in training mode is recorded with its running statistics
        # (test_recorded_batchnorm.py); without them it is refused.
        model = WithNorm(nn.BatchNorm1d(6)).double()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        Recorder(self.path("train"), model, opt, self.x, self.y).close()
        model.norm.eval()
        Recorder(self.path("eval"), model, opt, self.x, self.y).close()
        model = WithNorm(nn.BatchNorm1d(6, track_running_stats=False)).double()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        self.refuse(r"the BatchNorm 'norm' \(BatchNorm1d\) has track_running_stats=False and no running statistics, "
                    r"expected track_running_stats=True", model, opt, self.x, self.y)
        # nn.Dropout draws pathkernel's masks (pathkernel.dropout); channel and
        # alpha dropout, whose masks it cannot draw, are refused while active.
        model = WithNorm(nn.Dropout(0.5)).double()
        Recorder(self.path("dropout"), model, torch.optim.SGD(model.parameters(), lr=0.1), self.x, self.y).close()
        for kind in (nn.Dropout1d(0.5), nn.AlphaDropout(0.5)):
            model = WithNorm(kind).double()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            self.refuse(r"'norm' is an active %s: .* Use nn.Dropout, or call .eval\(\)" % type(kind).__name__,
                        model, opt, self.x, self.y)

    def test_functional_dropout_in_training_mode(self):
        class Functional(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 6)
                self.out = nn.Linear(6, 3)

            def forward(self, x):
                return self.out(F.dropout(self.fc(x), 0.3, self.training))

        original = F.dropout
        model = Functional().double()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        self.refuse(r"2 dropout site\(s\) inside a branch or a loop .* Use nn.Dropout modules", model, opt,
                    self.x, self.y)
        self.assertIs(F.dropout, original)
        model.eval()  # passes its input through: nothing to draw
        Recorder(self.path("eval"), model, opt, self.x, self.y).close()

    def test_mixed_dtypes_and_existing_directory(self):
        model = mlp()
        model.out.float()
        self.refuse(r"mixes parameter dtypes", model, torch.optim.SGD(model.parameters(), lr=0.1), self.x, self.y)
        os.makedirs(self.path("run"))
        with open(self.path("run", "notes.txt"), "w") as f:
            f.write("mine")
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with self.assertRaisesRegex(RecorderError, r"already exists and is not empty; pass overwrite=True"):
            Recorder(self.path("run"), model, opt, self.x, self.y)
        with self.assertRaisesRegex(RecorderError, r"holds no manifest\.json.*refusing to delete"):
            Recorder(self.path("run"), model, opt, self.x, self.y, overwrite=True)
        self.assertTrue(os.path.exists(self.path("run", "notes.txt")))

    def test_bad_steps(self):
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        rec = Recorder(self.path("run"), model, opt, self.x, self.y)
        F.cross_entropy(model(self.x[:4]), self.y[:4]).backward()
        with self.assertRaisesRegex(RecorderError, r"no optimizer\.step\(\) since the previous rec\.step\(\)"):
            rec.step([0, 1, 2, 3])
        opt.step()
        with self.assertRaisesRegex(RecorderError, r"repeats training indices \[1\]"):
            rec.step(torch.tensor([0, 1, 1, 3]))
        with self.assertRaisesRegex(RecorderError, r"index 20, outside the training set \[0, 20\)"):
            rec.step([0, 20])
        rec.step(torch.tensor([0, 1, 2, 3]))
        opt.step()
        opt.step()
        with self.assertRaisesRegex(RecorderError, r"optimizer\.step\(\) ran 2 times"):
            rec.step([0, 1, 2, 3])

    def test_momentum_schedule_refused(self):
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        rec = Recorder(self.path("run"), model, opt, self.x, self.y)
        F.cross_entropy(model(self.x[:4]), self.y[:4]).backward()
        opt.param_groups[0]["momentum"] = 0.8
        opt.step()
        with self.assertRaisesRegex(RecorderError, r"step 0: the optimizer's momentum changed during training"):
            rec.step([0, 1, 2, 3])

    def test_weights_changed_outside_the_optimizer(self):
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        rec = Recorder(self.path("run"), model, opt, self.x, self.y)
        for s in range(2):
            opt.zero_grad()
            F.cross_entropy(model(self.x[:4]), self.y[:4]).backward()
            if s == 1:
                with torch.no_grad():
                    model.fc1.weight.clamp_(-0.1, 0.1)  # a projection the declaration does not describe
            opt.step()
            if s == 0:
                rec.step([0, 1, 2, 3])
        with self.assertRaisesRegex(RecorderError, r"step 1: the weights the optimizer stepped from are not the "
                                                   r"recorded w_1: the loop changed them outside optimizer\.step"):
            rec.step([0, 1, 2, 3])

    def test_one_cycle_scheduler(self):
        model = mlp()
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        rec = Recorder(self.path("run"), model, opt, self.x, self.y)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=10, cycle_momentum=False)
        for idx in batches(20, 5, 4):
            opt.zero_grad()
            F.cross_entropy(model(self.x[idx]), self.y[idx]).backward()
            opt.step()
            rec.step(idx)
            sched.step()
        rec.close()
        self.assertEqual(len(set(pathkernel.read_run(self.path("run")).learning_rates.tolist())), 4)
        model = mlp()
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        rec = Recorder(self.path("run2"), model, opt, self.x, self.y)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=10)
        F.cross_entropy(model(self.x[:5]), self.y[:5]).backward()
        opt.step()
        with self.assertRaisesRegex(RecorderError, r"step 0: the optimizer's betas changed during training.*"
                                                   r"cycle_momentum=False"):
            rec.step(range(5))

"""pathkernel.read_run and read_explain on what the CLI writes: a run trained
by `pathkernel train` on npy data, its explanation, and (with the engine on
recorded paths) the explanation of a recorded run."""
import json
import os
import shutil

from _helpers import F, Recorder, TempDirTest, batches, blobs, cli, mlp, need_binary, np, torch

import pathkernel


class ReadCliRuns(TempDirTest):
    def setUp(self):
        super().setUp()
        need_binary(self)
        x, y = blobs(40)
        xt, yt = blobs(10, seed=3)
        self.data = self.path("d")
        os.makedirs(self.data)
        for name, a in (("train_x", x), ("train_y", y), ("test_x", xt), ("test_y", yt)):
            np.save(os.path.join(self.data, name + ".npy"), a.numpy())
        torch.jit.script(mlp()).save(self.path("m.pt"))

    def train(self, name, *options):
        rc, out, err = cli(["--quiet", "train", "--model", "torchscript:" + self.path("m.pt"), "--data",
                            "npy:" + self.data, "--out", self.path(name)] + list(options), cwd=self.tmp)
        self.assertEqual(rc, 0, out + err)
        return self.path(name)

    def test_read_run_of_a_trained_run(self):
        d = self.train("adam", "--optimizer", "adam", "--batch", "10", "--steps", "6", "--checkpoint-every", "3",
                       "--schedule", "cosine")
        run = pathkernel.read_run(d)
        self.assertEqual((run.status, run.steps, run.checkpoint_steps), ("complete", 6, [0, 3, 6]))
        self.assertFalse(run.recorded)
        self.assertEqual(run.optimizer["name"], "adam")
        self.assertEqual(len(run.learning_rates), 6)
        self.assertEqual([len(b) for b in run.batches], [10] * 6)
        self.assertEqual(sorted(np.concatenate(run.batches[:4]).tolist()), list(range(40)))
        self.assertEqual(run.metrics["lr"].tolist(), run.learning_rates.tolist())
        w = run.weights(3, by_name=True)
        self.assertEqual(w["fc1.weight"].shape, (8, 4))
        self.assertEqual(run.optimizer_state(3)["step"], 3)
        self.assertEqual(sorted(run.optimizer_state(6)["buffers"]), ["exp_avg", "exp_avg_sq"])
        with self.assertRaisesRegex(KeyError, r"stores no weights for step 1 .*replay"):
            run.weights(1)
        self.assertIsNone(run.clip_factors)
        arrays = run.data()
        self.assertEqual(arrays["train_x"].shape, (40, 4))
        # The Python schema holds every field of pathkernel train's manifest.
        from pathkernel._manifest import Manifest
        parsed = Manifest.from_json(run.manifest)
        self.assertEqual((parsed.training.recorded, parsed.training.checkpoint_every), (False, 3))
        self.assertEqual(parsed.to_json(), run.manifest)
        # w_0 is the module's initial weights.
        module = torch.jit.load(run.module_path)
        self.assertTrue(np.array_equal(torch.cat([p.detach().reshape(-1) for p in module.parameters()]).numpy(),
                                       run.weights(0)))

    def test_read_explain(self):
        d = self.train("sgd", "--optimizer", "sgd", "--lr", "0.1", "--batch", "10", "--steps", "8")
        out = os.path.join(d, "explain")
        rc, o, e = cli(["--quiet", "explain", d, "--test-index", "0,2,5", "--top", "4", "--out", out], cwd=self.tmp)
        self.assertEqual(rc, 0, o + e)
        ex = pathkernel.read_explain(out, run=d)
        self.assertEqual(ex.contributions.shape, (3, 40, 3))
        self.assertEqual(ex.test_indices.tolist(), [0, 2, 5])
        for n, t in enumerate([0, 2, 5]):
            p = ex.point(t)
            c = ex.contributions[n, :, p["predicted"]]
            top = ex.top_proponents(t, 4)
            self.assertEqual([q["index"] for q in top], np.argsort(-c, kind="stable")[:4].tolist())
            self.assertAlmostEqual(top[0]["value"], c.max(), places=15)
            self.assertEqual(ex.top_opponents(t, 1)[0]["index"], int(np.argmin(c)))
            np.testing.assert_allclose(ex.contributions[n].sum(0), p["contributions_sum"], rtol=1e-12, atol=1e-15)
        k = ex.kernel
        self.assertIsNotNone(k)
        self.assertEqual(k.shape, (3, 40, 3, 3))
        with self.assertRaisesRegex(KeyError, "test point 1 is not explained"):
            ex.point(1)
        # A damaged explanation is refused with what is wrong.
        broken = self.path("broken")
        shutil.copytree(out, broken)
        np.save(os.path.join(broken, "contributions.npy"), ex.contributions[:2])
        with self.assertRaisesRegex(pathkernel.RunFormatError, r"has shape \[2, 40, 3\]; expected \[3, M, K\]"):
            pathkernel.read_explain(broken)
        os.remove(os.path.join(broken, "explain.json"))
        with self.assertRaisesRegex(pathkernel.RunFormatError, "has no explain.json"):
            pathkernel.read_explain(broken)
        with self.assertRaisesRegex(pathkernel.RunFormatError, "has no manifest.json"):
            pathkernel.read_run(broken)


class ExplainRecordedRun(TempDirTest):
    """explain on a recorded run, read back (needs the engine on recorded paths)."""

    def test_explain_recorded(self):
        need_binary(self)
        x, y = blobs(30)
        model = mlp()
        opt = torch.optim.Adam(model.parameters(), lr=0.02)
        d = self.path("run")
        with Recorder(d, model, opt, x, y, test_x=x[:5], test_y=y[:5]) as rec:
            for idx in batches(30, 6, 8):
                opt.zero_grad()
                F.cross_entropy(model(x[idx]), y[idx]).backward()
                opt.step()
                rec.step(idx)
        out = self.path("explain")
        rc, o, e = cli(["--quiet", "explain", d, "--test-index", "0,1", "--top", "3", "--out", out], cwd=self.tmp)
        self.assertEqual(rc, 0, o + e)
        ex = pathkernel.read_explain(out, run=d)
        self.assertEqual(ex.contributions.shape, (2, 30, 3))
        html = self.path("report.html")
        rc, o, e = cli(["--quiet", "report", d, "--explain", out, "--out", html, "--test", "3"], cwd=self.tmp)
        self.assertEqual(rc, 0, o + e)
        self.assertGreater(os.path.getsize(html), 1000)
        with open(os.path.join(out, "explain.json")) as f:
            self.assertEqual(json.load(f)["points"][0]["test_index"], 0)
        for n in range(2):
            p = ex.points[n]
            np.testing.assert_allclose(np.asarray(p["f_final"]) - np.asarray(p["f_initial"]),
                                       ex.contributions[n].sum(0) + np.asarray(p["regularization"]) +
                                       np.asarray(p["rounding"]), rtol=0, atol=1e-12)

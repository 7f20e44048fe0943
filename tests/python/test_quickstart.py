"""examples/quickstart.py, run as a user runs it, at a reduced size: it
records its loop, explains a test image through the engine and writes the
figure."""
import importlib.util
import os
import subprocess
import sys

from _helpers import ROOT, TempDirTest, binary, need_binary, np

import pathkernel

QUICKSTART = os.path.join(ROOT, "examples", "quickstart.py")
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


class Quickstart(TempDirTest):
    def test_records_explains_and_draws(self):
        need_binary(self)
        if not os.path.isdir(FASHION_MNIST):
            self.skipTest("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")
        if importlib.util.find_spec("matplotlib") is None:
            self.skipTest("matplotlib is not installed (apt-get install python3-matplotlib)")
        run = self.path("run")
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), PATHKERNEL_BIN=binary())
        p = subprocess.run([sys.executable, QUICKSTART, run, "--train", "200", "--test", "10", "--epochs", "1",
                            "--test-index", "3", "--top", "4"], env=env, capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr[-3000:])
        self.assertIn("recorded 4 steps", p.stdout)
        recorded = pathkernel.read_run(run)
        self.assertEqual((recorded.status, recorded.steps, recorded.manifest["data"]["input_shape"]),
                         ("complete", 4, [1, 28, 28]))
        ex = pathkernel.read_explain(os.path.join(run, "explain"), run=run)
        self.assertEqual(ex.contributions.shape, (1, 200, 10))
        self.assertEqual(ex.test_indices.tolist(), [3])
        self.assertEqual(len(ex.top_proponents(3)), 4)
        # The proponents are the training images of largest contribution to the predicted class.
        c = ex.contributions[0, :, ex.predicted[0]]
        self.assertEqual([q["index"] for q in ex.top_proponents(3)], np.argsort(-c, kind="stable")[:4].tolist())
        with open(os.path.join(run, "quickstart.png"), "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

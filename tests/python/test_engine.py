"""pathkernel.verify/explain/evaluate/report: the engine from Python gives the
numbers the CLI writes, its errors as PathkernelError with its message, the
binary lookup's errors name where it looked, and `pip install ./python`
installs the package at the engine's version."""
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import unittest
from unittest import mock

from _helpers import ROOT, TempDirTest, binary, blobs, cli, cli_json, mlp, need_binary, np, project_version, \
    record_cross_entropy, torch

import pathkernel
from pathkernel import engine

PYTHON = sys.executable


def recorded_run(test):
    """A tiny recorded run (20 training points, 4 test points, 6 SGD steps)."""
    x, y = blobs(20)
    model = mlp()
    run = test.path("run")
    record_cross_entropy(run, model, torch.optim.SGD(model.parameters(), lr=0.1), x, y, 5, 6, test=4)
    return run


class SameNumbersAsTheCli(TempDirTest):
    def setUp(self):
        super().setUp()
        need_binary(self)
        self.run = recorded_run(self)

    def test_explain_returns_the_files_the_cli_writes(self):
        d = self.path("cli-explain")
        rc, out, err = cli(["--threads", "1", "--quiet", "explain", self.run, "--test-index", "0,1", "--out", d])
        self.assertEqual(rc, 0, err)
        ex = pathkernel.explain(self.run, test_index=[0, 1], out=self.path("py-explain"), threads=1, quiet=True)
        self.assertIsInstance(ex, pathkernel.Explanation)
        self.assertEqual(ex.directory, self.path("py-explain"))
        np.testing.assert_array_equal(ex.test_indices, [0, 1])
        np.testing.assert_array_equal(ex.contributions, np.load(os.path.join(d, "contributions.npy")))
        np.testing.assert_array_equal(ex.kernel, np.load(os.path.join(d, "kernel.npy")))
        with open(os.path.join(d, "explain.json")) as f:
            points = json.load(f)["points"]
        self.assertEqual(ex.proponents, [p["proponents"] for p in points])
        self.assertEqual(ex.opponents, [p["opponents"] for p in points])

    def test_explain_without_out_writes_where_the_cli_does(self):
        ex = pathkernel.explain(self.run, test_index=2, quiet=True)
        self.assertEqual(ex.directory, os.path.join(self.run, "explain"))
        np.testing.assert_array_equal(ex.test_indices, [2])

    def test_verify_returns_the_clis_json(self):
        j = cli_json(self, ["--threads", "1", "verify", self.run, "--test-index", "0,1"])
        v = pathkernel.verify(self.run, test_index=[0, 1], threads=1, quiet=True)
        self.assertIsInstance(v, pathkernel.VerifyResult)
        self.assertEqual(v.test_points, 2)
        for key in ("max_abs_error", "max_rel_error", "completeness_error", "max_abs_rounding", "error_bound",
                    "cancellation", "updates_explained", "first_unexplained_step", "steps", "route"):
            self.assertEqual(getattr(v, key), j[key], key)
        timings = ("seconds", "seconds_by_part")
        self.assertEqual({k: x for k, x in v.json.items() if k not in timings},
                         {k: x for k, x in j.items() if k not in timings})

    def test_report_writes_the_file_it_names(self):
        pathkernel.explain(self.run, test_index=[0, 1], quiet=True)
        r = pathkernel.report(self.run, out=self.path("r.html"), grid=0, gram_points=0, quiet=True)
        self.assertEqual(r.path, self.path("r.html"))
        self.assertEqual(os.path.getsize(r.path), r.bytes)

    def test_progress_reaches_stderr_unless_quiet(self):
        for quiet in (False, True):
            with self.subTest(quiet=quiet):
                captured = io.StringIO()
                with contextlib.redirect_stderr(captured):
                    pathkernel.verify(self.run, test=2, quiet=quiet)
                if quiet:
                    self.assertEqual(captured.getvalue(), "")
                else:
                    self.assertIn("decompose", captured.getvalue())


class EvaluateFromPython(TempDirTest):
    def test_scores_and_table_are_the_clis(self):
        need_binary(self)
        run = self.path("trained")
        rc, out, err = cli(["--threads", "1", "--quiet", "train", "--data", "gaussians3", "--train-size", "30",
                            "--test-size", "6", "--model", "mlp:8", "--steps", "6", "--batch", "10", "--out", run])
        self.assertEqual(rc, 0, err)
        common = ["--test", "2", "--methods", "epk,random", "--metrics", "loo", "--loo-extremes", "1",
                  "--loo-random", "2", "--workers", "1"]
        j = cli_json(self, ["--threads", "1", "evaluate", run, "--out", self.path("cli-ev")] + common)
        e = pathkernel.evaluate(run, test=2, methods=["epk", "random"], metrics=["loo"], loo_extremes=1,
                                loo_random=2, workers=1, threads=1, out=self.path("py-ev"), quiet=True)
        self.assertEqual(e.table, j["table"])
        self.assertEqual(sorted(e.scores), ["epk", "random"])
        for method, scores in e.scores.items():
            np.testing.assert_array_equal(scores, np.load(self.path("cli-ev", "scores_%s.npy" % method)))


class EngineErrors(TempDirTest):
    def setUp(self):
        super().setUp()
        need_binary(self)

    def test_a_missing_run_directory(self):
        missing = self.path("no-such-run")
        with self.assertRaises(pathkernel.PathkernelError) as c:
            pathkernel.verify(missing, test=2, quiet=True)
        self.assertIn("does not exist", c.exception.message)
        self.assertIn(missing, c.exception.message)
        self.assertNotEqual(c.exception.returncode, 0)
        self.assertIn(c.exception.message, str(c.exception))

    def test_a_test_index_out_of_range(self):
        run = recorded_run(self)
        with self.assertRaises(pathkernel.PathkernelError) as c, contextlib.redirect_stderr(io.StringIO()):
            pathkernel.explain(run, test_index=[1, 9])
        self.assertRegex(c.exception.message, r"^pathkernel: error: .*test index 9 is out of range \[0, 4\)")
        self.assertEqual(c.exception.returncode, 1)

    def test_an_option_the_engine_does_not_have(self):
        run = recorded_run(self)
        with self.assertRaisesRegex(pathkernel.PathkernelError, "no-such-option"):
            pathkernel.verify(run, no_such_option=3, quiet=True)


class Arguments(unittest.TestCase):
    """Keyword arguments become the CLI's options mechanically."""

    def test_mapping(self):
        before, after = engine._options({"test_index": [0, 1, 5], "threads": 2, "kernel": "off", "tol": 1e-9,
                                         "flag_on": True, "flag_off": False, "unset": None,
                                         "rows": np.array([3, 4]), "span": range(2)})
        self.assertEqual(before, ["--threads", "2"])
        self.assertEqual(after, ["--test-index", "0,1,5", "--kernel", "off", "--tol", "1e-09", "--flag-on",
                                 "--rows", "3,4", "--span", "0,1"])


class BinaryLookup(unittest.TestCase):
    def test_pathkernel_bin_names_a_missing_file(self):
        missing = os.path.join(ROOT, "no-such-dir", "pathkernel")
        with mock.patch.dict(os.environ, {"PATHKERNEL_BIN": missing}):
            with self.assertRaises(pathkernel.EngineNotFoundError) as c:
                pathkernel.verify("runs/x", quiet=True)
        self.assertIn("PATHKERNEL_BIN is '%s'" % missing, str(c.exception))
        self.assertIn("not an executable file", str(c.exception))

    def test_nowhere_names_the_three_places(self):
        env = {k: v for k, v in os.environ.items() if k != "PATHKERNEL_BIN"}
        env["PATH"] = os.path.join(ROOT, "no-such-dir")
        with mock.patch.dict(os.environ, env, clear=True):
            with self.assertRaises(FileNotFoundError) as c:
                pathkernel.find_engine()
        text = str(c.exception)
        for place in ("PATHKERNEL_BIN", "beside the package", "on PATH"):
            self.assertIn(place, text)

    def test_pathkernel_bin_is_used(self):
        if binary() is None:
            self.skipTest("the pathkernel CLI is not built (set PATHKERNEL_BIN)")
        with mock.patch.dict(os.environ, {"PATHKERNEL_BIN": binary()}):
            self.assertEqual(pathkernel.find_engine(), binary())


class Version(unittest.TestCase):
    def test_package_cmake_and_cli_agree(self):
        self.assertEqual(pathkernel.__version__, project_version())
        need_binary(self)
        rc, out, err = cli(["--version"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.split()[:2], ["pathkernel", project_version()], out)


class PipInstall(TempDirTest):
    """`pip install ./python`, offline, into a directory of its own."""

    def test_installed_package_imports_at_the_projects_version(self):
        for module, package in (("pip", "python3-pip"), ("setuptools", "python3-setuptools")):
            if subprocess.run([PYTHON, "-c", "import " + module], capture_output=True).returncode != 0:
                self.skipTest("%s is not installed for %s (Debian's %s; scripts/deps.sh installs it)"
                              % (module, PYTHON, package))
        source = self.path("source")  # a copy: the build leaves build/ and *.egg-info beside pyproject.toml
        shutil.copytree(os.path.join(ROOT, "python"), source,
                        ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
        target = self.path("site")
        p = subprocess.run([PYTHON, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps",
                            "--no-index", "--disable-pip-version-check", "--target", target, source],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, "pip install failed:\n%s\n%s" % (p.stdout, p.stderr))
        env = dict(os.environ, PYTHONPATH=target)
        code = ("import importlib.metadata, json, pathkernel; print(json.dumps([pathkernel.__file__, "
                "pathkernel.__version__, importlib.metadata.version('pathkernel'), callable(pathkernel.explain)]))")
        empty = self.path("elsewhere")
        os.mkdir(empty)
        p = subprocess.run([PYTHON, "-c", code], cwd=empty, env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        path, version, metadata_version, has_explain = json.loads(p.stdout)
        self.assertTrue(path.startswith(target + os.sep), path)
        self.assertEqual(version, project_version())
        self.assertEqual(metadata_version, project_version())
        self.assertTrue(has_explain)


if __name__ == "__main__":
    unittest.main()

"""Coded data: the recorder stores an input array of at most 256 distinct
values (images of 8-bit pixels) as data/NAME.codes.npy, uint8 of the array's
shape, and data/NAME.values.npy, its values; values[codes] is the array bit
for bit, in pathkernel.read and in the engine (src/core/npy.cpp)."""
import json
import os

from _helpers import F, Recorder, TempDirTest, batches, cli, cli_json, need_binary, np, torch

import pathkernel
from pathkernel import _files
from pathkernel._files import RunFormatError, read_array, value_codes


def pixels(shape, seed=0, dtype=np.float32):
    """Images as a loop feeds them: 8-bit pixels over 255, with -0.0 and NaN
    among the 256 values so that only an exact decoding gives the same bits."""
    levels = (np.arange(256) / 255.0).astype(dtype)
    levels[1], levels[2] = -0.0, np.nan
    return levels[np.random.default_rng(seed).integers(0, 256, size=shape)]


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


class ValueCodes(TempDirTest):
    def test_codes_decode_bit_for_bit_in_every_dtype(self):
        arrays = [pixels((300, 1, 5, 5)), pixels((40, 7), seed=1, dtype=np.float64),
                  np.random.default_rng(2).integers(-2**40, 2**40, 200)[np.arange(5000) % 200].reshape(50, 100),
                  (np.arange(3000) % 97 - 48).astype(np.int32).reshape(30, 100)]
        for a in arrays:
            with self.subTest(dtype=a.dtype):
                codes, values = value_codes(a)
                self.assertEqual((codes.dtype, codes.shape, values.dtype, values.ndim), (np.uint8, a.shape, a.dtype, 1))
                self.assertLessEqual(values.size, 256)
                self.assertTrue(same_bits(values[codes], a))

    def test_more_than_256_values_are_not_coded_even_across_chunks(self):
        self.assertIsNone(value_codes(np.arange(257, dtype=np.float32)))
        self.assertIsNone(value_codes(np.arange(10, dtype=np.uint8)))  # not a dtype pathkernel reads
        chunk = _files._CODE_CHUNK
        try:
            _files._CODE_CHUNK = 200  # each chunk holds 200 values, the whole array 300
            self.assertIsNone(value_codes(np.arange(300, dtype=np.float64)))
            a = pixels((40, 25), seed=4)
            codes, values = value_codes(a)
            self.assertTrue(same_bits(values[codes], a))
        finally:
            _files._CODE_CHUNK = chunk

    def test_a_bad_pair_is_a_clear_error(self):
        d = self.tmp
        np.save(os.path.join(d, "x.codes.npy"), np.array([[0, 2], [1, 1]], dtype=np.uint8))
        with self.assertRaisesRegex(RunFormatError, r"has only x.codes.npy; expected x.npy or the pair"):
            read_array(d, "x", "run 'r'")
        np.save(os.path.join(d, "x.values.npy"), np.array([0.5, 1.5], dtype=np.float32))
        with self.assertRaisesRegex(RunFormatError, r"x.codes.npy' holds the code 2, out of range of the 2 values"):
            read_array(d, "x", "run 'r'")
        np.save(os.path.join(d, "x.values.npy"), np.zeros((3, 1), dtype=np.float32))
        with self.assertRaisesRegex(RunFormatError, r"shape \[3, 1\], expected a 1-D table of at most 256"):
            read_array(d, "x", "run 'r'")
        np.save(os.path.join(d, "x.values.npy"), np.array([0.5, 1.5, 2.5], dtype=np.float32))
        self.assertTrue(same_bits(read_array(d, "x", "r"), np.array([[0.5, 2.5], [1.5, 1.5]], dtype=np.float32)))
        np.save(os.path.join(d, "x.codes.npy"), np.array([[0, 2], [1, 1]], dtype=np.int64))
        with self.assertRaisesRegex(RunFormatError, r"holds int64 of shape \[2, 2\], expected uint8 codes"):
            read_array(d, "x", "run 'r'")
        np.save(os.path.join(d, "x.npy"), np.zeros(2))
        with self.assertRaisesRegex(RunFormatError, r"holds both x.npy and the coded pair"):
            read_array(d, "x", "run 'r'")


class RecordedCodedData(TempDirTest):
    def record(self, run, x, xt, steps=12):
        y = torch.arange(x.shape[0]) % 3
        yt = torch.arange(xt.shape[0]) % 3
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 6), torch.nn.ReLU(),
                                    torch.nn.Linear(6, 3)).to(x.dtype)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        with Recorder(run, model, opt, x, y, test_x=xt, test_y=yt) as rec:
            for idx in batches(x.shape[0], 16, steps):
                opt.zero_grad()
                F.cross_entropy(model(x[idx]), y[idx]).backward()
                opt.step()
                rec.step(idx)
        return y, yt

    def test_pixel_inputs_are_stored_coded_and_read_back_bit_for_bit(self):
        # Pixels without NaN (the recorder refuses non-finite inputs) but with -0.0.
        x = np.nan_to_num(pixels((200, 1, 4, 4), seed=1), nan=0.5)
        xt = np.nan_to_num(pixels((30, 1, 4, 4), seed=2), nan=0.5)
        run = self.path("run")
        self.record(run, torch.from_numpy(x), torch.from_numpy(xt))
        files = sorted(os.listdir(os.path.join(run, "data")))
        self.assertEqual(files, ["test_x.codes.npy", "test_x.values.npy", "test_y.npy", "train_x.codes.npy",
                                 "train_x.values.npy", "train_y.npy"])
        with open(os.path.join(run, "manifest.json")) as f:
            source = json.load(f)["data"]["source"]
        self.assertEqual(source["files"], ["train_x.codes.npy", "train_x.values.npy", "train_y.npy",
                                           "test_x.codes.npy", "test_x.values.npy", "test_y.npy"])
        arrays = pathkernel.read_run(run).data()
        self.assertTrue(same_bits(arrays["train_x"], x))
        self.assertTrue(same_bits(arrays["test_x"], xt))
        self.assertLess(os.path.getsize(os.path.join(run, "data", "train_x.codes.npy")), x.nbytes / 3)

    def test_the_engine_decodes_the_same_bits(self):
        # The engine checks the training data's CRC-32 (taken by the recorder on
        # the loop's arrays) and replays every checkpoint from it.
        need_binary(self)
        x = torch.from_numpy(np.nan_to_num(pixels((200, 1, 4, 4), seed=3), nan=0.5))
        run = self.path("run")
        self.record(run, x, x[:20].clone())
        self.assertTrue(os.path.exists(os.path.join(run, "data", "train_x.codes.npy")))
        j = cli_json(self, ["check-path", run])
        drift = j["replay_drift"] if "replay_drift" in j else j
        self.assertEqual(drift["max_abs_diff"], 0, j)

    def test_the_engine_refuses_a_broken_pair_naming_it(self):
        need_binary(self)
        x = torch.from_numpy(np.nan_to_num(pixels((200, 1, 4, 4), seed=3), nan=0.5))
        run = self.path("run")
        self.record(run, x, x[:20].clone(), steps=2)
        os.unlink(os.path.join(run, "data", "train_x.values.npy"))
        rc, _, err = cli(["check-path", run])
        self.assertNotEqual(rc, 0)
        self.assertIn("train_x.codes.npy but not train_x.values.npy", err)
        np.save(os.path.join(run, "data", "train_x.values.npy"), np.zeros(3, dtype=np.float32))
        rc, _, err = cli(["check-path", run])
        self.assertNotEqual(rc, 0)
        self.assertRegex(err, r"train_x.codes.npy with .*train_x.values.npy: code \d+ is out of range of the table "
                              r"of 3 values")
        # Both files of the pair must be inside the run.
        outside = self.path("values.npy")
        np.save(outside, np.zeros(256, dtype=np.float32))
        os.unlink(os.path.join(run, "data", "train_x.values.npy"))
        os.symlink(outside, os.path.join(run, "data", "train_x.values.npy"))
        rc, _, err = cli(["check-path", run])
        self.assertNotEqual(rc, 0)
        self.assertIn("file 'data/train_x.values.npy' resolves to", err)
        self.assertIn("outside the run directory", err)

    def test_an_array_of_many_values_stays_plain(self):
        x = torch.randn(200, 1, 4, 4)
        run = self.path("run")
        self.record(run, x, x[:10].clone(), steps=2)
        self.assertTrue(os.path.exists(os.path.join(run, "data", "train_x.npy")))
        self.assertFalse(os.path.exists(os.path.join(run, "data", "train_x.codes.npy")))
        self.assertTrue(same_bits(pathkernel.read_run(run).data()["train_x"], x.numpy()))

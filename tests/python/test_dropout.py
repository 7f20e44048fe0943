"""pathkernel's dropout masks as the recorder draws them (pathkernel.dropout):
what they keep, what they depend on, and the sites of a module's graph. That
they are the C++ engine's own masks is tested end to end by
test_verify_recorded.DropoutLoop (every recorded update explained)."""
import unittest

import numpy as np

from _helpers import F, nn, torch  # noqa: F401 (puts python/ on the path)
from pathkernel.dropout import dropout_mask, graph_sites, row_hashes


class Masks(unittest.TestCase):
    def setUp(self):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(400, 7, generator=g, dtype=torch.float64)

    def test_keeps_about_one_minus_p_and_scales_the_kept(self):
        for p in (0.1, 0.5, 0.8):
            m = dropout_mask(0, 3, 1, self.x, 250, p)
            self.assertEqual(m.shape, (400, 250))
            self.assertTrue(set(np.unique(m)) <= {0.0, 1.0 / (1.0 - p)})
            kept = float((m > 0).mean())
            # 100,000 draws: the binomial's standard deviation is below 0.0016.
            self.assertAlmostEqual(kept, 1 - p, delta=0.01)

    def test_a_row_s_mask_is_its_own_whatever_the_batch(self):
        full = dropout_mask(7, 5, 2, self.x, 30, 0.4)
        idx = torch.tensor([9, 3, 250, 0])
        self.assertTrue(np.array_equal(dropout_mask(7, 5, 2, self.x[idx], 30, 0.4), full[idx.numpy()]))
        # float32 or float64 copies of the inputs hash alike; -0 is +0.
        self.assertTrue(np.array_equal(row_hashes(self.x.float()), row_hashes(self.x.float().double())))
        z = torch.zeros(2, 3)
        z[1, 1] = -0.0
        h = row_hashes(z)
        self.assertEqual(h[0], h[1])

    def test_step_site_seed_and_input_each_change_the_mask(self):
        base = dropout_mask(0, 4, 1, self.x, 50, 0.5)
        for other in (dropout_mask(0, 5, 1, self.x, 50, 0.5), dropout_mask(0, 4, 2, self.x, 50, 0.5),
                      dropout_mask(1, 4, 1, self.x, 50, 0.5), dropout_mask(0, 4, 1, self.x + 1e-3, 50, 0.5)):
            self.assertGreater(float((base != other).mean()), 0.4)


class Sites(unittest.TestCase):
    def test_modules_sites_are_in_the_graph_s_own_block_and_functional_calls_branch(self):
        seq = nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.2), nn.ReLU(), nn.Linear(4, 4), nn.Dropout(0.1))
        self.assertEqual(graph_sites(torch.jit.script(seq)), (2, 0))

        class Functional(nn.Module):
            def forward(self, x):
                return F.dropout(x, 0.3, self.training)

        self.assertEqual(graph_sites(torch.jit.script(Functional())), (2, 2))
        self.assertEqual(graph_sites(torch.jit.script(nn.Linear(3, 2))), (0, 0))


if __name__ == "__main__":
    unittest.main()

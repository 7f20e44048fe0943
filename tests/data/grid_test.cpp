// The 2-D grid against an explicit double loop, its bounds, and its errors.
#include <gtest/gtest.h>

#include "../test_util.h"
#include "pathkernel/grid.h"

namespace pathkernel {
namespace {

TEST(Grid, PointsAreTheAxesWithTheFirstCoordinateFastest) {
  for (int64_t G : {2, 3, 7}) {
    GridBounds b;
    b.lo[0] = -1.5;
    b.hi[0] = 2.0;
    b.lo[1] = 10.0;
    b.hi[1] = 11.0;
    const Grid2D g = grid_2d(b, G);
    ASSERT_EQ(g.points.sizes(), (std::vector<int64_t>{G * G, 2})) << "G=" << G;
    ASSERT_EQ(g.points.scalar_type(), torch::kFloat64);
    EXPECT_EQ(g.x[0].item<double>(), -1.5);
    EXPECT_EQ(g.x[G - 1].item<double>(), 2.0);
    EXPECT_EQ(g.y[0].item<double>(), 10.0);
    EXPECT_EQ(g.y[G - 1].item<double>(), 11.0);
    for (int64_t i = 0; i < G; ++i) {
      for (int64_t j = 0; j < G; ++j) {
        const double step0 = 3.5 / static_cast<double>(G - 1), step1 = 1.0 / static_cast<double>(G - 1);
        EXPECT_NEAR(g.points[i * G + j][0].item<double>(), -1.5 + j * step0, 1e-12) << "G=" << G << " i=" << i << " j=" << j;
        EXPECT_NEAR(g.points[i * G + j][1].item<double>(), 10.0 + i * step1, 1e-12) << "G=" << G << " i=" << i << " j=" << j;
        EXPECT_EQ(g.points[i * G + j][0].item<double>(), g.x[j].item<double>());
        EXPECT_EQ(g.points[i * G + j][1].item<double>(), g.y[i].item<double>());
      }
    }
  }
}

TEST(Grid, BoundsAroundPointsArePadded) {
  const torch::Tensor x = torch::tensor({{0.0, 4.0}, {2.0, 5.0}, {1.0, 8.0}}, torch::kFloat64);
  struct Case {
    double relative, absolute, lo0, hi0, lo1, hi1;
  };
  for (const Case& c : std::vector<Case>{{0.0, 0.0, 0.0, 2.0, 4.0, 8.0},
                                         {0.1, 0.0, -0.2, 2.2, 3.6, 8.4},
                                         {0.0, 0.5, -0.5, 2.5, 3.5, 8.5},
                                         {0.5, 1.0, -2.0, 4.0, 1.0, 11.0}}) {
    const GridBounds b = GridBounds::around(x, c.relative, c.absolute);
    EXPECT_NEAR(b.lo[0], c.lo0, 1e-12) << c.relative << " " << c.absolute;
    EXPECT_NEAR(b.hi[0], c.hi0, 1e-12) << c.relative << " " << c.absolute;
    EXPECT_NEAR(b.lo[1], c.lo1, 1e-12) << c.relative << " " << c.absolute;
    EXPECT_NEAR(b.hi[1], c.hi1, 1e-12) << c.relative << " " << c.absolute;
  }
}

TEST(Grid, BadInputIsNamed) {
  EXPECT_CONTAINS(testing::error_message([] { GridBounds::around(torch::zeros({4, 3}), 0.1, 0); }),
                  "a 2-D grid needs inputs with 2 features (these have 3)");
  EXPECT_CONTAINS(testing::error_message([] { GridBounds::around(torch::zeros({4, 2}), -0.1, 0); }),
                  "padding must be >= 0");
  EXPECT_CONTAINS(testing::error_message([] { grid_2d(GridBounds(), 1); }), ">= 2 points per axis (got 1)");
  GridBounds flat;
  flat.hi[1] = 0;
  EXPECT_CONTAINS(testing::error_message([&] { grid_2d(flat, 4); }), "bounds on axis 1 must be finite with low < high");
}

}  // namespace
}  // namespace pathkernel

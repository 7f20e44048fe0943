// A regular grid over a plane of 2-D inputs.
#include "pathkernel/grid.h"

#include <cmath>

#include "pathkernel/error.h"

namespace pathkernel {

GridBounds GridBounds::around(const torch::Tensor& points, double relative, double absolute) {
  PK_CHECK(points.dim() >= 2 && points.size(0) >= 1, "a grid around points needs a non-empty [n, 2] tensor (got shape "
                                                         << points.sizes() << ")");
  const torch::Tensor x = points.flatten(1).to(torch::kFloat64);
  PK_CHECK(x.size(1) == 2, "a 2-D grid needs inputs with 2 features (these have " << x.size(1) << ")");
  PK_CHECK(relative >= 0 && absolute >= 0,
           "a grid's padding must be >= 0 (got relative " << relative << ", absolute " << absolute << ")");
  GridBounds b;
  for (int a = 0; a < 2; ++a) {
    const double lo = x.select(1, a).min().item<double>(), hi = x.select(1, a).max().item<double>();
    const double pad = relative * (hi - lo) + absolute;
    b.lo[a] = lo - pad;
    b.hi[a] = hi + pad;
  }
  return b;
}

Grid2D grid_2d(const GridBounds& bounds, int64_t points_per_axis) {
  PK_CHECK(points_per_axis >= 2, "a grid needs >= 2 points per axis (got " << points_per_axis << ")");
  for (int a = 0; a < 2; ++a) {
    PK_CHECK(std::isfinite(bounds.lo[a]) && std::isfinite(bounds.hi[a]) && bounds.lo[a] < bounds.hi[a],
             "a grid's bounds on axis " << a << " must be finite with low < high (got [" << bounds.lo[a] << ", "
                                        << bounds.hi[a] << "])");
  }
  Grid2D g;
  g.x = torch::linspace(bounds.lo[0], bounds.hi[0], points_per_axis, torch::kFloat64);
  g.y = torch::linspace(bounds.lo[1], bounds.hi[1], points_per_axis, torch::kFloat64);
  const std::vector<torch::Tensor> mesh = torch::meshgrid({g.x, g.y}, "xy");  // [G, G] each, x along columns
  g.points = torch::stack({mesh[0].reshape(-1), mesh[1].reshape(-1)}, 1);
  return g;
}

}  // namespace pathkernel

// A regular grid over a plane of 2-D inputs, for maps and decision-boundary
// figures (the GP on a grid, the report's kernel and GP maps, fig5): G points
// per axis, every point a row of a float64 [G·G, 2] tensor with the first
// coordinate varying fastest.
#pragma once

#include <cstdint>

#include <torch/torch.h>

namespace pathkernel {

/// The rectangle [lo[0], hi[0]] x [lo[1], hi[1]].
struct GridBounds {
  double lo[2] = {0, 0};
  double hi[2] = {1, 1};

  /// The bounding box of points [n, 2] (or [n, ...] with two features each),
  /// widened on each side by `relative` times its extent along that axis plus
  /// `absolute`. Throws Error when the points do not have two features.
  static GridBounds around(const torch::Tensor& points, double relative, double absolute);
};

struct Grid2D {
  torch::Tensor x;       ///< float64 [G]: the first coordinate's values, lo[0] to hi[0]
  torch::Tensor y;       ///< float64 [G]: the second coordinate's values, lo[1] to hi[1]
  torch::Tensor points;  ///< float64 [G·G, 2]: row i·G + j is (x[j], y[i])
};

/// G = points_per_axis equally spaced values per axis, ends included.
/// Throws Error when G < 2 or a bound is not finite or not increasing.
Grid2D grid_2d(const GridBounds& bounds, int64_t points_per_axis);

}  // namespace pathkernel

// PNG grids of input images, for looking at a test point beside the
// training points that pushed its prediction up or down. Encoding is done by
// stb_image_write (Debian's libstb-dev); writes are atomic.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace pathkernel {

using Rgb = std::array<uint8_t, 3>;

/// One cell of a grid: an image [C, H, W] (C = 1 or 3), or empty (left blank),
/// with an optional frame colour.
struct GridTile {
  torch::Tensor image;
  std::optional<Rgb> frame;
};

struct GridOptions {
  int64_t zoom = 3;    ///< each image pixel becomes zoom x zoom
  int64_t frame = 2;   ///< frame width in output pixels
  int64_t gap = 4;     ///< space between tiles (white)
};

/// Lays out `rows` of tiles (all images the same shape) and writes a PNG.
/// Grey levels map the smallest value over all tiles to black and the largest
/// to white, so tiles are comparable. Throws Error on mismatched or
/// non-image shapes, or if the file cannot be written.
void write_png_grid(const std::string& path, const std::vector<std::vector<GridTile>>& rows,
                    const GridOptions& options = {});

}  // namespace pathkernel

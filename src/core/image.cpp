// PNG grids through stb_image_write.
#include "pathkernel/image.h"

#include <stb_image_write.h>

#include <algorithm>

#include "pathkernel/error.h"
#include "pathkernel/files.h"

namespace pathkernel {

namespace {
void append(void* context, void* data, int size) {
  static_cast<std::string*>(context)->append(static_cast<const char*>(data), static_cast<size_t>(size));
}
}  // namespace

void write_png_grid(const std::string& path, const std::vector<std::vector<GridTile>>& rows,
                    const GridOptions& options) {
  PK_CHECK(options.zoom >= 1 && options.frame >= 0 && options.gap >= 0,
           "PNG grid: zoom must be >= 1 and frame, gap >= 0 (got " << options.zoom << ", " << options.frame << ", "
                                                                   << options.gap << ")");
  std::vector<int64_t> shape;
  double lo = 0, hi = 0;
  size_t columns = 0;
  bool first = true;
  for (const auto& row : rows) {
    columns = std::max(columns, row.size());
    for (const GridTile& t : row) {
      if (!t.image.defined()) continue;
      PK_CHECK(t.image.dim() == 3 && (t.image.size(0) == 1 || t.image.size(0) == 3),
               "PNG grid: images must be [C, H, W] with C = 1 or 3 (got " << t.image.sizes() << ")");
      if (first) shape = t.image.sizes().vec();
      PK_CHECK(t.image.sizes().vec() == shape,
               "PNG grid: all images must have one shape; got " << t.image.sizes() << " and " << torch::IntArrayRef(shape));
      const double a = t.image.min().item<double>(), b = t.image.max().item<double>();
      lo = first ? a : std::min(lo, a);
      hi = first ? b : std::max(hi, b);
      first = false;
    }
  }
  PK_CHECK(!first, "PNG grid '" << path << "': no images");
  const int64_t c = shape[0], h = shape[1], w = shape[2], z = options.zoom, fr = options.frame, gap = options.gap;
  const int64_t cell_h = h * z + 2 * fr, cell_w = w * z + 2 * fr;
  const int64_t height = static_cast<int64_t>(rows.size()) * (cell_h + gap) + gap;
  const int64_t width = static_cast<int64_t>(columns) * (cell_w + gap) + gap;
  std::vector<uint8_t> pixels(static_cast<size_t>(height * width * 3), 255);
  auto put = [&](int64_t y, int64_t x, const Rgb& rgb) {
    std::copy(rgb.begin(), rgb.end(), pixels.begin() + (y * width + x) * 3);
  };
  const double span = hi > lo ? hi - lo : 1.0;
  for (size_t r = 0; r < rows.size(); ++r) {
    for (size_t col = 0; col < rows[r].size(); ++col) {
      const GridTile& t = rows[r][col];
      if (!t.image.defined()) continue;
      const int64_t y0 = gap + static_cast<int64_t>(r) * (cell_h + gap), x0 = gap + static_cast<int64_t>(col) * (cell_w + gap);
      if (t.frame) {
        for (int64_t y = 0; y < cell_h; ++y) {
          for (int64_t x = 0; x < cell_w; ++x) put(y0 + y, x0 + x, *t.frame);
        }
      }
      torch::Tensor img = ((t.image.to(torch::kFloat64) - lo) / span * 255.0).round().clamp(0, 255).to(torch::kUInt8).contiguous();
      auto a = img.accessor<uint8_t, 3>();
      for (int64_t y = 0; y < h * z; ++y) {
        for (int64_t x = 0; x < w * z; ++x) {
          Rgb rgb;
          for (int64_t k = 0; k < 3; ++k) rgb[k] = a[c == 1 ? 0 : k][y / z][x / z];
          put(y0 + fr + y, x0 + fr + x, rgb);
        }
      }
    }
  }
  std::string bytes;
  const int ok = stbi_write_png_to_func(append, &bytes, static_cast<int>(width), static_cast<int>(height), 3,
                                        pixels.data(), static_cast<int>(width * 3));
  PK_CHECK(ok != 0, "PNG grid '" << path << "': encoding failed");
  write_file_atomic(path, bytes);
}

}  // namespace pathkernel

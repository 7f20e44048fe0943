// PNG grids decoded back with stb_image: layout, grey levels, frames, errors.
#include <gtest/gtest.h>

#include <stb_image.h>

#include "../test_util.h"
#include "pathkernel/files.h"
#include "pathkernel/image.h"

namespace pathkernel {
namespace {

struct Decoded {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
  Rgb at(int y, int x) const {
    const size_t i = static_cast<size_t>((y * width + x) * 3);
    return {rgb[i], rgb[i + 1], rgb[i + 2]};
  }
};

Decoded decode(const std::string& path) {
  const std::string bytes = read_file(path);
  Decoded d;
  int channels = 0;
  unsigned char* p = stbi_load_from_memory(reinterpret_cast<const unsigned char*>(bytes.data()),
                                           static_cast<int>(bytes.size()), &d.width, &d.height, &channels, 3);
  EXPECT_NE(p, nullptr) << path;
  if (p) {
    d.rgb.assign(p, p + d.width * d.height * 3);
    stbi_image_free(p);
  }
  return d;
}

TEST(PngGrid, LaysOutTilesWithGreyLevelsAndFrames) {
  testing::TempDir dir("png");
  // Two 1x2x2 images; values span [-1, 3] over the grid.
  torch::Tensor a = torch::tensor({-1.0, 0.0, 1.0, 3.0}, torch::kFloat64).view({1, 2, 2});
  torch::Tensor b = torch::full({1, 2, 2}, 1.0, torch::kFloat64);
  GridOptions o;
  o.zoom = 2;
  o.frame = 1;
  o.gap = 3;
  const Rgb red{200, 0, 0};
  write_png_grid(dir / "g.png", {{{a, std::nullopt}, {b, red}}, {{torch::Tensor(), std::nullopt}}}, o);
  Decoded d = decode(dir / "g.png");
  // cell = 2*2 + 2*1 = 6; width = 2*(6+3)+3 = 21, height = 2*(6+3)+3 = 21.
  ASSERT_EQ(d.width, 21);
  ASSERT_EQ(d.height, 21);
  EXPECT_EQ(d.at(0, 0), (Rgb{255, 255, 255}));               // gap
  // Tile a at (3,3): no frame, so its frame ring is white; pixels start at (4,4).
  EXPECT_EQ(d.at(3, 3), (Rgb{255, 255, 255}));
  EXPECT_EQ(d.at(4, 4), (Rgb{0, 0, 0}));                     // -1 is the minimum
  EXPECT_EQ(d.at(5, 5), (Rgb{0, 0, 0}));                     // zoomed
  EXPECT_EQ(d.at(7, 7), (Rgb{255, 255, 255}));               // 3 is the maximum
  EXPECT_EQ(d.at(4, 6), (Rgb{64, 64, 64}));                  // 0 -> round(255/4)
  // Tile b at (3, 12): red frame, then 1 -> round(255/2) = 128.
  EXPECT_EQ(d.at(3, 12), red);
  EXPECT_EQ(d.at(4, 13), (Rgb{128, 128, 128}));
  // The empty second row stays white.
  EXPECT_EQ(d.at(15, 6), (Rgb{255, 255, 255}));
}

TEST(PngGrid, RejectsBadShapesWithoutWriting) {
  testing::TempDir dir("png");
  torch::Tensor a = torch::zeros({1, 2, 2}), b = torch::zeros({1, 3, 3}), flat = torch::zeros({4});
  EXPECT_CONTAINS(testing::error_message([&] { write_png_grid(dir / "x.png", {{{a, {}}, {b, {}}}}); }), "one shape");
  EXPECT_CONTAINS(testing::error_message([&] { write_png_grid(dir / "x.png", {{{flat, {}}}}); }), "[C, H, W]");
  EXPECT_CONTAINS(testing::error_message([&] { write_png_grid(dir / "x.png", {{}}); }), "no images");
  EXPECT_FALSE(std::filesystem::exists(dir / "x.png"));
}

}  // namespace
}  // namespace pathkernel

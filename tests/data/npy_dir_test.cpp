// Tests of the npy:DIR dataset (src/data/npy_dir.cpp) with coded arrays: an
// input of at most 256 distinct values stored as NAME.codes.npy (uint8) and
// NAME.values.npy, as the recorder writes it; and the checks of the inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "../test_util.h"
#include "pathkernel/dataset.h"
#include "pathkernel/error.h"
#include "pathkernel/npy.h"
#include "pathkernel/npy_array.h"

namespace pathkernel {
namespace {

using testing::error_message;
using testing::TempDir;

/// Images of 8-bit pixels as a loop feeds them: float32 k / 255.
torch::Tensor pixels(int64_t n, uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randint(0, 256, {n, 1, 4, 4}, torch::kLong).to(torch::kFloat32) / 255.0f;
}

/// Stores `a` as the pair NAME.codes.npy and NAME.values.npy.
void save_coded(const TempDir& dir, const std::string& name, const torch::Tensor& a) {
  auto [table, inverse, counts] = torch::_unique2(a.reshape(-1), /*sorted=*/true, /*return_inverse=*/true);
  (void)counts;
  ASSERT_LE(table.size(0), 256);
  write_npy(dir / (name + ".codes.npy"), inverse.to(torch::kUInt8).reshape(a.sizes()));
  write_npy(dir / (name + ".values.npy"), table);
}

TEST(NpyDirCoded, ReadsThePairAsThePlainArrays) {
  TempDir plain("plain"), coded("coded");
  const torch::Tensor x = pixels(50, 1), xt = pixels(7, 2);
  const torch::Tensor y = torch::arange(50, torch::kLong) % 3, yt = torch::arange(7, torch::kLong) % 3;
  for (const TempDir* d : {&plain, &coded}) {
    write_npy(*d / "train_y.npy", y);
    write_npy(*d / "test_y.npy", yt);
  }
  write_npy(plain / "train_x.npy", x);
  write_npy(plain / "test_x.npy", xt);
  save_coded(coded, "train_x", x);
  save_coded(coded, "test_x", xt);
  DataOptions o;
  o.spec = "npy:" + plain.path();
  const Dataset a = load_dataset(o);
  o.spec = "npy:" + coded.path();
  const Dataset b = load_dataset(o);
  EXPECT_TRUE(torch::equal(a.x_train, b.x_train));
  EXPECT_TRUE(torch::equal(a.x_test, b.x_test));
  EXPECT_TRUE(torch::equal(b.x_train, x.to(b.x_train.scalar_type())));
  EXPECT_EQ(a.input_shape, b.input_shape);
  EXPECT_EQ(b.source.at("files"), (nlohmann::json{"train_x.codes.npy", "train_x.values.npy", "train_y.npy",
                                                   "test_x.codes.npy", "test_x.values.npy", "test_y.npy"}));
}

TEST(NpyDirCoded, ABrokenPairIsAClearErrorNamingTheDataset) {
  TempDir dir;
  write_npy(dir / "train_y.npy", torch::zeros({5}, torch::kLong));
  write_npy(dir / "test_y.npy", torch::zeros({0}, torch::kLong));
  write_npy(dir / "test_x.npy", torch::zeros({0, 1, 4, 4}, torch::kFloat32));
  save_coded(dir, "train_x", pixels(5, 3));
  DataOptions o;
  o.spec = "npy:" + dir.path();
  EXPECT_EQ(load_dataset(o).x_train.size(0), 5);
  std::filesystem::remove(dir / "train_x.values.npy");
  const std::string e = error_message([&] { load_dataset(o); });
  EXPECT_CONTAINS(e, "dataset 'npy:" + dir.path() + "'");
  EXPECT_CONTAINS(e, "train_x.codes.npy but not train_x.values.npy");
  std::filesystem::remove(dir / "train_x.codes.npy");
  EXPECT_CONTAINS(error_message([&] { load_dataset(o); }), "missing train_x.npy");
}

TEST(NpyDir, RefusesInputsThatAreNotFiniteOrTooLargeNamingTheArray) {
  TempDir dir;
  write_npy(dir / "train_y.npy", torch::zeros({5}, torch::kLong));
  write_npy(dir / "test_y.npy", torch::zeros({0}, torch::kLong));
  DataOptions o;
  o.spec = "npy:" + dir.path();
  const double bad_values[] = {std::nan(""), std::numeric_limits<double>::infinity(),
                               -std::numeric_limits<double>::infinity()};
  for (auto dtype : {torch::kFloat64, torch::kFloat32}) {
    write_npy(dir / "test_x.npy", torch::zeros({0, 1, 4, 4}, dtype));
    for (double bad : bad_values) {
      torch::Tensor x = torch::rand({5, 1, 4, 4}, torch::kFloat64).to(dtype);
      write_npy(dir / "train_x.npy", x);
      EXPECT_EQ(load_dataset(o).x_train.size(0), 5) << dtype;
      x[4][0][3][3] = bad;  // the last value: a check that stops short misses it
      write_npy(dir / "train_x.npy", x);
      EXPECT_CONTAINS(error_message([&] { load_dataset(o); }),
                      "train_x.npy holds a value that is not finite (NaN or infinite)");
    }
  }
  // A coded array's NaN is found in the decoded array.
  std::filesystem::remove(dir / "train_x.npy");
  torch::Tensor codes = torch::zeros({5, 1, 4, 4}, torch::kUInt8);
  codes[3][0][2][1] = 2;
  write_npy(dir / "train_x.codes.npy", codes);
  write_npy(dir / "train_x.values.npy", torch::tensor({0.0f, 0.5f, std::nanf("")}));
  EXPECT_CONTAINS(error_message([&] { load_dataset(o); }), "train_x.npy holds a value that is not finite");
  std::filesystem::remove(dir / "train_x.codes.npy");
  std::filesystem::remove(dir / "train_x.values.npy");
  // Integer codes: |x| < 2^53, by the smallest value as well as the largest.
  write_npy(dir / "test_x.npy", torch::zeros({0, 3}, torch::kLong));
  for (int64_t bad : {int64_t(1) << 53, -(int64_t(1) << 53)}) {
    torch::Tensor x = torch::ones({5, 3}, torch::kLong);
    x[2][1] = bad;
    write_npy(dir / "train_x.npy", x);
    EXPECT_CONTAINS(error_message([&] { load_dataset(o); }), "train_x.npy holds the integer 9.0072e+15");
  }
}

}  // namespace
}  // namespace pathkernel

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
#include "pathkernel/manifest.h"
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

TEST(NpyDirCoded, TrainingInputsAreHeldAsCodesWhereAskedWithTheDecodedBits) {
  TempDir dir;
  const int64_t n = 60;
  const torch::Tensor x = pixels(n, 4), y = torch::arange(n, torch::kLong) % 3;
  save_coded(dir, "train_x", x);
  ASSERT_LT(read_npy(dir / "train_x.values.npy").size(0), 256);  // the table is padded to a value per code
  write_npy(dir / "train_y.npy", y);
  write_npy(dir / "test_x.npy", pixels(4, 5));
  write_npy(dir / "test_y.npy", torch::arange(4, torch::kLong) % 3);
  for (auto dtype : {torch::kFloat64, torch::kFloat32}) {
    for (int64_t size : {int64_t(-1), int64_t(30)}) {
      DataOptions o;
      o.spec = "npy:" + dir.path();
      o.dtype = dtype;
      o.train_size = size;
      const Dataset whole = load_dataset(o);
      o.coded_inputs = true;
      const Dataset coded = load_dataset(o);
      ASSERT_TRUE(coded.x_train_coded.defined()) << dtype << " " << size;
      EXPECT_FALSE(coded.x_train.defined());
      EXPECT_EQ(train_count(coded), whole.x_train.size(0));
      EXPECT_TRUE(torch::equal(coded.y_train, whole.y_train));
      EXPECT_EQ(coded.input_shape, whole.input_shape);
      const torch::Tensor all = train_inputs(coded, torch::Tensor());
      EXPECT_EQ(all.scalar_type(), dtype);
      EXPECT_TRUE(torch::equal(all, whole.x_train)) << dtype << " " << size;
      const torch::Tensor some = torch::tensor({7, 0, 7, 29}, torch::kLong);
      EXPECT_TRUE(torch::equal(train_inputs(coded, some), whole.x_train.index_select(0, some)));
      EXPECT_EQ(training_data_crc32(coded), training_data_crc32(whole));
    }
  }
  // Integer codes (token ids) are read whole, asked or not.
  TempDir tokens("tokens");
  save_coded(tokens, "train_x", torch::randint(0, 9, {n, 5}, torch::kLong));
  write_npy(tokens / "train_y.npy", y);
  write_npy(tokens / "test_x.npy", torch::zeros({2, 5}, torch::kLong));
  write_npy(tokens / "test_y.npy", torch::zeros({2}, torch::kLong));
  DataOptions o;
  o.spec = "npy:" + tokens.path();
  o.coded_inputs = true;
  const Dataset t = load_dataset(o);
  EXPECT_TRUE(t.integer_inputs);
  EXPECT_FALSE(t.x_train_coded.defined());
  EXPECT_EQ(t.x_train.size(0), n);
}

TEST(NpyDirCoded, TestInputsAreHeldAsCodesWhereAskedWithTheDecodedBits) {
  TempDir dir;
  const torch::Tensor xt = pixels(12, 6), yt = torch::arange(12, torch::kLong) % 3;
  write_npy(dir / "train_x.npy", pixels(9, 7));
  write_npy(dir / "train_y.npy", torch::arange(9, torch::kLong) % 3);
  save_coded(dir, "test_x", xt);
  write_npy(dir / "test_y.npy", yt);
  for (auto dtype : {torch::kFloat64, torch::kFloat32}) {
    for (int64_t size : {int64_t(-1), int64_t(6)}) {
      DataOptions o;
      o.spec = "npy:" + dir.path();
      o.dtype = dtype;
      o.test_size = size;
      const Dataset whole = load_dataset(o);
      o.coded_inputs = true;
      const Dataset coded = load_dataset(o);
      ASSERT_TRUE(coded.x_test_coded.defined()) << dtype << " " << size;
      EXPECT_FALSE(coded.x_test.defined());
      EXPECT_FALSE(coded.x_train_coded.defined()) << "train_x.npy is read whole";
      EXPECT_EQ(test_count(coded), whole.x_test.size(0));
      EXPECT_EQ(input_dtype(coded), dtype);
      EXPECT_TRUE(torch::equal(coded.y_test, whole.y_test));
      EXPECT_TRUE(torch::equal(test_inputs(coded, torch::Tensor()), whole.x_test)) << dtype << " " << size;
      const torch::Tensor some = torch::tensor({5, 0, 5}, torch::kLong);
      EXPECT_TRUE(torch::equal(test_inputs(coded, some), whole.x_test.index_select(0, some)));
      EXPECT_TRUE(torch::equal(test_input(coded, 3), whole.x_test[3]));
    }
  }
}

TEST(NpyDirCoded, CodesOutOfTheirTableAreRefusedBeforeTheyAreHeld) {
  TempDir dir;
  write_npy(dir / "train_y.npy", torch::zeros({5}, torch::kLong));
  write_npy(dir / "test_y.npy", torch::zeros({0}, torch::kLong));
  write_npy(dir / "test_x.npy", torch::zeros({0, 1, 4, 4}, torch::kFloat32));
  torch::Tensor codes = torch::zeros({5, 1, 4, 4}, torch::kUInt8);
  codes[4][0][3][3] = 3;  // the last code: a check that stops short misses it
  write_npy(dir / "train_x.codes.npy", codes);
  write_npy(dir / "train_x.values.npy", torch::tensor({0.0f, 0.5f, 1.0f}));
  DataOptions o;
  o.spec = "npy:" + dir.path();
  o.coded_inputs = true;
  const std::string e = error_message([&] { load_dataset(o); });
  EXPECT_CONTAINS(e, "dataset 'npy:" + dir.path() + "'");
  EXPECT_CONTAINS(e, "code 3 is out of range of the table of 3 values");
  EXPECT_CONTAINS(error_message([&] { read_npy_coded(dir.path(), "train_y"); }), "expected the pair");
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
  // A coded array's NaN is found in its table.
  std::filesystem::remove(dir / "train_x.npy");
  torch::Tensor codes = torch::zeros({5, 1, 4, 4}, torch::kUInt8);
  codes[3][0][2][1] = 2;
  write_npy(dir / "train_x.codes.npy", codes);
  write_npy(dir / "train_x.values.npy", torch::tensor({0.0f, 0.5f, std::nanf("")}));
  EXPECT_CONTAINS(error_message([&] { load_dataset(o); }), "train_x.values.npy holds a value that is not finite");
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

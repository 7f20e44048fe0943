// Inputs from a file (input_file.h): what is accepted, and a clear error,
// naming the file, the value and what was expected, for everything else.
#include <gtest/gtest.h>

#include <limits>

#include "../test_util.h"
#include "pathkernel/input_file.h"
#include "pathkernel/npy.h"

namespace pathkernel {
namespace {

/// A dataset of inputs [*, 2, 3] and 3 classes, real-valued or integer codes.
Dataset dataset(bool integer, bool regression = false) {
  Dataset d;
  d.input_shape = {2, 3};
  d.num_classes = 3;
  d.integer_inputs = integer;
  d.x_train = torch::zeros({4, 2, 3}, torch::kFloat64);
  d.x_test = torch::zeros({2, 2, 3}, torch::kFloat64);
  d.y_train = regression ? torch::zeros({4, 3}, torch::kFloat64) : torch::zeros({4}, torch::kLong);
  return d;
}

class InputFile : public ::testing::Test {
 protected:
  /// Writes t as DIR/name and returns its path.
  std::string save(const std::string& name, const torch::Tensor& t) {
    const std::string path = dir_ / name;
    write_npy(path, t);
    return path;
  }
  /// The error of reading t as inputs of data.
  std::string inputs_error(const torch::Tensor& t, const Dataset& data) {
    const std::string path = save("x.npy", t);
    return testing::error_message([&] { read_inputs(path, data); });
  }
  std::string labels_error(const torch::Tensor& t, const Dataset& data, int64_t n) {
    const std::string path = save("y.npy", t);
    return testing::error_message([&] { read_input_labels(path, data, n); });
  }
  testing::TempDir dir_{"inputs"};
};

TEST_F(InputFile, ReadsInputsOfTheRunsShapeAndDtype) {
  const torch::Tensor x = torch::randn({5, 2, 3}, torch::kFloat64);
  EXPECT_TRUE(torch::equal(read_inputs(save("x.npy", x), dataset(false)), x));
  // float32 values are float64 values.
  const torch::Tensor x32 = torch::randn({1, 2, 3}, torch::kFloat32);
  EXPECT_TRUE(torch::equal(read_inputs(save("x32.npy", x32), dataset(false)), x32.to(torch::kFloat64)));
  // Token ids for a model on integer codes, held as the run's inputs are.
  const torch::Tensor ids = torch::randint(0, 50, {3, 2, 3}, torch::kLong);
  EXPECT_TRUE(torch::equal(read_inputs(save("ids.npy", ids), dataset(true)), ids.to(torch::kFloat64)));
  const torch::Tensor y = torch::tensor({0, 2, 1}, torch::kInt);
  EXPECT_TRUE(torch::equal(read_input_labels(save("y.npy", y), dataset(false), 3), y.to(torch::kLong)));
  const torch::Tensor t = torch::randn({3, 3}, torch::kFloat32);
  EXPECT_TRUE(torch::equal(read_input_labels(save("t.npy", t), dataset(false, true), 3), t.to(torch::kFloat64)));
}

TEST_F(InputFile, BadInputsGetClearErrors) {
  const Dataset real = dataset(false), codes = dataset(true);
  std::string e = inputs_error(torch::zeros({5, 3, 2}, torch::kFloat64), real);
  EXPECT_CONTAINS(e, "x.npy");
  EXPECT_CONTAINS(e, "has shape [5, 3, 2], expected [n, 2, 3]");
  EXPECT_CONTAINS(inputs_error(torch::zeros({2, 3}, torch::kFloat64), real), "has shape [2, 3], expected [n, 2, 3]");
  EXPECT_CONTAINS(inputs_error(torch::zeros({0, 2, 3}, torch::kFloat64), real), "no inputs, expected n >= 1");
  EXPECT_CONTAINS(inputs_error(torch::zeros({1, 2, 3}, torch::kLong), real),
                  "has dtype Long, expected floating-point inputs");
  EXPECT_CONTAINS(inputs_error(torch::zeros({1, 2, 3}, torch::kFloat64), codes),
                  "has dtype Double, expected integer codes (int64 or int32)");
  torch::Tensor nan = torch::zeros({2, 2, 3}, torch::kFloat64);
  nan[1][0][2] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_CONTAINS(inputs_error(nan, real), "holds nan at flat position 8, expected finite values");
  torch::Tensor inf = torch::zeros({1, 2, 3}, torch::kFloat32);
  inf[0][1][1] = std::numeric_limits<float>::infinity();
  EXPECT_CONTAINS(inputs_error(inf, real), "holds inf at flat position 4");
  // A float32 run holds its inputs in float32.
  Dataset single = real;
  single.x_test = single.x_test.to(torch::kFloat32);
  EXPECT_CONTAINS(inputs_error(torch::full({1, 2, 3}, 0.1, torch::kFloat64), single),
                  "that the run's Float inputs do not hold exactly");
  EXPECT_CONTAINS(testing::error_message([&] { read_inputs(dir_ / "missing.npy", real); }),
                  "inputs file '" + (dir_ / "missing.npy") + "' does not exist");
  const std::string junk = dir_.write("junk.npy", "not an npy file");
  EXPECT_CONTAINS(testing::error_message([&] { read_inputs(junk, real); }), "junk.npy");
}

TEST_F(InputFile, BadLabelsGetClearErrors) {
  const Dataset classes = dataset(false), targets = dataset(false, true);
  EXPECT_CONTAINS(labels_error(torch::zeros({4}, torch::kLong), classes, 3),
                  "has shape [4], expected [3] (a label per input)");
  EXPECT_CONTAINS(labels_error(torch::zeros({3, 1}, torch::kLong), classes, 3), "has shape [3, 1], expected [3]");
  EXPECT_CONTAINS(labels_error(torch::zeros({3}, torch::kFloat64), classes, 3),
                  "has dtype Double, expected integer class labels");
  EXPECT_CONTAINS(labels_error(torch::tensor({0, 3, 1}, torch::kLong), classes, 3),
                  "holds labels in [0, 3], expected class numbers in [0, 3)");
  EXPECT_CONTAINS(labels_error(torch::tensor({0, -1, 1}, torch::kLong), classes, 3), "holds labels in [-1, 1]");
  EXPECT_CONTAINS(labels_error(torch::zeros({3, 2}, torch::kFloat64), targets, 3),
                  "has shape [3, 2], expected [3, 3] (a target per input)");
  EXPECT_CONTAINS(labels_error(torch::zeros({3}, torch::kLong), targets, 3), "expected float regression targets [n, 3]");
  torch::Tensor nan = torch::zeros({3, 3}, torch::kFloat64);
  nan[2][2] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_CONTAINS(labels_error(nan, targets, 3), "holds nan at flat position 8, expected finite targets");
}

}  // namespace
}  // namespace pathkernel

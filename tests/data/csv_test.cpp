// Tests of read_csv and the "csv:PATH" dataset: parsing, headers, malformed
// rows named by line, and the per-class train/test split.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "pathkernel/dataset.h"
#include "pathkernel/error.h"
#include "../test_util.h"

namespace {

namespace fs = std::filesystem;
using pathkernel::Dataset;
using pathkernel::read_csv;

using pathkernel::testing::error_message;
using pathkernel::testing::TempDir;

Dataset load_csv_dataset(const std::string& path) {
  pathkernel::DataOptions options;
  options.spec = "csv:" + path;
  return pathkernel::load_dataset(options);
}

TEST(Csv, ReadsHeaderAndRows) {
  TempDir dir;
  const std::string path = dir.write("h.csv", "label,a,b\n2,0.5,-1\n0,3,4e2\n");
  const auto [x, y] = read_csv(path);
  EXPECT_EQ(x.scalar_type(), torch::kFloat64);
  EXPECT_EQ(y.scalar_type(), torch::kLong);
  EXPECT_TRUE(torch::equal(x, torch::tensor({0.5, -1.0, 3.0, 400.0}, torch::kFloat64).view({2, 2})));
  EXPECT_TRUE(torch::equal(y, torch::tensor({2, 0}, torch::kLong)));
}

TEST(Csv, NoHeaderSpacesCrlfAndBlankLines) {
  TempDir dir;
  const std::string path = dir.write("n.csv", "1, +1.5 ,-2e-1\r\n\r\n 0 ,\t.25,7\r\n\n");
  const auto [x, y] = read_csv(path);
  EXPECT_TRUE(torch::equal(x, torch::tensor({1.5, -0.2, 0.25, 7.0}, torch::kFloat64).view({2, 2})));
  EXPECT_TRUE(torch::equal(y, torch::tensor({1, 0}, torch::kLong)));
}

TEST(Csv, WrongFieldCountNamesLine) {
  TempDir dir;
  const std::string path =
      dir.write("x.csv", "0,1,2,3,4\n1,1,2,3,4\n2,1,2,3,4\n0,1,2,3,4\n1,1,2,3,4\n2,1,2,3,4\n0,1,2,3\n");
  EXPECT_EQ(error_message([&] { read_csv(path); }),
            "malformed CSV '" + path + "' line 7: expected 5 fields (as on line 1), got 4");
  // A header sets the count too.
  const std::string with_header = dir.write("hdr.csv", "y,a,b\n0,1,2\n1,1,2,3\n");
  EXPECT_CONTAINS(error_message([&] { read_csv(with_header); }),
                  "line 3: expected 3 fields (as on line 1), got 4");
}

TEST(Csv, NonNumericFieldNamesLineAndField) {
  TempDir dir;
  const std::string path = dir.write("nn.csv", "0,1,2\n1,3,4\n0,5,abc\n");
  EXPECT_EQ(error_message([&] { read_csv(path); }),
            "malformed CSV '" + path + "' line 3: field 3 'abc' is not a number");
  const std::string empty_field = dir.write("ef.csv", "0,1,2\n1,,4\n");
  EXPECT_CONTAINS(error_message([&] { read_csv(empty_field); }), "line 2: field 2 '' is not a number");
  const std::string inf = dir.write("inf.csv", "0,1,2\n1,inf,4\n");
  EXPECT_CONTAINS(error_message([&] { read_csv(inf); }), "line 2: field 2 'inf' is not finite");
}

TEST(Csv, BadLabelsNameLine) {
  TempDir dir;
  const std::string negative = dir.write("neg.csv", "0,1\n-1,2\n");
  EXPECT_CONTAINS(error_message([&] { read_csv(negative); }),
                  "line 2: label -1 is negative, expected an integer >= 0");
  // A negative first label is a number, so line 1 is data, not a header.
  const std::string negative_first = dir.write("neg1.csv", "-3,1\n0,2\n");
  EXPECT_CONTAINS(error_message([&] { read_csv(negative_first); }), "line 1: label -3 is negative");
  const std::string fractional = dir.write("frac.csv", "0,1\n1.5,2\n");
  EXPECT_CONTAINS(error_message([&] { read_csv(fractional); }), "line 2: label '1.5' is not an integer");
  // An absurd label would size the output layer: refused (class count <= 65536).
  const std::string huge = dir.write("huge.csv", "0,1\n2147483647,2\n");
  EXPECT_CONTAINS(error_message([&] { read_csv(huge); }), "line 2: label 2147483647 is too large (at most 65535");
  EXPECT_NO_THROW(read_csv(dir.write("max.csv", "0,1\n65535,2\n")));
  const std::string word = dir.write("word.csv", "label,x\n0,1\ncat,2\n");
  EXPECT_CONTAINS(error_message([&] { read_csv(word); }), "line 3: label 'cat' is not a number");
}

TEST(Csv, EmptyHeaderOnlyAndMissingFilesRejected) {
  TempDir dir;
  const std::string empty = dir.write("empty.csv", "");
  EXPECT_CONTAINS(error_message([&] { read_csv(empty); }), "is empty");
  const std::string blank = dir.write("blank.csv", "\n  \n");
  EXPECT_CONTAINS(error_message([&] { read_csv(blank); }), "is empty");
  const std::string header_only = dir.write("header.csv", "label,a,b\n");
  EXPECT_CONTAINS(error_message([&] { read_csv(header_only); }), "has no data rows");
  const std::string one_field = dir.write("one.csv", "3\n4\n");
  EXPECT_CONTAINS(error_message([&] { read_csv(one_field); }),
                  "line 1: expected at least 2 fields");
  const std::string absent = dir.write("x", "") + ".absent.csv";
  EXPECT_CONTAINS(error_message([&] { load_csv_dataset(absent); }),
                  "cannot open CSV file '" + absent + "'");
}

TEST(Csv, DatasetSplitsLastFifthOfEachClassInFileOrder) {
  // Class 0: 11 rows (feature = row number 1..11) -> its last 2 go to test.
  // Class 1: 4 rows (101..104) -> floor(0.8) = 0 to test.
  // Class 2: 1 row (201) -> stays in train.
  std::string text = "label,f\n";
  std::vector<std::pair<int, int>> rows = {
      {0, 1}, {0, 2}, {1, 101}, {0, 3}, {0, 4}, {1, 102}, {0, 5},  {0, 6},
      {2, 201}, {0, 7}, {0, 8}, {1, 103}, {0, 9}, {0, 10}, {1, 104}, {0, 11}};
  for (const auto& [label, feature] : rows) {
    text += std::to_string(label) + "," + std::to_string(feature) + "\n";
  }
  TempDir dir;
  const std::string path = dir.write("split.csv", text);
  const Dataset data = load_csv_dataset(path);
  EXPECT_EQ(data.spec, "csv:" + path);
  EXPECT_EQ(data.input_shape, std::vector<int64_t>({1}));
  EXPECT_EQ(data.num_classes, 3);
  EXPECT_EQ(data.normalization, nlohmann::json({{"kind", "none"}}));
  EXPECT_EQ(data.source.at("files"), nlohmann::json::array({path}));
  const torch::Tensor expected_train_x =
      torch::tensor({1, 2, 101, 3, 4, 102, 5, 6, 201, 7, 8, 103, 9, 104}, torch::kFloat64);
  const torch::Tensor expected_train_y =
      torch::tensor({0, 0, 1, 0, 0, 1, 0, 0, 2, 0, 0, 1, 0, 1}, torch::kLong);
  EXPECT_TRUE(torch::equal(data.x_train.view({-1}), expected_train_x)) << data.x_train;
  EXPECT_TRUE(torch::equal(data.y_train, expected_train_y)) << data.y_train;
  EXPECT_TRUE(torch::equal(data.x_test.view({-1}), torch::tensor({10.0, 11.0}, torch::kFloat64)))
      << data.x_test;
  EXPECT_TRUE(torch::equal(data.y_test, torch::tensor({0, 0}, torch::kLong)));
}

TEST(Csv, NumClassesIsMaxLabelPlusOne) {
  TempDir dir;
  const std::string path = dir.write("gap.csv", "0,1,1\n4,2,2\n0,3,3\n");
  const Dataset data = load_csv_dataset(path);
  EXPECT_EQ(data.num_classes, 5);
  EXPECT_EQ(data.input_shape, std::vector<int64_t>({2}));
  EXPECT_EQ(data.x_train.sizes(), torch::IntArrayRef({3, 2}));
  EXPECT_EQ(data.x_test.sizes(), torch::IntArrayRef({0, 2}));
  ASSERT_EQ(data.warnings.size(), 1u);
  EXPECT_NE(data.warnings[0].find("3 of 5 classes have no training points (class 1, 2, 3; classes present: 0, 4)"),
            std::string::npos) << data.warnings[0];
}

TEST(Csv, WarnsAboutClassNumbersWithNoTrainingPoints) {
  TempDir dir;
  const Dataset gaps = load_csv_dataset(dir.write("gaps.csv", "0,1\n1,2\n5,3\n0,4\n1,5\n5,6\n"));
  EXPECT_EQ(gaps.num_classes, 6);
  ASSERT_EQ(gaps.warnings.size(), 1u);
  const std::string& w = gaps.warnings[0];
  EXPECT_NE(w.find("class 2, 3, 4; classes present: 0, 1, 5"), std::string::npos) << w;
  EXPECT_NE(w.find("number the classes 0..2 for 3 outputs"), std::string::npos) << w;
  const Dataset dense = load_csv_dataset(dir.write("dense.csv", "0,1\n1,2\n2,3\n"));
  EXPECT_TRUE(dense.warnings.empty()) << dense.warnings[0];
}

TEST(Csv, Float32Option) {
  TempDir dir;
  const std::string path = dir.write("f.csv", "0,0.1\n1,0.2\n0,0.3\n1,0.4\n");
  pathkernel::DataOptions options;
  options.spec = "csv:" + path;
  options.dtype = torch::kFloat32;
  const Dataset data = pathkernel::load_dataset(options);
  EXPECT_EQ(data.x_train.scalar_type(), torch::kFloat32);
  EXPECT_EQ(data.x_test.scalar_type(), torch::kFloat32);
}

}  // namespace

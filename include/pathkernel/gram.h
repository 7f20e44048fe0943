// Gram matrices of the kernels pathkernel compares (docs/math.md §6), between two
// sets of inputs, each either test points or training points:
//
//   epk     Σ_s J̄_s(x) J(w_s, x')ᵀ    for a test row x and a training column x'
//                                       (the paper's asymmetry: the test side is
//                                       integrated along each step, the training
//                                       side taken at the step's start);
//           Σ_s J(w_s, x) J(w_s, x')ᵀ for two training points
//           Σ_s ∫_0^1 J(w_s(t), x) J(w_s(t), x')ᵀ dt for two test points (the
//                                       quadrature of the product, not the
//                                       product of the averages)
//   dpk     Σ_s J(w_s, x) J(w_s, x')ᵀ (Domingos' discrete path kernel)
//   ntk[:S] J(w_S, x) J(w_S, x')ᵀ       (the empirical NTK at step S, default N)
//   ntk-inf the infinite-width NTK of a fully-connected ReLU network of the
//           run's depth (infinite_width.h), times the K x K identity
//
// The EPK's training side is the gradient training took, with the step's
// dropout masks when the network has dropout (dropout.h); the DPK, the NTK
// and every test side see the network in eval mode.
//
// Sums run over every step of the path. Blocks of rows and columns are
// contracted with the structured contractions of features.h: no per-sample
// Jacobian is formed.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pathkernel/features.h"
#include "pathkernel/path.h"

namespace pathkernel {

/// A kernel as written on the command line: a name of the registry
/// (kernel_registry()) and, for ntk:S, a step.
struct GramSpec {
  std::string name = "epk";  ///< epk, dpk, ntk or ntk-inf
  int64_t step = -1;         ///< ntk: the step S (−1: the last, N)

  /// Parses epk, dpk, ntk, ntk:S, ntk-inf. Throws Error naming a bad spec
  /// and the kernels there are.
  static GramSpec parse(const std::string& text);
  std::string str() const;
};

struct GramOptions {
  GramSpec kernel;
  QuadratureOptions quadrature;  ///< for epk's test side
  double bias_scale = 0.0;       ///< ntk-inf: β
  bool trace = false;            ///< Σ_k K[.., k, k] instead of the K x K blocks
  int64_t block = 256;           ///< rows and columns per contraction
  bool progress = true;
};

/// One kernel of the family. Each is built by name from kernel_registry();
/// gram() and gram_diagonal() ask the spec's kernel, and nothing else
/// branches on a kernel's name.
class Kernel {
 public:
  virtual ~Kernel() = default;
  /// Whether the test side is integrated along each step, so that the
  /// quadrature options (and their cost) apply.
  virtual bool integrates_test_side() const = 0;
  /// Whether the kernel is a closed form of the inputs, without the path:
  /// then a block of rows costs the same whatever its size.
  virtual bool closed_form() const = 0;
  /// The Gram blocks between `rows` [R, ...] and `cols` [C, ...]:
  /// [R, C, K, K], or [R, C] with options.trace.
  virtual torch::Tensor gram(PathReader& reader, const torch::Tensor& rows, bool rows_test,
                             const torch::Tensor& cols, bool cols_test, const GramOptions& options) const = 0;
  /// Each point of x [n, ...] with itself: [n, K, K], or [n] with trace.
  virtual torch::Tensor diagonal(PathReader& reader, const torch::Tensor& x, bool test,
                                 const GramOptions& options) const = 0;
};

/// One entry of the registry: how a kernel is written, what it is, and how
/// it is built from its spec.
struct KernelEntry {
  std::string name;     ///< as --kernel writes it
  std::string syntax;   ///< e.g. "ntk[:STEP]"
  std::string meaning;  ///< one line
  std::unique_ptr<Kernel> (*make)(const GramSpec& spec);
};

/// Every kernel pathkernel computes, in the order --help lists them.
const std::vector<KernelEntry>& kernel_registry();

/// The kernel `spec` names, from the registry.
std::unique_ptr<Kernel> make_kernel(const GramSpec& spec);

/// The Gram matrix between `rows` [R, ...] and `cols` [C, ...]; *_test says
/// whether a side is test points. Returns [R, C, K, K], or [R, C] with trace.
/// Throws Error for ntk-inf on a model that is not a ReLU MLP.
torch::Tensor gram(PathReader& reader, const torch::Tensor& rows, bool rows_test, const torch::Tensor& cols,
                   bool cols_test, const GramOptions& options);

/// The kernel of each point of x [n, ...] with itself (the diagonal of
/// gram(reader, x, test, x, test, options), without the off-diagonal
/// pairs): [n, K, K], or [n] with trace. The GP's test variances need it.
torch::Tensor gram_diagonal(PathReader& reader, const torch::Tensor& x, bool test, const GramOptions& options);

/// The scalar kernel the kernel methods (gp.h, svm_refit.h,
/// kernel_regression.h) take: the mean of the K output kernels, trace / K.
struct KernelMatrices {
  torch::Tensor train;  ///< [M, M] between the training points
  torch::Tensor cross;  ///< [n, M] query x training
  torch::Tensor self;   ///< [n] each query point with itself (when asked)
};

/// The kernel matrices of `options.kernel` (trace is implied) between
/// training points x_train [M, ...] and queries x_query [n, ...], which are
/// test points when query_test (epk integrates their side).
KernelMatrices kernel_matrices(PathReader& reader, const torch::Tensor& x_train, const torch::Tensor& x_query,
                               bool query_test, GramOptions options, bool self);

}  // namespace pathkernel

// Dropout whose masks training, replay and the decomposition all draw alike.
//
// A TorchScript module's dropout (nn.Dropout, F.dropout, torch.dropout) draws
// a fresh random mask at every call, so the gradient a training point had at
// step s could not be computed again, and the path could not be replayed.
// pathkernel rewrites every such call (aten::dropout, aten::dropout_) in the
// module's forward graph into pathkernel::dropout, whose mask is a function
// of the run's seed, the step, the dropout site and the example's own input
// values (its row of the network's input, read in float32):
//
//   keep(element e of row r) = u(seed, step, site, hash(x_r), e) >= p,
//   out = h * keep / (1 - p),
//
// with u a 53-bit uniform from a splitmix64 hash. A training point's mask at
// step s is therefore the same in the training batch, alone in the
// decomposition's per-example gradient, in any batch order and on any rank.
// Two training points with identical inputs share their mask at a step.
//
// Dropout is on only inside a DropoutStep: where a training point's gradient
// at step s is computed (training, replay, the training side of the
// decomposition and of the kernel, retraining, the metagradient). Everywhere
// else (test points, the path's outputs, evaluation) it passes its input
// through, as in eval mode. A module exported in eval mode (its `training`
// flag off) never drops anything.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include <torch/script.h>

namespace pathkernel {

/// Turns dropout on, for the calling thread, with the masks of step `step`
/// of a run whose network seed is `seed`; restores the previous state when it
/// goes out of scope.
class DropoutStep {
 public:
  DropoutStep(uint64_t seed, int64_t step);
  ~DropoutStep();
  DropoutStep(const DropoutStep&) = delete;
  DropoutStep& operator=(const DropoutStep&) = delete;

 private:
  bool active_;
  uint64_t seed_;
  int64_t step_;
};

/// Rewrites every aten::dropout and aten::dropout_ of `graph` (an inlined
/// forward graph, its input 1 the network's input) into pathkernel::dropout,
/// numbering the sites in graph order. Returns the number of sites.
int64_t seed_dropout(torch::jit::Graph& graph);

/// The first operation of `graph` (an inlined forward graph of `module`,
/// searched into its branches and loops, after seed_dropout) that draws
/// random numbers pathkernel does not seed, or nullptr. Such an operation
/// draws anew at every call, so training could not be replayed: channel
/// dropout (aten::feature_dropout, from F.dropout2d and nn.Dropout2d), alpha
/// dropout, torch.rand/randn/bernoulli and their kin. A dropout whose `train`
/// input is fixed off (a constant, or the `training` flag of a module in
/// eval mode) passes its input through and is not counted.
torch::jit::Node* unseeded_random_op(torch::jit::Graph& graph, const torch::jit::Module& module);

/// The value of `v` (a value of `graph`, an inlined forward graph of
/// `module`) where the module fixes it: a constant, or a chain of attributes
/// from the graph's `self` (a submodule's `training` flag, nn.Dropout's `p`);
/// nullopt when it is computed at run time.
std::optional<c10::IValue> fixed_value(torch::jit::Value* v, const torch::jit::Graph& graph,
                                       const torch::jit::Module& module);

/// What pathkernel::dropout multiplies `h` [n, ...] by: the mask of the
/// current DropoutStep for the rows of the network's input `x` [n, ...],
/// times 1 / (1 − p), in h's shape and dtype; undefined where it passes `h`
/// through (outside a DropoutStep, `train` false or `p` 0). A route that
/// walks dropout back by hand keeps it for the backward walk.
torch::Tensor dropout_scale(const torch::Tensor& h, double p, bool train, int64_t site, const torch::Tensor& x);

/// pathkernel::dropout itself: `h` [n, ...] with the mask of the current
/// DropoutStep for the rows of the network's input `x` [n, ...], or `h` as
/// it is outside one, or when `train` is false or `p` is 0.
torch::Tensor seeded_dropout(const torch::Tensor& h, double p, bool train, int64_t site, const torch::Tensor& x);

}  // namespace pathkernel

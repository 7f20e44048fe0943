// Max-pooling in a TorchScript module's forward, by hand (script_pool.h).
#include "pathkernel/script_pool.h"

#include <algorithm>
#include <vector>

#include "pathkernel/max_pool.h"
#include "pathkernel/script_graph.h"

namespace pathkernel {
namespace {

/// The pool's forward by max_pool_with_indices; its backward LibTorch's
/// max_pool2d_with_indices_backward with the same indices, as autograd
/// calls it after at::max_pool2d (so double backward works as it does there).
struct HandPool : torch::autograd::Function<HandPool> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, int64_t k) {
    auto [out, index] = max_pool_with_indices(x.detach(), k);
    ctx->save_for_backward({x, index});
    ctx->saved_data["k"] = k;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const int64_t k = ctx->saved_data["k"].toInt();
    return {at::max_pool2d_with_indices_backward(grad[0], saved[0], {k, k}, {k, k}, {0, 0}, {1, 1}, false, saved[1]),
            torch::Tensor()};
  }
};

bool all_equal(c10::IntArrayRef values, int64_t v) {
  return std::all_of(values.begin(), values.end(), [v](int64_t x) { return x == v; });
}

}  // namespace

int64_t hand_pool_window(const torch::Tensor& self, c10::IntArrayRef kernel_size, c10::IntArrayRef stride,
                         c10::IntArrayRef padding, c10::IntArrayRef dilation, bool ceil_mode) {
  if (!pooled_by_hand(self) || self.dim() != 4 || ceil_mode) return 0;
  if (kernel_size.empty() || kernel_size.size() > 2) return 0;
  const int64_t k = kernel_size[0];
  const bool windows = k >= 1 && all_equal(kernel_size, k) && (stride.empty() || (stride.size() <= 2 && all_equal(stride, k)));
  const bool plain = all_equal(padding, 0) && all_equal(dilation, 1) && padding.size() <= 2 && dilation.size() <= 2;
  return windows && plain && self.size(2) >= k && self.size(3) >= k ? k : 0;
}

torch::Tensor script_max_pool2d(const torch::Tensor& self, c10::IntArrayRef kernel_size, c10::IntArrayRef stride,
                                c10::IntArrayRef padding, c10::IntArrayRef dilation, bool ceil_mode) {
  const int64_t k = hand_pool_window(self, kernel_size, stride, padding, dilation, ceil_mode);
  if (k == 0) return at::max_pool2d(self, kernel_size, stride, padding, dilation, ceil_mode);
  return HandPool::apply(self, k);
}

int64_t hand_pools(torch::jit::Graph& graph) {
  const c10::Symbol libtorch = c10::Symbol::fromQualString("aten::max_pool2d"),
                   own = c10::Symbol::fromQualString("pathkernel::max_pool2d");
  const std::vector<torch::jit::Node*> found = nodes_of_kinds(graph, {libtorch});
  for (torch::jit::Node* n : found) {
    torch::jit::WithInsertPoint guard(n);
    const std::vector<torch::jit::Value*> args(n->inputs().begin(), n->inputs().end());
    torch::jit::Value* out = graph.insert(own, {args[0], args[1], args[2], args[3], args[4], args[5]});
    out->setType(n->output()->type());
    n->output()->replaceAllUsesWith(out);
    n->destroy();
  }
  return static_cast<int64_t>(found.size());
}

}  // namespace pathkernel

TORCH_LIBRARY_FRAGMENT(pathkernel, m) {
  m.def("max_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, int[2] dilation=1, "
        "bool ceil_mode=False) -> Tensor",
        &pathkernel::script_max_pool2d);
}

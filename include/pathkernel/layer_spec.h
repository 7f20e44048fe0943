// Networks written as a list of layers, without Python: the "layers:" model
// spec. pathkernel compiles the list into a TorchScript module, so such a
// network goes through the same engine as a user's exported module (the
// structured route of script_graph.h, or the generic route).
//
//   layers:L1,L2,...        the layers in order, then a final linear layer to
//                           the classes (after flattening, when needed)
//   linear(OUT)             fully connected on the last dimension
//   conv(OUT,K[,stride=S][,padding=P][,dilation=D][,groups=G])
//                           2-D convolution, K x K kernel (PyTorch's defaults:
//                           stride 1, padding 0, dilation 1, groups 1)
//   relu | leakyrelu[(SLOPE)] | tanh | gelu | sigmoid | silu | softplus
//   maxpool(K[,S]) | avgpool(K[,S])   2-D pooling, window K, stride S (default K)
//   gap                     global average pooling: [C,H,W] -> [C]
//   flatten                 every per-example dimension into one
//   layernorm               normalises the last dimension, with a learned
//                           scale and shift
//   embed(VOCAB,DIM)        token ids (integer inputs) -> vectors; first layer
//   dropout(P)              drops each element with probability P while a
//                           training point's gradient is taken, with masks
//                           seeded by the run, the step and the example
//                           (dropout.h); passes its input through otherwise
//   res(L1,L2,...)          a residual block: x + block(x), the block keeping
//                           the shape of x
// e.g. "layers:conv(8,3,padding=1),relu,res(conv(8,3,padding=1),relu),avgpool(2)"
// or   "layers:embed(23,32),flatten,linear(64),gelu".
//
// Parameters are initialised as PyTorch initialises the same layers (Linear
// and Conv2d: Kaiming-uniform with a = sqrt(5) and a uniform bias; Embedding:
// standard normal; LayerNorm: ones and zeros), drawn in float32 from the
// global torch seed as PyTorch draws them, then held in float64.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/script.h>

namespace pathkernel {

/// Checks a layer list's grammar (the part after "layers:"); throws Error
/// naming the bad layer, what was wrong and the grammar.
void check_layer_list(const std::string& layers);

/// The TorchScript module of a layer list for per-example inputs of
/// `input_shape` (integer codes when `integer_inputs`) and `num_classes`
/// outputs, with float64 parameters drawn from the global torch seed.
/// Throws Error when a layer does not fit the shape it receives.
torch::jit::Module build_layer_module(const std::string& layers, const std::vector<int64_t>& input_shape,
                                      int64_t num_classes, bool integer_inputs);

}  // namespace pathkernel

// Dropout with masks that training, replay and the decomposition draw alike.
#include "pathkernel/dropout.h"

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/library.h>

#include "pathkernel/error.h"
#include "pathkernel/script_graph.h"

namespace pathkernel {

namespace {

struct DropoutState {
  bool active = false;
  uint64_t seed = 0;
  int64_t step = 0;
};

/// Per thread: retraining trains several networks at once, one per thread.
thread_local DropoutState current;

/// splitmix64's finaliser: a bijection of 64-bit words that mixes every bit.
uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// A hash of each row of the network's input, from its values in float32:
/// the same for a float32 and a float64 copy of the data.
std::vector<uint64_t> row_hashes(const torch::Tensor& x) {
  const torch::Tensor v = x.detach().reshape({x.size(0), -1}).to(torch::kFloat32).contiguous();
  const int64_t rows = v.size(0), cols = v.size(1);
  const float* data = v.data_ptr<float>();
  std::vector<uint64_t> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    uint64_t h = mix(static_cast<uint64_t>(cols));
    for (int64_t c = 0; c < cols; ++c) {
      float value = data[r * cols + c];
      if (value == 0.0f) value = 0.0f;  // -0 and +0 are the same input
      uint32_t bits = 0;
      std::memcpy(&bits, &value, sizeof bits);
      h = mix(h ^ bits);
    }
    out[static_cast<size_t>(r)] = h;
  }
  return out;
}

c10::Symbol symbol(const char* name) { return c10::Symbol::fromQualString(name); }

}  // namespace

DropoutStep::DropoutStep(uint64_t seed, int64_t step)
    : active_(current.active), seed_(current.seed), step_(current.step) {
  current = {true, seed, step};
}

DropoutStep::~DropoutStep() { current = {active_, seed_, step_}; }

torch::Tensor dropout_scale(const torch::Tensor& h, double p, bool train, int64_t site, const torch::Tensor& x) {
  PK_CHECK(p >= 0 && p <= 1, "dropout probability " << p << " is outside [0, 1]");
  if (!train || !current.active || p == 0) return torch::Tensor();
  PK_CHECK(h.dim() >= 1 && x.dim() >= 1 && h.size(0) == x.size(0),
           "dropout site " << site << ": its input has shape " << h.sizes() << " but the network's input has "
                           << x.size(0) << " rows; pathkernel draws each example's mask from its own input row, "
                           << "so the first dimension of a dropped tensor must be the batch");
  if (p == 1) return torch::zeros_like(h);
  const std::vector<uint64_t> rows = row_hashes(x);
  const int64_t n = h.size(0), per_row = h.numel() / std::max<int64_t>(n, 1);
  torch::Tensor mask = torch::empty({n, per_row}, h.options().dtype(torch::kFloat64).requires_grad(false));
  double* m = mask.data_ptr<double>();
  const double scale = 1.0 / (1.0 - p);
  const uint64_t base = mix(mix(mix(current.seed) ^ static_cast<uint64_t>(current.step)) ^ static_cast<uint64_t>(site));
  for (int64_t r = 0; r < n; ++r) {
    const uint64_t key = mix(base ^ rows[static_cast<size_t>(r)]);
    for (int64_t e = 0; e < per_row; ++e) {
      const double u = static_cast<double>(mix(key + static_cast<uint64_t>(e)) >> 11) * 0x1.0p-53;
      m[r * per_row + e] = u >= p ? scale : 0.0;
    }
  }
  return mask.view(h.sizes()).to(h.scalar_type());
}

torch::Tensor seeded_dropout(const torch::Tensor& h, double p, bool train, int64_t site, const torch::Tensor& x) {
  const torch::Tensor scale = dropout_scale(h, p, train, site, x);
  return scale.defined() ? h * scale : h;
}

int64_t seed_dropout(torch::jit::Graph& graph) {
  PK_CHECK(graph.inputs().size() >= 2, "a module's forward graph has no input to draw dropout masks from");
  torch::jit::Value* x = graph.inputs()[1];
  const c10::Symbol dropout = symbol("aten::dropout"), dropout_ = symbol("aten::dropout_"),
                   seeded = symbol("pathkernel::dropout");
  const std::vector<torch::jit::Node*> found = nodes_of_kinds(graph, {dropout, dropout_});
  int64_t site = 0;
  for (torch::jit::Node* n : found) {
    torch::jit::WithInsertPoint guard(n);
    torch::jit::Value* s = graph.insertConstant(site++);
    torch::jit::Value* out = graph.insert(seeded, {n->input(0), n->input(1), n->input(2), s, x});
    if (n->kind() == dropout_) n->input(0)->replaceAllUsesAfterNodeWith(n, out);  // in place: later reads see it
    n->output()->replaceAllUsesWith(out);
    n->destroy();
  }
  return site;
}

std::optional<c10::IValue> fixed_value(torch::jit::Value* v, const torch::jit::Graph& graph,
                                       const torch::jit::Module& module) {
  if (const auto c = torch::jit::toIValue(v)) return *c;  // c10::optional: IValue would take it as None
  std::vector<std::string> names;
  while (v->node()->kind() == c10::prim::GetAttr) {
    names.push_back(v->node()->s(c10::attr::name));
    v = v->node()->input(0);
  }
  if (names.empty() || graph.inputs().empty() || v != graph.inputs()[0]) return std::nullopt;
  c10::IValue object(module._ivalue());
  for (auto name = names.rbegin(); name != names.rend(); ++name) {
    if (!object.isObject() || !object.toObjectRef().type()->hasAttribute(*name)) return std::nullopt;
    object = object.toObjectRef().getAttr(*name);
  }
  return object;
}

namespace {

/// The value of boolean `v` when the module fixes it (fixed_value).
std::optional<bool> fixed_bool(torch::jit::Value* v, const torch::jit::Graph& graph, const torch::jit::Module& module) {
  const std::optional<c10::IValue> value = fixed_value(v, graph, module);
  if (value && value->isBool()) return value->toBool();
  return std::nullopt;
}

}  // namespace

torch::jit::Node* unseeded_random_op(torch::jit::Graph& graph, const torch::jit::Module& module) {
  std::vector<torch::jit::Block*> blocks{graph.block()};
  while (!blocks.empty()) {
    torch::jit::Block* b = blocks.back();
    blocks.pop_back();
    for (torch::jit::Node* n : b->nodes()) {
      for (torch::jit::Block* inner : n->blocks()) blocks.push_back(inner);
      if (!n->isNondeterministic()) continue;
      // A dropout whose `train` is fixed off passes its input through.
      const c10::optional<int> at = n->maybeSchema() ? n->schema().argumentIndexWithName("train") : c10::nullopt;
      if (at && static_cast<size_t>(*at) < n->inputs().size() && fixed_bool(n->input(*at), graph, module) == false) {
        continue;
      }
      return n;
    }
  }
  return nullptr;
}

}  // namespace pathkernel

TORCH_LIBRARY(pathkernel, m) {
  m.def("dropout(Tensor input, float p, bool train, int site, Tensor x) -> Tensor", &pathkernel::seeded_dropout);
}

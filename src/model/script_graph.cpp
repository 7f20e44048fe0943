// Reading a TorchScript module's forward graph as parameterised operations,
// and rewriting it to evaluate rows at their own points of a segment.
#include "pathkernel/script_graph.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

#include "pathkernel/dropout.h"
#include "pathkernel/error.h"
#include "pathkernel/layer_table.h"

namespace pathkernel {

namespace {

using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

c10::Symbol aten(const char* name) { return c10::Symbol::fromQualString(std::string("aten::") + name); }

/// The attribute path of a GetAttr chain rooted at the graph's `self`, e.g.
/// "blocks.0.conv1.weight"; "" when `v` is not such a chain.
std::string attribute_path(Value* v, Value* self) {
  std::vector<std::string> parts;
  while (v != self) {
    Node* n = v->node();
    if (n->kind() != c10::prim::GetAttr) return "";
    parts.push_back(n->s(c10::attr::name));
    v = n->input(0);
  }
  std::string path;
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) path += (path.empty() ? "" : ".") + *it;
  return path;
}

/// A constant input's value, or None when it is not a constant.
c10::optional<c10::IValue> constant(Value* v) { return torch::jit::toIValue(v); }

/// Whether an operation with this kind modifies its first input in place.
bool in_place(const Node* n) {
  const std::string name = n->kind().toUnqualString();
  return !name.empty() && name.back() == '_' && n->kind().is_aten();
}

bool has_in_place_use(Value* v) {
  for (const torch::jit::Use& u : v->uses()) {
    if (u.offset == 0 && in_place(u.user)) return true;
  }
  return false;
}

/// Folds `c is None` and `c is not None` for a constant c that is not None,
/// and the branches on them: an optional argument given a value compiles to
/// such a test (nn.MaxPool2d's `stride is None` in F.max_pool2d), and a
/// graph with a branch is not read as piecewise linear.
void fold_none_tests(std::shared_ptr<Graph>& g) {
  bool folded = false;
  for (Node* n : g->nodes()) {
    const bool is = n->kind() == aten("__is__"), is_not = n->kind() == aten("__isnot__");
    if (!is && !is_not) continue;
    auto a = constant(n->input(0)), b = constant(n->input(1));
    if (!a || !b || a->isNone() == b->isNone()) continue;
    torch::jit::WithInsertPoint guard(n);
    n->output()->replaceAllUsesWith(g->insertConstant(is_not));
    folded = true;
  }
  if (!folded) return;
  torch::jit::ConstantPropagation(g);
  torch::jit::EliminateDeadCode(g);
}

/// A pool's square size: an int, or a list of one or two equal ints; -1
/// for [] (the default stride), 0 for anything else.
int64_t square_size(Value* v) {
  auto iv = constant(v);
  if (iv && iv->isInt()) return iv->toInt();
  if (!iv || !iv->isIntList()) return 0;
  const std::vector<int64_t> l = iv->toIntVector();
  if (l.empty()) return -1;
  return l.size() == 1 || (l.size() == 2 && l[0] == l[1]) ? l[0] : 0;
}

/// The window k of a max-pool of the graph op table (max_pool2d) that pools
/// non-overlapping windows of k per dimension (stride k or default, no
/// padding or dilation, floor mode): the windows the kink search pools
/// (GraphOpRule::kink_rows). 0 for any other max-pool and any other
/// operation.
int64_t plain_window(const Node* n) {
  const GraphOpRule* rule = n->kind().is_aten() ? graph_op_rule(n->kind().toUnqualString()) : nullptr;
  if (rule == nullptr || rule->pool_dims == 0 || n->inputs().size() != 6) return 0;
  const int64_t k = square_size(n->input(1)), stride = square_size(n->input(2));
  auto ceil_mode = constant(n->input(5));
  const bool plain = k >= 1 && (stride == k || stride == -1) && square_size(n->input(3)) == 0 &&
                     square_size(n->input(4)) == 1 && ceil_mode && ceil_mode->isBool() && !ceil_mode->toBool();
  return plain ? k : 0;
}

/// The window of an average pool of non-overlapping square windows
/// (aten::avg_pool2d with stride = window, no padding, floor mode, no
/// divisor override), or 0.
int64_t plain_average_window(const Node* n) {
  if (n->kind() != aten("avg_pool2d") || n->inputs().size() != 7) return 0;
  const int64_t k = square_size(n->input(1)), stride = square_size(n->input(2));
  auto ceil_mode = constant(n->input(4));
  const bool plain = k >= 1 && (stride == k || stride == -1) && square_size(n->input(3)) == 0 && ceil_mode &&
                     ceil_mode->isBool() && !ceil_mode->toBool() &&
                     n->input(6)->type()->kind() == c10::TypeKind::NoneType;
  return plain ? k : 0;
}

bool is_relu(const Node* n) { return n->kind() == aten("relu") || n->kind() == aten("relu_"); }

bool is_leaky_relu(const Node* n) { return n->kind() == aten("leaky_relu") || n->kind() == aten("leaky_relu_"); }

/// A leaky ReLU's negative slope when it is a constant number, else NaN.
double leaky_slope(Node* n) {
  auto s = n->inputs().size() > 1 ? constant(n->input(1)) : c10::nullopt;
  if (s && s->isDouble()) return s->toDouble();
  if (s && s->isInt()) return static_cast<double>(s->toInt());
  return std::numeric_limits<double>::quiet_NaN();
}

/// A kink site of the graph: a ReLU or leaky ReLU, and the plain max-pool
/// it is fused with (activation then pool, or pool then activation: the
/// two commute for a nondecreasing activation, a ReLU or a leaky ReLU of
/// slope ≥ 0), whose argmax switches are then kinks of the same site.
struct SiteNodes {
  Node* activation;
  Node* pool = nullptr;
  bool pool_first = false;
  int64_t window = 0;
  bool leaky = false;  ///< a leaky ReLU of slope > 0: negative values pass on
};

std::vector<SiteNodes> site_nodes(Graph& g) {
  std::vector<SiteNodes> out;
  std::set<const Node*> taken;  // a pool between two ReLUs goes with the first
  for (Node* n : g.nodes()) {
    if (!is_relu(n) && !is_leaky_relu(n)) continue;
    SiteNodes s{n};
    const double slope = is_leaky_relu(n) ? leaky_slope(n) : 0.0;
    s.leaky = slope > 0;
    if (slope >= 0) {  // nondecreasing (NaN: a slope not known)
      Value* in = n->input(0);
      Node* before = in->node();
      const auto& after = n->output()->uses();
      if (plain_window(before) && !taken.count(before) && in->uses().size() == 1 &&
          !has_in_place_use(before->input(0))) {
        // pool then activation: the site is the pool's input, read once here.
        s.pool = before;
        s.pool_first = true;
      } else if (after.size() == 1 && after[0].offset == 0 && plain_window(after[0].user) &&
                 (!in_place(n) || in->uses().size() == 1)) {
        // activation then pool; an in-place activation's input must feed
        // nothing else, or its other readers would see its output unpooled.
        s.pool = after[0].user;
      }
      if (s.pool) {
        s.window = plain_window(s.pool);
        taken.insert(s.pool);
      }
    }
    out.push_back(s);
  }
  return out;
}

/// The values of `sites` in g: the input of each pair's first operation,
/// copied before an in-place one overwrites it. Their windows go to
/// `windows`, and whether each is leaky to `leaky`.
std::vector<Value*> site_values(Graph& g, const std::vector<SiteNodes>& sites, std::vector<int64_t>& windows,
                                std::vector<bool>& leaky) {
  std::vector<Value*> values;
  for (const SiteNodes& s : sites) {
    Node* n = s.pool_first ? s.pool : s.activation;
    if (in_place(n)) {
      torch::jit::WithInsertPoint guard(n);
      values.push_back(g.insert(aten("clone"), {n->input(0)}));
    } else {
      values.push_back(n->input(0));
    }
    windows.push_back(s.window);
    leaky.push_back(s.leaky);
  }
  return values;
}

/// A parameterised operation of the graph: its entry of the layer table,
/// the parameters it reads, and the input that holds the weight.
struct LayerUse {
  Node* node;
  const LayerRule* rule;
  std::string weight, bias;
  size_t weight_input = 0;
};

/// Whether every operation of g other than the parameterised `layers` is
/// piecewise linear with its switches at kink sites (ScriptGraph::
/// polynomial_degree()). Conservative: an operation not in the graph op
/// table makes it false; a max-pool counts only when it is fused with a
/// kink site.
bool piecewise_linear(Graph& g, const std::vector<LayerUse>& layers, const std::vector<SiteNodes>& sites) {
  std::set<const Node*> pools;
  for (const SiteNodes& s : sites) {
    if (s.pool) pools.insert(s.pool);
  }
  static const std::set<std::string> kShapeOps = {"size", "dim", "len", "__getitem__", "floordiv", "Int"};
  for (Node* n : g.nodes()) {
    if (!n->blocks().empty()) return false;
    auto layer = std::find_if(layers.begin(), layers.end(), [&](const LayerUse& l) { return l.node == n; });
    if (layer != layers.end()) {
      if (!layer->rule->piecewise_linear) return false;
      continue;
    }
    const c10::Symbol k = n->kind();
    if (k == c10::prim::Constant || k == c10::prim::GetAttr || k == c10::prim::ListConstruct ||
        k == c10::prim::ListUnpack || k == c10::prim::TupleConstruct || k == c10::prim::TupleUnpack) {
      continue;
    }
    if (!k.is_aten()) return false;
    const std::string name = k.toUnqualString();
    const GraphOpRule* op = graph_op_rule(name);
    if ((op && op->piecewise_linear) || pools.count(n)) continue;
    if (kShapeOps.count(name) && (name != "Int" || n->input(0)->type()->kind() != c10::TypeKind::TensorType)) {
      continue;
    }
    // Scaling by a constant number keeps the degree.
    const bool scaling = name == "mul" || name == "mul_" || name == "div" || name == "div_";
    if (scaling && n->inputs().size() == 2 && n->input(1)->type()->kind() != c10::TypeKind::TensorType) continue;
    return false;
  }
  return true;
}

/// The layer table's entry for use `u` of parameter `name`, and its role
/// there (0 weight, 1 bias). Throws Error when no rule covers the use.
std::pair<const LayerRule*, int> rule_of_use(const torch::jit::Use& u, const std::string& name) {
  const c10::Symbol k = u.user->kind();
  const LayerRule* rule = layer_rule_for_op(k.toQualString());
  const int role = rule ? rule->param_input(u.user, u.offset, name) : -1;
  PK_CHECK(role >= 0, "parameter '" << name << "' is used by " << k.toQualString() << " (input " << u.offset
                                    << "), which has no rule");
  return {rule, role};
}

/// Every operation of g's top level that reads a parameter of `module`, in
/// graph order. Throws Error, naming the parameter, when one is used in a
/// way no rule covers, by two operations, or not at the top level.
std::vector<LayerUse> parameter_layers(Graph& g, const torch::jit::Module& module) {
  std::set<std::string> params;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) params.insert(p.name);
  Value* self = g.inputs()[0];
  std::map<std::string, size_t> uses;
  std::map<Node*, LayerUse> layers;
  for (Node* n : g.nodes()) {
    if (n->kind() != c10::prim::GetAttr) continue;
    const std::string name = attribute_path(n->output(), self);
    if (!params.count(name)) continue;
    for (const torch::jit::Use& u : n->output()->uses()) {
      const auto [rule, role] = rule_of_use(u, name);
      ++uses[name];
      const auto [it, fresh] = layers.emplace(u.user, LayerUse{u.user, rule, {}, {}});
      LayerUse& l = it->second;
      PK_CHECK(fresh || (role == 1 ? l.bias.empty() : l.weight.empty()),
               "operation " << u.user->kind().toQualString() << " reads two parameters in one place");
      if (role == 0) {
        l.weight = name;
        l.weight_input = u.offset;
      } else {
        l.bias = name;
      }
    }
  }
  for (const std::string& p : params) {
    PK_CHECK(uses.count(p), "parameter '" << p << "' is not read by the top level of the forward graph "
                                           << "(it is used inside a branch or loop, or not at all)");
    PK_CHECK(uses[p] == 1, "parameter '" << p << "' is used by " << uses[p] << " operations (tied or reused weights)");
  }
  std::vector<LayerUse> out;
  for (const auto& entry : layers) out.push_back(entry.second);
  std::sort(out.begin(), out.end(), [](const LayerUse& a, const LayerUse& b) { return a.node->isBefore(b.node); });
  return out;
}

/// The module a parameter belongs to: "blocks.0.conv1" for
/// "blocks.0.conv1.weight", "" for a top-level parameter.
std::string module_of(const std::string& parameter) {
  const size_t dot = parameter.rfind('.');
  return parameter.substr(0, dot == std::string::npos ? 0 : dot);
}

/// The square padding of a plain convolution (stride 1, dilation 1, one
/// group, equal padding on both dimensions), or -1 for any other.
int64_t plain_conv_padding(const LayerUse& l) {
  LayerDesc c;
  try {
    l.rule->read(l.node, c);
  } catch (const Error&) {
    return -1;
  }
  auto all_ones = [](const std::vector<int64_t>& v) {
    return std::all_of(v.begin(), v.end(), [](int64_t x) { return x == 1; });
  };
  const std::vector<int64_t>& p = c.padding2;
  const bool square = p.size() == 1 || (p.size() == 2 && p[0] == p[1]);
  return all_ones(c.stride) && all_ones(c.dilation) && c.groups == 1 && square ? p[0] : -1;
}

/// Whether v is the integer constant `want`.
bool int_constant(Value* v, int64_t want) {
  const auto c = constant(v);
  return c && c->isInt() && c->toInt() == want;
}

/// Whether v is a positive integer constant.
bool positive_constant(Value* v) {
  const auto c = constant(v);
  return c && c->isInt() && c->toInt() > 0;
}

/// Whether v is h's row count as a forward pass spells it: h.size(0),
/// h.shape[0] (`__getitem__` of h.size()), or either through a traced
/// module's NumToTensor and Int.
bool row_count_of(Value* v, Value* h) {
  Node* n = v->node();
  if (n->kind() == aten("Int") || n->kind() == c10::prim::NumToTensor) return row_count_of(n->input(0), h);
  if (n->kind() == aten("size")) return n->inputs().size() == 2 && n->input(0) == h && int_constant(n->input(1), 0);
  if (n->kind() == aten("__getitem__") && n->inputs().size() == 2) {
    Node* size = n->input(0)->node();
    return size->kind() == aten("size") && size->inputs().size() == 1 && size->input(0) == h &&
           int_constant(n->input(1), 0);
  }
  return false;
}

/// Whether `list` flattens h to rows: [rows, -1], or [rows, N] or [-1, N]
/// with N a constant (rows: h's row count, row_count_of). The last two are
/// a flattening only when N is the product of h's other dimensions, which
/// the graph does not say: the chain's check against the module
/// (rows_agree_with_module) refuses it otherwise.
bool rows_shape(Value* list, Value* h) {
  if (const auto c = constant(list)) {  // [-1, N] folded into one constant
    if (!c->isIntList()) return false;
    const c10::List<int64_t> v = c->toIntList();
    return v.size() == 2 && v.get(0) == -1 && v.get(1) > 0;
  }
  Node* n = list->node();
  if (n->kind() != c10::prim::ListConstruct || n->inputs().size() != 2) return false;
  Value* rows = n->input(0);
  Value* rest = n->input(1);
  if (row_count_of(rows, h)) return int_constant(rest, -1) || positive_constant(rest);
  return int_constant(rows, -1) && positive_constant(rest);
}

/// The parameterised operation `n` of a chain as a layer of pathkernel's own:
/// a Linear or plain Conv2d whose weight and bias (if it has one) are its
/// module's "weight" and "bias". Kind::Module when it is none of these.
LayerDesc own_param_layer(const LayerUse& l, const torch::jit::Module& module) {
  using Kind = LayerDesc::Kind;
  const std::string name = module_of(l.weight);
  if (name.empty() || l.weight != name + ".weight" || (!l.bias.empty() && l.bias != name + ".bias")) return {};
  torch::Tensor w;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    if (p.name == l.weight) w = p.value;
  }
  if (l.rule->kind == Kind::Linear && w.dim() == 2) return LayerDesc(Kind::Linear, name, w.size(1), w.size(0), 0, 0);
  const int64_t padding = l.rule->kind == Kind::Conv2d && w.dim() == 4 ? plain_conv_padding(l) : -1;
  if (padding < 0 || w.size(2) != w.size(3)) return {};
  return LayerDesc(Kind::Conv2d, name, w.size(1), w.size(0), w.size(2), padding);
}

/// An operation as a reason names it: its kind and, where it reads
/// parameters, their module.
std::string operation_name(const Node* n, const std::vector<LayerUse>& layers) {
  std::string name = n->kind().toQualString();
  auto layer = std::find_if(layers.begin(), layers.end(), [&](const LayerUse& l) { return l.node == n; });
  if (layer != layers.end() && !module_of(layer->weight).empty()) name += " of '" + module_of(layer->weight) + "'";
  return name;
}

/// The seeded dropout `n` (pathkernel::dropout: input, p, train, site, x) as
/// a chain's layer in `d`: Kind::Dropout with its probability and site, or
/// left Kind::Module where it passes its input through (its training flag
/// off or p 0). False when the module does not fix p or the flag, or its
/// masks are not drawn from the network's input.
bool chain_dropout(Node* n, Graph& g, const torch::jit::Module& module, LayerDesc& d) {
  const auto p = fixed_value(n->input(1), g, module), train = fixed_value(n->input(2), g, module);
  const auto site = constant(n->input(3));
  if (!p || !(p->isDouble() || p->isInt()) || !train || !train->isBool() || !site || !site->isInt() ||
      n->input(4) != g.inputs()[1]) {
    return false;
  }
  const double drop = p->isDouble() ? p->toDouble() : static_cast<double>(p->toInt());
  if (!train->toBool() || drop == 0) return true;
  d.kind = LayerDesc::Kind::Dropout;
  d.drop = drop;
  d.site = site->toInt();
  return true;
}

/// g as a plain chain of pathkernel's own layers (ScriptGraph::chain()), or
/// empty with `why_not` saying which operation breaks it: each operation
/// reads the one before it and nothing else does (but the row count a
/// flattening view asks for), and its kink sites are where pathkernel's own
/// networks have theirs.
std::vector<LayerDesc> plain_chain(Graph& g, const std::vector<LayerUse>& layers, const torch::jit::Module& module,
                                   std::string& why_not) {
  using Kind = LayerDesc::Kind;
  auto refuse = [&](const std::string& why) {
    why_not = why;
    return std::vector<LayerDesc>{};
  };
  if (g.inputs().size() != 2) return refuse("its forward takes more than one input");
  static const c10::Symbol kDropout = c10::Symbol::fromQualString("pathkernel::dropout");  // seeded (dropout.h)
  Value* x = g.inputs()[1];
  std::vector<LayerDesc> chain;
  std::vector<const Node*> nodes;  // chain[i]'s operation
  Value* h = g.inputs()[1];
  for (Node* n : g.nodes()) {
    const c10::Symbol k = n->kind();
    if (k == c10::prim::Constant || k == c10::prim::GetAttr || k == c10::prim::ListConstruct) continue;
    if (k == aten("size") && n->input(0) == h) continue;
    if (n->outputs().size() == 1 && row_count_of(n->output(), h)) continue;  // h.shape[0] and the like
    if (n->inputs().empty() || n->input(0) != h || n->outputs().size() != 1) {
      return refuse(operation_name(n, layers) + " does not read the operation before it alone");
    }
    // h feeds n, and otherwise only its own row count.
    for (const torch::jit::Use& u : h->uses()) {
      const bool masks_drawn = h == x && u.user->kind() == kDropout && u.offset == 4;  // a dropout's own input row
      if (u.user != n && u.user->kind() != aten("size") && !masks_drawn) {
        return refuse("the input of " + operation_name(n, layers) + " is also read by " +
                      operation_name(u.user, layers));
      }
    }
    LayerDesc d;
    auto layer = std::find_if(layers.begin(), layers.end(), [&](const LayerUse& l) { return l.node == n; });
    auto is_int = [&](size_t i, int64_t want) {
      auto v = constant(n->input(i));
      return v && v->isInt() && v->toInt() == want;
    };
    if (layer != layers.end()) {
      d = own_param_layer(*layer, module);
      if (d.kind == Kind::Module) {
        return refuse(operation_name(n, layers) + " is not a Linear or a stride-1 Conv2d of square kernel and " +
                      "padding with its module's weight (and bias)");
      }
    } else if (is_relu(n)) {
      d.kind = Kind::ReLU;
    } else if (is_leaky_relu(n) && leaky_slope(n) >= 0) {  // a constant slope (NaN otherwise)
      d.kind = Kind::LeakyReLU;
      d.slope = leaky_slope(n);
    } else if (plain_window(n) > 0) {
      d.kind = Kind::MaxPool2d;
      d.kernel = plain_window(n);
    } else if (plain_average_window(n) > 0) {
      d.kind = Kind::AvgPool2d;
      d.kernel = plain_average_window(n);
    } else if (k == aten("flatten") && n->inputs().size() == 3 && is_int(1, 1) && is_int(2, -1)) {
      d.kind = Kind::Flatten;
    } else if ((k == aten("view") || k == aten("reshape")) && rows_shape(n->input(1), h)) {
      d.kind = Kind::Flatten;
    } else if (k == kDropout) {
      if (!chain_dropout(n, g, module, d)) {
        return refuse(operation_name(n, layers) + " has a probability or training flag the module does not fix");
      }
      if (d.kind == Kind::Module) {  // it passes its input through
        h = n->output();
        continue;
      }
    } else if (k == aten("log_softmax") && n->inputs().size() == 3 && (is_int(1, 1) || is_int(1, -1)) &&
               n->input(2)->type()->kind() == c10::TypeKind::NoneType) {
      d.kind = Kind::LogSoftmax;  // the outputs; only last (below)
    }
    if (d.kind == Kind::Module) {
      return refuse(operation_name(n, layers) + " is none of a chain's layers (Linear, Conv2d, ReLU, a leaky " +
                    "ReLU of a constant slope >= 0, a max-pool or average pool of non-overlapping windows, a " +
                    "flattening to rows, a dropout)");
    }
    chain.push_back(d);
    nodes.push_back(n);
    h = n->output();
  }
  if (g.outputs()[0] != h) return refuse("its output is not its last operation's");
  for (size_t i = 0; i + 1 < chain.size(); ++i) {
    if (chain[i].kind == Kind::LogSoftmax) return refuse("aten::log_softmax is not its last operation");
  }
  // A max-pool and a ReLU (or a leaky ReLU of slope >= 0) commute: a pool
  // then a ReLU is walked as the ReLU then the pool, the order of
  // pathkernel's own networks. Their kink sites are a param layer's
  // outputs: a ReLU must follow one, and a pool such a ReLU.
  for (size_t i = 0; i + 1 < chain.size(); ++i) {
    if (chain[i].kind == Kind::MaxPool2d && chain[i + 1].rectifier()) {
      std::swap(chain[i], chain[i + 1]);
      std::swap(nodes[i], nodes[i + 1]);
    }
  }
  for (size_t i = 0; i < chain.size(); ++i) {
    const bool after_param = i > 0 && chain[i - 1].parameterised();
    const bool after_relu = i > 1 && chain[i - 1].rectifier() && chain[i - 2].parameterised();
    if (chain[i].rectifier() && !after_param) {
      return refuse(operation_name(nodes[i], layers) + " does not follow a Linear or Conv2d");
    }
    if (chain[i].kind == Kind::MaxPool2d && !after_relu) {
      return refuse(operation_name(nodes[i], layers) + " is not beside a ReLU after a Linear or Conv2d");
    }
  }
  why_not.clear();
  return chain;
}

/// Rewrites layer `l` of g to y + t ⊙ op_dir(a; dW) (t along the rows),
/// with new graph inputs for its weight's and bias's directions. The
/// layer's input a and its output at t go to `inputs` and `outputs`.
/// Without `along`, the output is y as it is (every row at t = 0: the
/// direction's product, which t multiplies away, is left for dead code).
/// Throws Error when an argument of the operation has no rule.
ScriptLayer rewrite_layer(Graph& g, const LayerUse& l, Value* t, std::vector<Value*>& inputs,
                          std::vector<Value*>& outputs, bool along = true) {
  Node* n = l.node;
  PK_CHECK(!l.weight.empty(), "operation " << n->kind().toQualString() << " has parameter '" << l.bias
                                           << "' as its bias but no parameter weight");
  ScriptLayer layer;
  layer.weight = l.weight;
  layer.bias = l.bias;
  LayerDesc& d = layer.desc;
  d.module = module_of(l.weight);
  Value* dw = g.addInput();
  dw->setType(c10::TensorType::get());
  Value* db = nullptr;
  if (!l.bias.empty()) {
    db = g.addInput();
    db->setType(c10::TensorType::get());
  }
  Value* y = n->output();
  torch::jit::WithInsertPoint guard(n->next());
  Value* none = g.insertConstant(c10::IValue());
  d.kind = l.rule->kind;
  l.rule->read(n, d);
  const DirectionValues v = l.rule->rewrite({&g, n, dw, db, none, l.weight_input});
  Value* a = v.input;
  Value* y_t = y;
  if (along) {
    // y + t ⊙ dir with t along the rows: rows moved last, scaled, moved back.
    Value* moved = g.insert(aten("movedim"), {v.direction, 0, -1});
    Value* scaled = g.insert(aten("movedim"), {g.insert(aten("mul"), {moved, t}), -1, 0});
    y_t = g.insert(aten("add"), {y, scaled});
    y->replaceAllUsesAfterNodeWith(y_t->node(), y_t);
  }
  // Captured values must not change after the capture: an in-place use
  // downstream gets a copy instead.
  if (has_in_place_use(y_t)) {
    Value* copy = g.insert(aten("clone"), {y_t});
    y_t->replaceAllUsesAfterNodeWith(copy->node(), copy);
  }
  if (has_in_place_use(a)) {
    torch::jit::WithInsertPoint before(n);
    Value* copy = g.insert(aten("clone"), {a});
    a->replaceAllUsesAfterNodeWith(copy->node(), copy);
    a = copy;
  }
  inputs.push_back(a);
  outputs.push_back(y_t);
  return layer;
}

/// Makes g return `values` as one tuple, in place of its output.
void return_tuple(Graph& g, const std::vector<Value*>& values) {
  Node* tuple = g.createTuple(values);
  g.insertNode(tuple);
  g.eraseOutput(0);
  g.registerOutput(tuple->output());
}

/// A traced module's convolutions, recorded as aten::_convolution, as the
/// conv1d or conv2d they are (not transposed, one or two spatial
/// dimensions), which the layer table reads: conv2d calls _convolution
/// with the same arguments (the cuDNN and benchmark flags do nothing on the
/// CPU), so the values are the same.
void untrace_convolutions(Graph& g) {
  std::vector<Node*> traced;
  for (Node* n : g.nodes()) {
    if (n->kind() == aten("_convolution") && n->inputs().size() == 13) traced.push_back(n);
  }
  for (Node* n : traced) {
    const auto transposed = constant(n->input(6));
    const auto stride = constant(n->input(3));
    if (!transposed || !transposed->isBool() || transposed->toBool() || !stride || !stride->isIntList()) continue;
    const size_t dims = stride->toIntList().size();
    if (dims != 1 && dims != 2) continue;
    torch::jit::WithInsertPoint guard(n);
    Value* conv = g.insert(aten(dims == 2 ? "conv2d" : "conv1d"),
                           {n->input(0), n->input(1), n->input(2), n->input(3), n->input(4), n->input(5), n->input(8)});
    n->output()->replaceAllUsesWith(conv);
    n->destroy();
  }
}

/// The padding a convolution's string padding stands for, per spatial
/// dimension, for a weight of `shape` [C_out, C_in/groups, k...] and the
/// dilation `dilation` (one entry: every dimension): 'valid' pads nothing,
/// 'same' pads dilation·(k − 1)/2 on each side. Empty where the string is
/// neither, or 'same' pads one side more (dilation·(k − 1) odd: an even
/// kernel), which an integer padding cannot say.
std::vector<int64_t> padding_of(const std::string& padding, const std::vector<int64_t>& shape,
                                const std::vector<int64_t>& dilation) {
  const size_t dims = shape.size() - 2;
  if (padding == "valid") return std::vector<int64_t>(dims, 0);
  if (padding != "same" || (dilation.size() != 1 && dilation.size() != dims)) return {};
  std::vector<int64_t> out;
  for (size_t i = 0; i < dims; ++i) {
    const int64_t reach = dilation[dilation.size() == 1 ? 0 : i] * (shape[2 + i] - 1);
    if (reach % 2 != 0) return {};
    out.push_back(reach / 2);
  }
  return out;
}

/// Convolutions given a string padding (PyTorch's padding='same' or
/// 'valid') as the same operation with the integers it stands for
/// (padding_of), which the layer table and the chain reader read. PyTorch
/// runs a symmetric string padding as that integer padding, so the values
/// are the same. One whose weight is not a parameter of `module`, or whose
/// padding has no integers, is left as it is (the layer table refuses it).
void number_paddings(Graph& g, const torch::jit::Module& module) {
  std::vector<Node*> strings;
  for (Node* n : g.nodes()) {
    const bool conv = n->kind() == aten("conv1d") || n->kind() == aten("conv2d");
    const auto padding = conv && n->inputs().size() == 7 ? constant(n->input(4)) : c10::nullopt;
    if (padding && padding->isString()) strings.push_back(n);
  }
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) shapes[p.name] = p.value.sizes().vec();
  for (Node* n : strings) {
    const auto shape = shapes.find(attribute_path(n->input(1), g.inputs()[0]));
    const auto dilation = constant(n->input(5));
    if (shape == shapes.end() || shape->second.size() < 3 || !dilation || !dilation->isIntList()) continue;
    const std::vector<int64_t> padding =
        padding_of(constant(n->input(4))->toStringRef(), shape->second, dilation->toIntVector());
    if (padding.empty()) continue;
    torch::jit::WithInsertPoint guard(n);
    Value* conv = g.insert(n->kind(), {n->input(0), n->input(1), n->input(2), n->input(3),
                                       g.insertConstant(c10::IValue(padding)), n->input(5), n->input(6)});
    n->output()->replaceAllUsesWith(conv);
    n->destroy();
  }
}

}  // namespace

bool rows_at_start(const torch::Tensor& t) { return t.numel() == 0 || !t.ne(0).any().item<bool>(); }

std::vector<Node*> nodes_of_kinds(Graph& graph, const std::vector<c10::Symbol>& kinds) {
  std::vector<Node*> found;
  std::vector<torch::jit::Block*> blocks{graph.block()};
  while (!blocks.empty()) {
    torch::jit::Block* b = blocks.back();
    blocks.pop_back();
    for (Node* n : b->nodes()) {
      if (std::find(kinds.begin(), kinds.end(), n->kind()) != kinds.end()) found.push_back(n);
      for (torch::jit::Block* inner : n->blocks()) blocks.push_back(inner);
    }
  }
  return found;
}

std::shared_ptr<torch::jit::Graph> inlined_forward(const torch::jit::Module& module, int64_t* dropout_sites) {
  std::shared_ptr<Graph> g = module.get_method("forward").graph()->copy();
  // One pass inlines one level of calls (a callee's own calls arrive
  // uninlined), so repeat until none is left.
  auto has_calls = [&] {
    for (Node* node : g->nodes()) {
      if (node->kind() == c10::prim::CallMethod || node->kind() == c10::prim::CallFunction) return true;
    }
    return false;
  };
  for (int depth = 0; depth < 64 && has_calls(); ++depth) torch::jit::Inline(*g);
  torch::jit::ConstantPropagation(g);
  untrace_convolutions(*g);
  number_paddings(*g, module);
  const int64_t sites = seed_dropout(*g);
  if (dropout_sites != nullptr) *dropout_sites = sites;
  return g;
}

std::vector<Value*> kink_site_values(std::shared_ptr<Graph>& g, std::vector<int64_t>& windows,
                                     std::vector<bool>& leaky) {
  fold_none_tests(g);
  return site_values(*g, site_nodes(*g), windows, leaky);
}

torch::Tensor site_rows(const torch::Tensor& site, int64_t rows, int64_t window) {
  if (window == 0) return site.reshape({rows, -1});
  for (const GraphOpRule& pool : graph_op_table()) {
    if (pool.pool_dims > 0 && site.dim() == 2 + pool.pool_dims && site.size(0) == rows) {
      return pool.kink_rows(site, window);
    }
  }
  PK_THROW("a max-pooled kink site has shape " << site.sizes() << ", expected [" << rows << ", C, H, W]");
}

/// Rewrites g (its layers `layers`, its kink sites `site_list`) to return
/// its output, each layer's input and output, and its kink sites, as one
/// tuple: with new inputs t [R], then each layer's directions, and after
/// each layer y = op(a; W_s) its value y + t ⊙ op_dir(a; dW) (t along the
/// rows; without `along`, y itself: every row at t = 0). The layers'
/// descriptions go to `described` (when given), the sites' windows and
/// leakiness to `windows` and `leaky`. Returns the number of sites; throws
/// Error where an argument of an operation has no rule.
int64_t segment_graph(Graph& g, const std::vector<LayerUse>& layers, const std::vector<SiteNodes>& site_list,
                      bool along, std::vector<ScriptLayer>* described, std::vector<int64_t>& windows,
                      std::vector<bool>& leaky) {
  Value* t = g.addInput("pk_t");
  t->setType(c10::TensorType::get());
  std::vector<Value*> captured_inputs, captured_outputs;
  for (const LayerUse& l : layers) {
    ScriptLayer layer = rewrite_layer(g, l, t, captured_inputs, captured_outputs, along);
    if (described != nullptr) described->push_back(std::move(layer));
  }
  // Kink sites, read after the rewrite, which has replaced the layers' outputs.
  const std::vector<Value*> sites = site_values(g, site_list, windows, leaky);
  std::vector<Value*> values{g.outputs()[0]};
  values.insert(values.end(), captured_inputs.begin(), captured_inputs.end());
  values.insert(values.end(), captured_outputs.begin(), captured_outputs.end());
  values.insert(values.end(), sites.begin(), sites.end());
  return_tuple(g, values);
  return static_cast<int64_t>(sites.size());
}

/// The module's forward graph as read() reads it: inlined, without dead
/// code, its None tests folded.
std::shared_ptr<Graph> readable_forward(const torch::jit::Module& module) {
  std::shared_ptr<Graph> g = inlined_forward(module);
  torch::jit::EliminateDeadCode(g);
  fold_none_tests(g);
  return g;
}

std::unique_ptr<ScriptGraph> ScriptGraph::read(const torch::jit::Module& module, std::string& why_not) {
  auto out = std::unique_ptr<ScriptGraph>(new ScriptGraph());
  std::shared_ptr<Graph> g = readable_forward(module);
  if (g->outputs().size() != 1 || g->outputs()[0]->type()->kind() != c10::TypeKind::TensorType) {
    why_not = "its forward does not return one tensor";
    return nullptr;
  }
  std::vector<LayerUse> layers;
  try {
    layers = parameter_layers(*g, module);
  } catch (const Error& e) {
    why_not = e.what();
    return nullptr;
  }
  // Each parameter is read once, so the logits' degree in t is at most the
  // number of parameterised operations (read before the rewrite adds its own).
  const std::vector<SiteNodes> site_list = site_nodes(*g);
  out->degree_ = piecewise_linear(*g, layers, site_list) ? static_cast<int64_t>(layers.size()) : 0;
  out->chain_ = plain_chain(*g, layers, module, out->chain_refusal_);
  try {
    out->sites_ = segment_graph(*g, layers, site_list, true, &out->layers_, out->site_windows_, out->site_leaky_);
  } catch (const Error& e) {
    why_not = e.what();
    return nullptr;
  }
  out->graph_ = g;
  out->executor_ = std::make_unique<torch::jit::GraphExecutor>(g, "pathkernel_segment");
  // The same graph for rows all at t = 0 (the training side's passes),
  // read again from the module: without the directions' products.
  std::shared_ptr<Graph> g0 = readable_forward(module);
  std::vector<int64_t> windows;
  std::vector<bool> leaky;
  segment_graph(*g0, parameter_layers(*g0, module), site_nodes(*g0), false, nullptr, windows, leaky);
  torch::jit::EliminateDeadCode(g0);
  out->graph_at_start_ = g0;
  out->executor_at_start_ = std::make_unique<torch::jit::GraphExecutor>(g0, "pathkernel_segment_start");
  return out;
}

ScriptPass ScriptGraph::run(const torch::jit::Module& module, const torch::Tensor& x, const torch::Tensor& t,
                            const std::vector<torch::Tensor>& directions) const {
  torch::jit::Stack stack{module._ivalue(), x, t};
  for (const torch::Tensor& d : directions) stack.emplace_back(d);
  // Every row at t = 0: the directions' products would be multiplied by 0.
  (rows_at_start(t) ? executor_at_start_ : executor_)->run(stack);
  const auto tuple = stack.back().toTuple();
  const auto& e = tuple->elements();
  const size_t layers = layers_.size();
  PK_ASSERT(e.size() == 1 + 2 * layers + static_cast<size_t>(sites_));
  ScriptPass pass;
  pass.logits = e[0].toTensor();
  for (size_t l = 0; l < layers; ++l) {
    pass.inputs.push_back(e[1 + l].toTensor());
    pass.outputs.push_back(e[1 + layers + l].toTensor());
  }
  for (size_t j = 1 + 2 * layers; j < e.size(); ++j) {
    pass.sites.push_back(site_rows(e[j].toTensor(), x.size(0), site_windows_[j - 1 - 2 * layers]));
  }
  return pass;
}

}  // namespace pathkernel

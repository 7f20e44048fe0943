// The optimizer registry and flat optimizer state.
#include "pathkernel/optimizer.h"

#include <c10/util/string_utils.h>


#include "pathkernel/error.h"
#include "pathkernel/text.h"

namespace pathkernel {

namespace {
std::unique_ptr<torch::optim::Optimizer> make_sgd(const OptimizerOptions& o,
                                                  const std::vector<torch::Tensor>& params,
                                                  double momentum, bool nesterov) {
  auto opts = torch::optim::SGDOptions(o.lr).momentum(momentum).weight_decay(o.weight_decay).nesterov(nesterov);
  if (momentum != 0 && !nesterov) opts.dampening(o.dampening);
  return std::make_unique<torch::optim::SGD>(params, opts);
}

/// LibTorch's optimizer for each kind.
std::unique_ptr<torch::optim::Optimizer> make(OptimizerKind kind, const OptimizerOptions& o,
                                              const std::vector<torch::Tensor>& p) {
  switch (kind) {
    case OptimizerKind::Gd:
    case OptimizerKind::Sgd:
      return make_sgd(o, p, 0.0, false);
    case OptimizerKind::Momentum:
      return make_sgd(o, p, o.momentum, false);
    case OptimizerKind::Nesterov:
      return make_sgd(o, p, o.momentum, true);
    case OptimizerKind::Adam:
      return std::make_unique<torch::optim::Adam>(
          p, torch::optim::AdamOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(o.weight_decay));
    case OptimizerKind::AdamW:
      return std::make_unique<torch::optim::AdamW>(
          p, torch::optim::AdamWOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(o.weight_decay));
    case OptimizerKind::RMSprop:
      return std::make_unique<torch::optim::RMSprop>(p, torch::optim::RMSpropOptions(o.lr)
                                                            .alpha(o.alpha)
                                                            .eps(o.eps)
                                                            .momentum(o.momentum)
                                                            .weight_decay(o.weight_decay)
                                                            .centered(o.centered));
    case OptimizerKind::Adagrad:
      return std::make_unique<torch::optim::Adagrad>(p, torch::optim::AdagradOptions(o.lr)
                                                            .lr_decay(o.lr_decay)
                                                            .weight_decay(o.weight_decay)
                                                            .initial_accumulator_value(o.initial_accumulator_value)
                                                            .eps(o.eps));
  }
  PK_ASSERT(false);
  return nullptr;
}

std::string key_of(const torch::Tensor& p) { return c10::guts::to_string(p.unsafeGetTensorImpl()); }

/// Appends one parameter's Adam or AdamW state to the flat buffers.
template <class State>
void export_adam(const State& s, OptimizerState& out, std::map<std::string, std::vector<torch::Tensor>>& parts) {
  out.step = s.step();
  parts["exp_avg"].push_back(s.exp_avg().reshape({-1}));
  parts["exp_avg_sq"].push_back(s.exp_avg_sq().reshape({-1}));
}

/// One parameter's Adam or AdamW state from slices of the flat buffers.
template <class State, class Slice>
std::unique_ptr<torch::optim::OptimizerParamState> make_adam_state(int64_t step, const Slice& slice) {
  auto s = std::make_unique<State>();
  s->step(step);
  s->exp_avg(slice("exp_avg"));
  s->exp_avg_sq(slice("exp_avg_sq"));
  return s;
}

/// Adagrad's state before its first step, as its constructor makes it: LibTorch's
/// Adagrad::step expects every parameter's state to exist.
std::unique_ptr<torch::optim::OptimizerParamState> initial_adagrad_state(torch::optim::Optimizer& optimizer,
                                                                         const torch::Tensor& p) {
  auto s = std::make_unique<torch::optim::AdagradParamState>();
  s->step(0);
  const auto& o = static_cast<const torch::optim::AdagradOptions&>(optimizer.param_groups().front().options());
  s->sum(torch::full_like(p, o.initial_accumulator_value(), at::MemoryFormat::Preserve));
  return s;
}
}  // namespace

const std::vector<OptimizerTraits>& optimizer_kinds() {
  // LibTorch's defaults of lr and eps (its Adagrad's eps is 1e-10).
  //  kind                    name        full   buffer momentum adam  lr    eps
  static const std::vector<OptimizerTraits> kinds = {
      {OptimizerKind::Gd, "gd", true, false, false, false, 0.1, 0},
      {OptimizerKind::Sgd, "sgd", false, false, false, false, 0.1, 0},
      {OptimizerKind::Momentum, "momentum", false, true, true, false, 0.1, 0},
      {OptimizerKind::Nesterov, "nesterov", false, true, true, false, 0.1, 0},
      {OptimizerKind::Adam, "adam", false, true, false, true, 1e-3, 1e-8},
      {OptimizerKind::AdamW, "adamw", false, true, false, true, 1e-3, 1e-8},
      {OptimizerKind::RMSprop, "rmsprop", false, true, false, false, 1e-2, 1e-8},
      {OptimizerKind::Adagrad, "adagrad", false, true, false, false, 1e-2, 1e-10}};
  return kinds;
}

const OptimizerTraits& optimizer_traits(OptimizerKind kind) {
  for (const OptimizerTraits& t : optimizer_kinds()) {
    if (t.kind == kind) return t;
  }
  PK_ASSERT(false);
  return optimizer_kinds().front();
}

OptimizerKind parse_optimizer_kind(const std::string& name) {
  for (const OptimizerTraits& t : optimizer_kinds()) {
    if (name == t.name) return t.kind;
  }
  PK_THROW("unknown optimizer '" << name << "': expected one of " << join(optimizer_names()));
}

std::vector<std::string> optimizer_names() {
  std::vector<std::string> names;
  for (const OptimizerTraits& t : optimizer_kinds()) names.push_back(t.name);
  return names;
}

OptimizerOptions OptimizerOptions::resolved() const {
  OptimizerOptions o = *this;
  if (o.lr == 0) o.lr = traits().default_lr;
  if (o.eps == 0) o.eps = traits().default_eps;
  if (o.momentum == 0 && traits().momentum_family) o.momentum = 0.9;  // PyTorch's SGD takes none by default
  return o;
}

void OptimizerOptions::validate() const {
  const OptimizerTraits& t = traits();
  const double lr = resolved().lr;
  PK_CHECK(std::isfinite(lr) && lr > 0, "learning rate must be > 0 (got " << lr << ")");
  PK_CHECK(weight_decay >= 0, "weight decay must be >= 0 (got " << weight_decay << ")");
  if (t.momentum_family) {
    const double momentum = resolved().momentum;
    PK_CHECK(momentum > 0 && momentum < 1, "momentum must be in (0, 1) (got " << momentum << ")");
    PK_CHECK(dampening >= 0 && dampening < 1, "dampening must be in [0, 1) (got " << dampening << ")");
    PK_CHECK(!(t.kind == OptimizerKind::Nesterov && dampening != 0), "nesterov needs dampening 0 (got " << dampening << ")");
  }
  if (t.adam_family) {
    PK_CHECK(beta1 >= 0 && beta1 < 1, "beta1 must be in [0, 1) (got " << beta1 << ")");
    PK_CHECK(beta2 >= 0 && beta2 < 1, "beta2 must be in [0, 1) (got " << beta2 << ")");
  }
  if (t.default_eps != 0) PK_CHECK(resolved().eps > 0, "eps must be > 0 (got " << eps << ")");
  if (t.kind == OptimizerKind::RMSprop) {
    PK_CHECK(alpha >= 0 && alpha < 1, "alpha must be in [0, 1) (got " << alpha << ")");
    PK_CHECK(momentum >= 0 && momentum < 1, "momentum must be in [0, 1) (got " << momentum << ")");
  }
  if (t.kind == OptimizerKind::Adagrad) {
    PK_CHECK(lr_decay >= 0, "lr_decay must be >= 0 (got " << lr_decay << ")");
    PK_CHECK(initial_accumulator_value >= 0,
             "initial_accumulator_value must be >= 0 (got " << initial_accumulator_value << ")");
  }
}

nlohmann::ordered_json OptimizerOptions::to_json() const {
  nlohmann::ordered_json j;
  j["name"] = name;
  j["lr"] = resolved().lr;
  if (traits().momentum_family) {
    j["momentum"] = resolved().momentum;
    j["dampening"] = dampening;
  }
  if (traits().adam_family) {
    j["beta1"] = beta1;
    j["beta2"] = beta2;
  }
  if (traits().kind == OptimizerKind::RMSprop) {
    j["alpha"] = alpha;
    j["centered"] = centered;
    if (momentum != 0) j["momentum"] = momentum;  // absent: none, as in runs made before RMSprop took momentum
  }
  if (traits().kind == OptimizerKind::Adagrad) {
    j["lr_decay"] = lr_decay;
    j["initial_accumulator_value"] = initial_accumulator_value;
  }
  if (traits().default_eps != 0) j["eps"] = resolved().eps;
  j["weight_decay"] = weight_decay;
  return j;
}

OptimizerOptions OptimizerOptions::from_json(const nlohmann::ordered_json& j) {
  OptimizerOptions o;
  o.name = j.at("name").get<std::string>();
  o.lr = j.at("lr").get<double>();
  o.weight_decay = j.at("weight_decay").get<double>();
  if (o.traits().momentum_family) {
    o.momentum = j.at("momentum").get<double>();
    o.dampening = j.at("dampening").get<double>();
  }
  if (o.traits().adam_family) {
    o.beta1 = j.at("beta1").get<double>();
    o.beta2 = j.at("beta2").get<double>();
  }
  if (o.traits().kind == OptimizerKind::RMSprop) {
    o.alpha = j.at("alpha").get<double>();
    o.centered = j.at("centered").get<bool>();
    o.momentum = j.value("momentum", 0.0);
  }
  if (o.traits().kind == OptimizerKind::Adagrad) {
    o.lr_decay = j.at("lr_decay").get<double>();
    o.initial_accumulator_value = j.at("initial_accumulator_value").get<double>();
  }
  if (o.traits().default_eps != 0) o.eps = j.at("eps").get<double>();
  return o;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerOptions& options,
                                                        const std::vector<torch::Tensor>& params) {
  options.validate();
  return make(options.kind(), options.resolved(), params);
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

OptimizerState export_state(torch::optim::Optimizer& optimizer, const std::string& name,
                            const std::vector<torch::Tensor>& params) {
  OptimizerState out;
  const OptimizerKind kind = parse_optimizer_kind(name);
  auto& state = optimizer.state();
  if (state.empty()) return out;
  std::map<std::string, std::vector<torch::Tensor>> parts;
  for (const auto& p : params) {
    auto it = state.find(key_of(p));
    PK_ASSERT(it != state.end());
    if (optimizer_traits(kind).momentum_family) {
      auto& s = static_cast<torch::optim::SGDParamState&>(*it->second);
      parts["momentum_buffer"].push_back(s.momentum_buffer().reshape({-1}));
    } else if (kind == OptimizerKind::Adam) {
      export_adam(static_cast<torch::optim::AdamParamState&>(*it->second), out, parts);
    } else if (kind == OptimizerKind::AdamW) {
      export_adam(static_cast<torch::optim::AdamWParamState&>(*it->second), out, parts);
    } else if (kind == OptimizerKind::RMSprop) {
      auto& s = static_cast<torch::optim::RMSpropParamState&>(*it->second);
      out.step = s.step();
      parts["square_avg"].push_back(s.square_avg().reshape({-1}));
      if (s.grad_avg().defined()) parts["grad_avg"].push_back(s.grad_avg().reshape({-1}));
      if (s.momentum_buffer().defined()) parts["momentum_buffer"].push_back(s.momentum_buffer().reshape({-1}));
    } else if (kind == OptimizerKind::Adagrad) {
      auto& s = static_cast<torch::optim::AdagradParamState&>(*it->second);
      if (s.step() == 0) return out;  // the constructor's state, before any step: as empty as the others'
      out.step = s.step();
      parts["sum"].push_back(s.sum().reshape({-1}));
    }
  }
  for (auto& [key, list] : parts) out.buffers[key] = torch::cat(list).clone();
  return out;
}

void import_state(torch::optim::Optimizer& optimizer, const std::string& name,
                  const std::vector<torch::Tensor>& params, const OptimizerState& state) {
  const OptimizerKind kind = parse_optimizer_kind(name);
  auto& map = optimizer.state();
  map.clear();
  if (state.empty()) {
    if (kind == OptimizerKind::Adagrad) {
      for (const auto& p : params) map[key_of(p)] = initial_adagrad_state(optimizer, p);
    }
    return;
  }
  auto buffer = [&](const std::string& key) -> const torch::Tensor& {
    auto it = state.buffers.find(key);
    PK_CHECK(it != state.buffers.end(), "optimizer state for '" << name << "' lacks buffer '" << key << "'");
    return it->second;
  };
  int64_t offset = 0;
  for (const auto& p : params) {
    auto slice = [&](const std::string& key) {
      const torch::Tensor& flat = buffer(key);
      PK_CHECK(flat.numel() >= offset + p.numel(), "optimizer buffer '" << key << "' has "
                                                        << flat.numel() << " values, too few for the parameters");
      return flat.narrow(0, offset, p.numel()).view(p.sizes()).clone();
    };
    if (optimizer_traits(kind).momentum_family) {
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(slice("momentum_buffer"));
      map[key_of(p)] = std::move(s);
    } else if (kind == OptimizerKind::Adam) {
      map[key_of(p)] = make_adam_state<torch::optim::AdamParamState>(state.step, slice);
    } else if (kind == OptimizerKind::AdamW) {
      map[key_of(p)] = make_adam_state<torch::optim::AdamWParamState>(state.step, slice);
    } else if (kind == OptimizerKind::RMSprop) {
      auto s = std::make_unique<torch::optim::RMSpropParamState>();
      s->step(state.step);
      s->square_avg(slice("square_avg"));
      if (state.buffers.count("grad_avg")) s->grad_avg(slice("grad_avg"));
      if (state.buffers.count("momentum_buffer")) s->momentum_buffer(slice("momentum_buffer"));
      map[key_of(p)] = std::move(s);
    } else if (kind == OptimizerKind::Adagrad) {
      auto s = std::make_unique<torch::optim::AdagradParamState>();
      s->step(state.step);
      s->sum(slice("sum"));
      map[key_of(p)] = std::move(s);
    } else {
      PK_THROW("optimizer '" << name << "' keeps no state, but state was given");
    }
    offset += p.numel();
  }
}

}  // namespace pathkernel

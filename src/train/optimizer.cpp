// The optimizer registry and flat optimizer state.
#include "pathkernel/optimizer.h"

#include <c10/util/string_utils.h>

#include <functional>

#include "pathkernel/error.h"

namespace pathkernel {

namespace {
using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(
    const OptimizerOptions&, const std::vector<torch::Tensor>&)>;

std::unique_ptr<torch::optim::Optimizer> make_sgd(const OptimizerOptions& o,
                                                  const std::vector<torch::Tensor>& params,
                                                  double momentum, bool nesterov) {
  auto opts = torch::optim::SGDOptions(o.lr).momentum(momentum).weight_decay(o.weight_decay).nesterov(nesterov);
  if (momentum != 0 && !nesterov) opts.dampening(o.dampening);
  return std::make_unique<torch::optim::SGD>(params, opts);
}

const std::vector<std::pair<std::string, Factory>>& registry() {
  static const std::vector<std::pair<std::string, Factory>> r = {
      {"gd", [](auto& o, auto& p) { return make_sgd(o, p, 0.0, false); }},
      {"sgd", [](auto& o, auto& p) { return make_sgd(o, p, 0.0, false); }},
      {"momentum", [](auto& o, auto& p) { return make_sgd(o, p, o.momentum, false); }},
      {"nesterov", [](auto& o, auto& p) { return make_sgd(o, p, o.momentum, true); }},
      {"adam",
       [](auto& o, auto& p) -> std::unique_ptr<torch::optim::Optimizer> {
         return std::make_unique<torch::optim::Adam>(
             p, torch::optim::AdamOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(o.weight_decay));
       }},
      {"adamw",
       [](auto& o, auto& p) -> std::unique_ptr<torch::optim::Optimizer> {
         return std::make_unique<torch::optim::AdamW>(
             p, torch::optim::AdamWOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(o.weight_decay));
       }},
  };
  return r;
}

bool is_adam(const std::string& name) { return name == "adam" || name == "adamw"; }
bool has_momentum(const std::string& name) { return name == "momentum" || name == "nesterov"; }

std::string joined_names() {
  std::string s;
  for (auto& n : optimizer_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
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
}  // namespace

std::vector<std::string> optimizer_names() {
  std::vector<std::string> names;
  for (auto& [name, _] : registry()) names.push_back(name);
  return names;
}

bool is_full_batch(const std::string& name) { return name == "gd"; }

void OptimizerOptions::validate() const {
  bool known = false;
  for (auto& n : optimizer_names()) known |= n == name;
  PK_CHECK(known, "unknown optimizer '" << name << "': expected one of " << joined_names());
  PK_CHECK(std::isfinite(lr) && lr > 0, "learning rate must be > 0 (got " << lr << ")");
  PK_CHECK(weight_decay >= 0, "weight decay must be >= 0 (got " << weight_decay << ")");
  if (has_momentum(name)) {
    PK_CHECK(momentum > 0 && momentum < 1, "momentum must be in (0, 1) (got " << momentum << ")");
    PK_CHECK(dampening >= 0 && dampening < 1, "dampening must be in [0, 1) (got " << dampening << ")");
    PK_CHECK(!(name == "nesterov" && dampening != 0), "nesterov needs dampening 0 (got " << dampening << ")");
  }
  if (is_adam(name)) {
    PK_CHECK(beta1 >= 0 && beta1 < 1, "beta1 must be in [0, 1) (got " << beta1 << ")");
    PK_CHECK(beta2 >= 0 && beta2 < 1, "beta2 must be in [0, 1) (got " << beta2 << ")");
    PK_CHECK(eps > 0, "eps must be > 0 (got " << eps << ")");
  }
}

nlohmann::ordered_json OptimizerOptions::to_json() const {
  nlohmann::ordered_json j;
  j["name"] = name;
  j["lr"] = lr;
  if (has_momentum(name)) {
    j["momentum"] = momentum;
    j["dampening"] = dampening;
  }
  if (is_adam(name)) {
    j["beta1"] = beta1;
    j["beta2"] = beta2;
    j["eps"] = eps;
  }
  j["weight_decay"] = weight_decay;
  return j;
}

OptimizerOptions OptimizerOptions::from_json(const nlohmann::ordered_json& j) {
  OptimizerOptions o;
  o.name = j.at("name").get<std::string>();
  o.lr = j.at("lr").get<double>();
  o.weight_decay = j.at("weight_decay").get<double>();
  if (has_momentum(o.name)) {
    o.momentum = j.at("momentum").get<double>();
    o.dampening = j.at("dampening").get<double>();
  }
  if (is_adam(o.name)) {
    o.beta1 = j.at("beta1").get<double>();
    o.beta2 = j.at("beta2").get<double>();
    o.eps = j.at("eps").get<double>();
  }
  return o;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerOptions& options,
                                                        const std::vector<torch::Tensor>& params) {
  options.validate();
  for (auto& [name, factory] : registry()) {
    if (name == options.name) return factory(options, params);
  }
  PK_THROW("unknown optimizer '" << options.name << "': expected one of " << joined_names());
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

OptimizerState export_state(torch::optim::Optimizer& optimizer, const std::string& name,
                            const std::vector<torch::Tensor>& params) {
  OptimizerState out;
  auto& state = optimizer.state();
  if (state.empty()) return out;
  std::map<std::string, std::vector<torch::Tensor>> parts;
  for (const auto& p : params) {
    auto it = state.find(key_of(p));
    PK_ASSERT(it != state.end());
    if (has_momentum(name)) {
      auto& s = static_cast<torch::optim::SGDParamState&>(*it->second);
      parts["momentum_buffer"].push_back(s.momentum_buffer().reshape({-1}));
    } else if (name == "adam") {
      export_adam(static_cast<torch::optim::AdamParamState&>(*it->second), out, parts);
    } else if (name == "adamw") {
      export_adam(static_cast<torch::optim::AdamWParamState&>(*it->second), out, parts);
    }
  }
  for (auto& [key, list] : parts) out.buffers[key] = torch::cat(list).clone();
  return out;
}

void import_state(torch::optim::Optimizer& optimizer, const std::string& name,
                  const std::vector<torch::Tensor>& params, const OptimizerState& state) {
  auto& map = optimizer.state();
  map.clear();
  if (state.empty()) return;
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
    if (has_momentum(name)) {
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(slice("momentum_buffer"));
      map[key_of(p)] = std::move(s);
    } else if (name == "adam") {
      map[key_of(p)] = make_adam_state<torch::optim::AdamParamState>(state.step, slice);
    } else if (name == "adamw") {
      map[key_of(p)] = make_adam_state<torch::optim::AdamWParamState>(state.step, slice);
    } else {
      PK_THROW("optimizer '" << name << "' keeps no state, but state was given");
    }
    offset += p.numel();
  }
}

}  // namespace pathkernel

// Spec parsing, network construction and the flat parameter vector.
#include "pathkernel/model.h"
#include "pathkernel/pieced_linear.h"

#include <algorithm>
#include <filesystem>

#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>

#include "pathkernel/dropout.h"
#include "pathkernel/error.h"
#include "pathkernel/layer_spec.h"
#include "pathkernel/layer_table.h"
#include "pathkernel/sequence.h"
#include "pathkernel/script_graph.h"
#include "pathkernel/script_pool.h"
#include "pathkernel/text.h"

namespace pathkernel {

namespace {
const char kGrammar[] =
    "expected mlp:H1[,H2...][:relu|tanh|gelu], cnn:C1[,C2...], torchscript:PATH or layers:L1,L2,..., e.g. "
    "mlp:128, cnn:8,16, torchscript:model.pt or layers:conv(8,3,padding=1),relu,avgpool(2)";


int64_t parse_width(const std::string& text, const std::string& spec) {
  PK_CHECK(!text.empty() && text.find_first_not_of("0123456789") == std::string::npos,
           "bad model spec '" << spec << "': width '" << text << "' is not a positive integer; "
                              << kGrammar);
  int64_t w = 0;
  try {
    w = std::stoll(text);
  } catch (const std::exception&) {
    PK_THROW("bad model spec '" << spec << "': width '" << text << "' is out of range");
  }
  PK_CHECK(w >= 1 && w <= (int64_t(1) << 24),
           "bad model spec '" << spec << "': width " << w << " must be in [1, 16777216]");
  return w;
}
}  // namespace

ModelSpec ModelSpec::parse(const std::string& spec) {
  const std::string script_prefix = "torchscript:";
  if (spec.rfind(script_prefix, 0) == 0) {
    ModelSpec m;
    m.kind = "torchscript";
    m.path = spec.substr(script_prefix.size());
    PK_CHECK(!m.path.empty(), "bad model spec '" << spec << "': no module file after 'torchscript:'; " << kGrammar);
    return m;
  }
  const std::string layers_prefix = "layers:";
  if (spec.rfind(layers_prefix, 0) == 0) {
    ModelSpec m;
    m.kind = "layers";
    m.layers = spec.substr(layers_prefix.size());
    check_layer_list(m.layers);
    return m;
  }
  std::vector<std::string> parts = split(spec, ':');
  PK_CHECK(parts.size() == 2 || parts.size() == 3, "bad model spec '" << spec << "': " << kGrammar);
  ModelSpec m;
  m.kind = parts[0];
  PK_CHECK(m.kind == "mlp" || m.kind == "cnn",
           "bad model spec '" << spec << "': unknown model kind '" << m.kind
                              << "': expected one of mlp, cnn, torchscript, layers");
  if (parts[1].empty()) parse_width("", spec);  // throws: no widths
  for (const std::string& w : split(parts[1], ',')) m.widths.push_back(parse_width(w, spec));
  m.activation = parts.size() == 3 ? parts[2] : "relu";
  if (m.kind == "mlp") {
    PK_CHECK(m.activation == "relu" || m.activation == "tanh" || m.activation == "gelu",
             "bad model spec '" << spec << "': unknown activation '" << m.activation
                                << "': expected one of relu, tanh, gelu");
  } else {
    PK_CHECK(m.activation == "relu", "bad model spec '" << spec << "': cnn blocks use relu (got '"
                                                        << m.activation << "')");
  }
  return m;
}

std::string ModelSpec::str() const {
  if (is_torchscript()) return kind + ":" + path;
  if (kind == "layers") return kind + ":" + layers;
  std::string s = kind + ":";
  for (size_t i = 0; i < widths.size(); ++i) s += (i ? "," : "") + std::to_string(widths[i]);
  if (kind == "mlp" && activation != "relu") s += ":" + activation;
  return s;
}

/// A loaded TorchScript module, and a copy of its forward graph that also
/// returns the inputs of its ReLUs (the kink sites).
struct ScriptModule {
  torch::jit::Module module;
  std::unique_ptr<torch::jit::GraphExecutor> forward;     ///< its inlined graph, when it has dropout
  std::unique_ptr<torch::jit::GraphExecutor> with_sites;
  std::vector<int64_t> site_windows;  ///< per kink site: its fused max-pool's window, or 0
  std::vector<bool> site_leaky;       ///< per kink site: a leaky ReLU of slope > 0
  std::unique_ptr<ScriptGraph> graph;  ///< the structured route, if every parameter has a rule
  std::string graph_refusal;           ///< why not, otherwise
  /// The BatchNorm submodules that were in training mode when loaded: their
  /// batch statistics couple a batch's examples (batch_statistics.h).
  std::vector<torch::jit::Module> batch_norms;
};

namespace {

/// How messages name a module: its file, or its layer list.
std::string label(const ModelSpec& spec) { return spec.is_torchscript() ? spec.path : spec.str(); }

/// The class name of a TorchScript submodule, e.g. "BatchNorm2d".
std::string module_type(const torch::jit::Module& m) {
  const auto name = m.type()->name();
  return name ? name->name() : "?";
}

/// Whether a module's class is one of torch.nn's BatchNorm kinds
/// (BatchNorm1d/2d/3d, their Lazy forms, SyncBatchNorm), not merely a name
/// that contains the word.
bool is_batch_norm(const std::string& type) {
  for (const char* kind : {"BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LazyBatchNorm1d", "LazyBatchNorm2d",
                           "LazyBatchNorm3d", "SyncBatchNorm"}) {
    if (type == kind) return true;
  }
  return false;
}

/// Refuses a BatchNorm module in training mode whose decomposition is not
/// exact: one that keeps no running statistics (eval mode would normalise a
/// test input by its own batch), or SyncBatchNorm (statistics across
/// processes pathkernel does not see).
void check_batch_norm(const torch::jit::Module& bn, const std::string& path, const std::string& name,
                      const std::string& type) {
  PK_CHECK(type.find("Sync") == std::string::npos,
           "model '" << path << "': module '" << name << "' (" << type << ") is in training mode: its batch "
                     << "statistics are gathered across processes pathkernel does not see, so no training step "
                     << "could be recomputed. Convert it to nn.BatchNorm1d/2d (torch.nn.SyncBatchNorm has no "
                     << "inverse; build the model with nn.BatchNorm2d), or call .eval() on it before exporting");
  const bool tracks = !bn.hasattr("track_running_stats") || bn.attr("track_running_stats").toBool();
  PK_CHECK(tracks && bn.hasattr("running_mean") && bn.attr("running_mean").isTensor(),
           "model '" << path << "': module '" << name << "' (" << type << ") is in training mode with "
                     << "track_running_stats=False: in eval mode it would normalise a test input by the "
                     << "statistics of the inputs evaluated with it, so a test output is not a function of "
                     << "that input alone. Use track_running_stats=True (the default), or call .eval() on it "
                     << "before exporting");
}

}  // namespace

bool NetworkImpl::batch_statistics() const { return script_ && !script_->batch_norms.empty(); }

void NetworkImpl::set_batch_norm_training(bool on) {
  if (!script_) return;
  for (torch::jit::Module& bn : script_->batch_norms) bn.train(on);
}

bool NetworkImpl::batch_norm_training() const {
  return batch_statistics() && script_->batch_norms.front().is_training();
}

std::vector<torch::Tensor> NetworkImpl::module_buffers() const {
  std::vector<torch::Tensor> out;
  if (!script_) return out;
  for (const auto& b : script_->module.named_buffers()) out.push_back(b.value);
  return out;
}

void NetworkImpl::load_script() {
  // The plain interpreter: no graph optimisation or fusion, so every call
  // runs the same ATen operations (training, replay and the engine agree
  // bit for bit).
  torch::jit::setGraphExecutorOptimize(false);
  script_ = std::make_shared<ScriptModule>();
  const ModelSpec& spec = options_.spec;
  // Messages name the module file, or the layer list.
  const std::string path = spec.is_torchscript() ? spec.path : spec.str();
  if (spec.kind == "layers") {
    try {
      script_->module = build_layer_module(spec.layers, options_.input_shape, options_.num_classes,
                                           options_.integer_inputs);
    } catch (const Error& e) {
      PK_THROW("model '" << path << "': " << e.what());
    }
  } else {
    PK_CHECK(std::filesystem::is_regular_file(path), "model file '" << path << "' does not exist or is not a file");
    try {
      script_->module = torch::jit::load(path);
    } catch (const c10::Error& e) {
      std::string what = e.what_without_backtrace();
      PK_THROW("cannot load model '" << path << "': it is not a TorchScript module (save one from Python with "
                                     << "torch.jit.script(model).save(PATH) or torch.jit.trace(model, example)"
                                     << ".save(PATH); examples/export_model.py shows how): "
                                     << what.substr(0, what.find('\n')));
    }
  }
  torch::jit::Module& m = script_->module;
  for (const auto& sub : m.named_modules()) {
    const std::string type = module_type(sub.value), name = sub.name.empty() ? "<top>" : sub.name;
    if (is_batch_norm(type) && sub.value.is_training()) {
      check_batch_norm(sub.value, path, name, type);
      script_->batch_norms.push_back(sub.value);
    }
    // nn.Dropout is seeded (dropout.h); the variants that drop whole
    // channels or keep self-normalisation are not.
    PK_CHECK(!(type.find("Dropout") != std::string::npos && type != "Dropout" && sub.value.is_training()),
             "model '" << path << "': module '" << name << "' (" << type << ") is in training mode: pathkernel "
                       << "draws seeded masks for nn.Dropout only; use nn.Dropout, or call .eval() on it "
                       << "before exporting (it then passes its input through)");
  }
  // Floating-point parameters and buffers in the network's dtype; integer
  // buffers (positions, counters) stay as they are.
  for (const auto& b : m.named_buffers()) {
    if (b.value.is_floating_point()) b.value.set_data(b.value.to(options_.dtype));
  }
  for (const auto& p : m.named_parameters()) {
    PK_CHECK(p.value.is_floating_point(), "model '" << path << "': parameter '" << p.name << "' has dtype "
                                                    << p.value.scalar_type() << ", expected floating point");
    PK_CHECK(p.value.requires_grad(), "model '" << path << "': parameter '" << p.name
                                                << "' does not require gradients (frozen); pathkernel trains "
                                                << "every parameter: register it as a buffer instead");
    torch::Tensor t = p.value;
    t.set_data(t.to(options_.dtype));
    std::string name = p.name;
    std::replace(name.begin(), name.end(), '.', '/');
    register_parameter(name, t);
  }
  PK_CHECK(!parameters().empty(), "model '" << path << "' has no parameters to train");
  // The kink sites: the forward graph with submodule calls inlined and
  // constant branches folded, returning (output, the kink sites at its top
  // level, kink_site_values). ReLUs inside remaining branches or loops are
  // not sites; the certificate catches their kinks where they move the
  // quadrature off f(b) − f(a) (not a flip and its flip back between nodes).
  // A module with dropout or a max-pool runs its inlined graph (below);
  // other modules run their own forward.
  int64_t dropout_sites = 0;
  std::shared_ptr<torch::jit::Graph> g = inlined_forward(m, &dropout_sites);
  if (const torch::jit::Node* random = unseeded_random_op(*g, m)) {
    PK_THROW("model '" << path << "': its forward draws random numbers with " << random->kind().toQualString()
                       << ", which pathkernel cannot draw again when it replays the path, so no training step "
                       << "could be recomputed. pathkernel seeds aten::dropout only (nn.Dropout, F.dropout); "
                       << "use it instead, or call .eval() on the module before exporting if the randomness is "
                       << "a dropout variant (it then passes its input through)");
  }
  // The network runs its own copy of the graph where dropout is seeded or
  // max-pools are pathkernel's (script_pool.h); the kink sites are read from
  // LibTorch's pools.
  std::shared_ptr<torch::jit::Graph> run = g->copy();
  const int64_t hand_pooled = hand_pools(*run);
  if (dropout_sites > 0 || hand_pooled > 0) {
    script_->forward = std::make_unique<torch::jit::GraphExecutor>(run, "pathkernel_forward");
  }
  const std::vector<torch::jit::Value*> sites = kink_site_values(g, script_->site_windows, script_->site_leaky);
  std::vector<torch::jit::Value*> values{g->outputs()[0]};
  values.insert(values.end(), sites.begin(), sites.end());
  torch::jit::Node* tuple = g->createTuple(values);
  g->insertNode(tuple);
  g->eraseOutput(0);
  g->registerOutput(tuple->output());
  script_->with_sites = std::make_unique<torch::jit::GraphExecutor>(g, "pathkernel_kink_sites");
  script_->graph = ScriptGraph::read(m, script_->graph_refusal);
  layers_.push_back({LayerDesc::Kind::Module, path, 0, 0, 0, 0});
  if (options_.output == OutputMap::LogSoftmax) layers_.push_back({LayerDesc::Kind::LogSoftmax, "", 0, 0, 0, 0});
}

NetworkImpl::NetworkImpl(const NetworkOptions& options) : options_(options) {
  using Kind = LayerDesc::Kind;
  const ModelSpec& spec = options.spec;
  PK_CHECK(options.num_classes >= 2, "a classifier needs >= 2 classes (got " << options.num_classes << ")");
  PK_CHECK(!options.input_shape.empty(), "input shape is empty");
  PK_CHECK(options.sequence_length == 0 || spec.is_module(),
           "the data are sequences (labels [n, " << options.sequence_length << "]), which need a module whose "
               << "outputs are [n, T, V] (torchscript:PATH or layers:...); model '" << spec.str()
               << "' outputs [n, K]");
  if (spec.is_module()) {
    load_script();
    return;
  }
  Kind act = spec.activation == "tanh" ? Kind::Tanh : spec.activation == "gelu" ? Kind::GELU : Kind::ReLU;

  auto add_linear = [&](const std::string& name, int64_t in, int64_t out) {
    linears_.push_back(register_module(name, torch::nn::Linear(in, out)));
    layers_.push_back({Kind::Linear, name, in, out, 0, 0});
  };

  int64_t features = 1;
  for (int64_t d : options.input_shape) features *= d;
  if (spec.kind == "mlp") {
    if (options.input_shape.size() > 1) layers_.push_back({Kind::Flatten, "", 0, 0, 0, 0});
    int64_t in = features;
    for (size_t i = 0; i < spec.widths.size(); ++i) {
      add_linear("fc" + std::to_string(i + 1), in, spec.widths[i]);
      layers_.push_back({act, "", 0, 0, 0, 0});
      in = spec.widths[i];
    }
    add_linear("out", in, options.num_classes);
  } else {
    PK_CHECK(options.input_shape.size() == 3,
             "model 'cnn' needs image inputs of shape [C,H,W] (got " << options.input_shape.size()
                                                                     << "-D inputs); use mlp");
    int64_t c = options.input_shape[0], h = options.input_shape[1], w = options.input_shape[2];
    for (size_t i = 0; i < spec.widths.size(); ++i) {
      std::string name = "conv" + std::to_string(i + 1);
      convs_.push_back(register_module(
          name, torch::nn::Conv2d(torch::nn::Conv2dOptions(c, spec.widths[i], 3).padding(1))));
      layers_.push_back({Kind::Conv2d, name, c, spec.widths[i], 3, 1});
      layers_.push_back({Kind::ReLU, "", 0, 0, 0, 0});
      layers_.push_back({Kind::MaxPool2d, "", 0, 0, 2, 0});
      c = spec.widths[i];
      h /= 2;
      w /= 2;
      PK_CHECK(h >= 1 && w >= 1, "model '" << spec.str() << "' has too many pooling blocks for "
                                           << options.input_shape[1] << "x" << options.input_shape[2]
                                           << " inputs");
    }
    layers_.push_back({Kind::Flatten, "", 0, 0, 0, 0});
    add_linear("out", c * h * w, options.num_classes);
  }
  if (options.output == OutputMap::LogSoftmax) layers_.push_back({Kind::LogSoftmax, "", 0, 0, 0, 0});
}

torch::Tensor NetworkImpl::forward(torch::Tensor x) {
  using Kind = LayerDesc::Kind;
  if (script_) {
    const int64_t n = x.size(0);
    c10::IValue out;
    if (script_->forward) {
      torch::jit::Stack stack{script_->module._ivalue(), script_input(x)};
      script_->forward->run(stack);
      out = stack.back();
    } else {
      out = script_->module.forward({script_input(x)});
    }
    PK_CHECK(out.isTensor(), "model '" << label(options_.spec) << "' returned a " << out.tagKind()
                                       << ", expected one tensor of logits [n, K]");
    torch::Tensor y = out.toTensor();
    check_output_shape(y, n);
    PK_CHECK(y.scalar_type() == options_.dtype, "model '" << label(options_.spec) << "' returned "
                                                          << y.scalar_type() << " outputs, expected "
                                                          << options_.dtype
                                                          << ": its forward creates tensors of a fixed dtype; "
                                                          << "create them like its inputs or weights");
    return script_output(y);
  }
  size_t next_linear = 0, next_conv = 0;
  for (const LayerDesc& layer : layers_) {
    switch (layer.kind) {
      case Kind::Linear:
      case Kind::Conv2d: {
        if (trace_) trace_->inputs.push_back(x);
        if (layer.kind == Kind::Linear) {
          const torch::nn::Linear& fc = linears_[next_linear++];
          x = pieced_linear(x, fc->weight, fc->bias, options_.linear_pieces);
        } else {
          x = convs_[next_conv++]->forward(x);
        }
        if (trace_ && x.requires_grad()) {
          auto signal = std::make_shared<torch::Tensor>();
          x.register_hook([signal](const torch::Tensor& g) { *signal = g.contiguous(); });
          trace_->signals.push_back(std::move(signal));
        }
        break;
      }
      default: x = apply_parameter_free(layer, x); break;
    }
  }
  return x;
}

torch::Tensor NetworkImpl::script_input(const torch::Tensor& x) const {
  return options_.integer_inputs ? x.to(torch::kLong) : x;
}

torch::Tensor NetworkImpl::script_output(const torch::Tensor& logits) const {
  return options_.output == OutputMap::LogSoftmax ? torch::log_softmax(logits, -1) : logits;
}

void NetworkImpl::check_output_shape(const torch::Tensor& y, int64_t n) const {
  const int64_t T = options_.sequence_length, K = options_.num_classes;
  if (T > 0) {
    PK_CHECK(y.dim() == 3 && y.size(0) == n && y.size(1) == T && y.size(2) == K,
             "model '" << label(options_.spec) << "' returned shape " << y.sizes() << " for " << n
                       << " sequences, expected [" << n << ", " << T << ", " << K
                       << "] (the data's labels are tokens [n, " << T << "]: one logit per token of the "
                       << "vocabulary at every position)");
    return;
  }
  PK_CHECK(y.dim() == 2 && y.size(0) == n && y.size(1) == K,
           "model '" << label(options_.spec) << "' returned shape " << y.sizes() << " for " << n
                     << " inputs, expected [" << n << ", " << K << "] (one logit per class of the data)");
}

torch::Tensor NetworkImpl::forward_at_position(const torch::Tensor& x) {
  return at_position(forward(x), options_.position);
}

int64_t NetworkImpl::kink_sites() const {
  PK_ASSERT(script_);
  return static_cast<int64_t>(script_->site_windows.size());
}

const ScriptGraph* NetworkImpl::script_graph() const {
  PK_ASSERT(script_);
  return script_->graph.get();
}

const std::string& NetworkImpl::script_graph_refusal() const {
  PK_ASSERT(script_);
  return script_->graph_refusal;
}

NetworkImpl::SegmentOutputs NetworkImpl::forward_segment(const torch::Tensor& x, const torch::Tensor& t,
                                                         const std::vector<torch::Tensor>& directions) {
  PK_ASSERT(script_ && script_->graph);
  ScriptPass p = script_->graph->run(script_->module, script_input(x), t, directions);
  return {script_output(p.logits), p.logits, std::move(p.inputs), std::move(p.outputs), std::move(p.sites)};
}

std::pair<torch::Tensor, std::vector<torch::Tensor>> NetworkImpl::forward_with_sites(const torch::Tensor& x) {
  PK_ASSERT(script_);
  torch::NoGradGuard guard;
  torch::jit::Stack stack{script_->module._ivalue(), script_input(x)};
  script_->with_sites->run(stack);
  const auto tuple = stack.back().toTuple();
  const auto& elements = tuple->elements();
  torch::Tensor y = elements[0].toTensor();
  std::vector<torch::Tensor> sites;
  for (size_t i = 1; i < elements.size(); ++i) {
    sites.push_back(site_rows(elements[i].toTensor(), x.size(0), script_->site_windows[i - 1]));
  }
  return {script_output(y), sites};
}

const std::vector<int64_t>& NetworkImpl::kink_site_windows() const {
  PK_ASSERT(script_);
  return script_->site_windows;
}

const std::vector<bool>& NetworkImpl::kink_site_leaky() const {
  PK_ASSERT(script_);
  return script_->site_leaky;
}

torch::Tensor apply_parameter_free(const LayerDesc& layer, const torch::Tensor& x) {
  const LayerRule& rule = layer_rule(layer.kind);
  PK_ASSERT(rule.apply && "apply_parameter_free called on a parameterised layer");
  return rule.apply(layer, x);
}

Network build_network(const NetworkOptions& options) {
  PK_CHECK(!(options.zero_last_layer && options.spec.is_torchscript()),
           "zero_last_layer applies to pathkernel's own models; for the TorchScript module '"
               << options.spec.path << "', zero its last layer in Python before exporting");
  torch::manual_seed(options.seed);
  Network net(options);
  net->to(options.dtype);
  if (options.zero_last_layer) {
    torch::NoGradGuard guard;
    for (auto& p : net->named_parameters()) {
      // pathkernel's own models' last layer is "out"; a layer list's, "out_weight" and "out_bias".
      if (p.key().rfind("out.", 0) == 0 || p.key().rfind("out_", 0) == 0) p.value().zero_();
    }
  }
  return net;
}

std::vector<ParamInfo> parameter_layout(Network& net) {
  std::vector<ParamInfo> layout;
  int64_t offset = 0;
  for (auto& p : net->named_parameters()) {
    std::string name = p.key();
    std::replace(name.begin(), name.end(), '/', '.');  // a TorchScript module's own names
    ParamInfo info{name, p.value().sizes().vec(), offset, p.value().numel()};
    offset += info.numel;
    layout.push_back(std::move(info));
  }
  return layout;
}

int64_t parameter_count(Network& net) {
  int64_t n = 0;
  for (auto& p : net->parameters()) n += p.numel();
  return n;
}

torch::Tensor flatten_parameters(Network& net) {
  std::vector<torch::Tensor> flat;
  for (auto& p : net->parameters()) flat.push_back(p.detach().reshape({-1}));
  return torch::cat(flat).clone();
}

void set_flat_parameters(Network& net, const torch::Tensor& flat) {
  int64_t p_count = parameter_count(net);
  PK_CHECK(flat.dim() == 1 && flat.size(0) == p_count,
           "flat parameter vector has shape " << flat.sizes() << ", expected [" << p_count << "]");
  torch::NoGradGuard guard;
  int64_t offset = 0;
  for (auto& p : net->parameters()) {
    p.copy_(flat.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
}

}  // namespace pathkernel

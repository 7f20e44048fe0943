// The "layers:" model spec: a layer list parsed, checked against the shapes it
// receives, and compiled into a TorchScript module.
#include "pathkernel/layer_spec.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include <torch/nn/init.h>

#include "pathkernel/error.h"

namespace pathkernel {

namespace {

const char kLayerGrammar[] =
    "expected layers:L1,L2,... with each L one of linear(OUT), conv(OUT,K[,stride=S][,padding=P][,dilation=D]"
    "[,groups=G]), relu, leakyrelu[(SLOPE)], tanh, gelu, sigmoid, silu, softplus, maxpool(K[,S]), avgpool(K[,S]), "
    "gap, flatten, layernorm, embed(VOCAB,DIM), dropout(P), res(L1,L2,...); e.g. layers:conv(8,3,padding=1),relu,avgpool(2)";

/// One layer of the list: its name, its arguments as written, and for a
/// residual block its own layers.
struct Layer {
  std::string name;
  std::vector<std::string> args;
  std::vector<Layer> body;
};

/// A recursive-descent reader of the list.
class ListReader {
 public:
  explicit ListReader(const std::string& text) : s_(text) {}

  std::vector<Layer> read() {
    std::vector<Layer> layers = list();
    PK_CHECK(pos_ == s_.size(), "bad model spec 'layers:" << s_ << "': unexpected '" << s_.substr(pos_) << "' at "
                                                   << "character " << pos_ + 1 << " of the layer list; " << kLayerGrammar);
    return layers;
  }

 private:
  std::vector<Layer> list() {
    std::vector<Layer> out{item()};
    while (pos_ < s_.size() && s_[pos_] == ',') {
      ++pos_;
      out.push_back(item());
    }
    return out;
  }

  Layer item() {
    Layer l;
    const size_t start = pos_;
    while (pos_ < s_.size() && std::isalpha(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    l.name = s_.substr(start, pos_ - start);
    PK_CHECK(!l.name.empty(), "bad model spec 'layers:" << s_ << "': expected a layer name at character " << start + 1
                                                 << " of the layer list"
                                                 << (start < s_.size() ? " (found '" + s_.substr(start, 1) + "')"
                                                                       : std::string(" (the list ends)"))
                                                 << "; " << kLayerGrammar);
    if (pos_ < s_.size() && s_[pos_] == '(') {
      ++pos_;
      if (l.name == "res") {
        l.body = list();
      } else {
        const size_t a = pos_;
        while (pos_ < s_.size() && s_[pos_] != ')' && s_[pos_] != '(') ++pos_;
        std::string inside = s_.substr(a, pos_ - a);
        std::stringstream ss(inside);
        for (std::string arg; std::getline(ss, arg, ',');) l.args.push_back(arg);
        if (!inside.empty() && inside.back() == ',') l.args.push_back("");
      }
      PK_CHECK(pos_ < s_.size() && s_[pos_] == ')',
               "bad model spec 'layers:" << s_ << "': layer '" << l.name << "' opens '(' without closing it");
      ++pos_;
    }
    return l;
  }

  const std::string& s_;
  size_t pos_ = 0;
};

int64_t to_int(const std::string& layer, const std::string& what, const std::string& text, int64_t lo) {
  PK_CHECK(!text.empty() && text.size() <= 9 && text.find_first_not_of("0123456789") == std::string::npos,
           "layer '" << layer << "': " << what << " '" << text << "' is not an integer >= " << lo);
  const int64_t v = std::stoll(text);
  PK_CHECK(v >= lo, "layer '" << layer << "': " << what << " " << v << " must be >= " << lo);
  return v;
}

/// A finite number written in a layer's arguments.
double to_double(const std::string& layer, const std::string& what, const std::string& text) {
  double v = 0;
  try {
    size_t used = 0;
    v = std::stod(text, &used);
    PK_CHECK(used == text.size(), "");
  } catch (const std::exception&) {
    PK_THROW("layer '" << layer << "': " << what << " '" << text << "' is not a number");
  }
  PK_CHECK(std::isfinite(v), "layer '" << layer << "': " << what << " must be finite");
  return v;
}

/// A number as TorchScript source reads it back exactly.
std::string literal(double v) {
  std::ostringstream s;
  s.precision(17);
  s << v;
  std::string t = s.str();
  return t.find_first_of(".eE") == std::string::npos ? t + ".0" : t;
}

/// Renders a layer as written, for messages.
std::string show(const Layer& l) {
  std::string s = l.name;
  if (!l.body.empty()) {
    s += "(";
    for (size_t i = 0; i < l.body.size(); ++i) s += (i ? "," : "") + show(l.body[i]);
    return s + ")";
  }
  if (!l.args.empty()) {
    s += "(";
    for (size_t i = 0; i < l.args.size(); ++i) s += (i ? "," : "") + l.args[i];
    s += ")";
  }
  return s;
}

std::string int_list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string shape_of(const torch::Tensor& probe) {
  std::vector<int64_t> s(probe.sizes().begin() + 1, probe.sizes().end());
  return int_list(s);
}

/// Compiles the list: each layer is checked against the shape it receives
/// (a one-row probe runs through the same operations), its parameters are
/// drawn, and its line of TorchScript is written.
class Compiler {
 public:
  Compiler(torch::jit::Module& module, bool integer_inputs) : module_(module), integer_inputs_(integer_inputs) {}

  void layers(const std::vector<Layer>& list, bool top) {
    for (size_t i = 0; i < list.size(); ++i) layer(list[i], top && i == 0);
  }

  void final_linear(int64_t classes) {
    if (probe_.dim() > 2) {
      line("h = torch.flatten(h, 1)");
      probe_ = probe_.flatten(1);
    }
    linear("out", classes);
  }

  std::string source() const { return "def forward(self, x):\n    h = x\n" + body_ + "    return h\n"; }

  torch::Tensor probe_;

 private:
  void line(const std::string& s) { body_ += "    " + s + "\n"; }

  void expect_args(const Layer& l, size_t lo, size_t hi) {
    PK_CHECK(l.args.size() >= lo && l.args.size() <= hi && l.body.empty(),
             "layer '" << show(l) << "' takes " << (lo == hi ? std::to_string(lo) : std::to_string(lo) + " to " +
                                                                                        std::to_string(hi))
                       << (hi == 1 ? " argument" : " arguments") << " (got " << (l.body.empty() ? l.args.size() : l.body.size()) << "); "
                       << kLayerGrammar);
  }

  void expect_image(const Layer& l) {
    PK_CHECK(probe_.dim() == 4, "layer '" << show(l) << "' needs [C,H,W] inputs, but receives "
                                          << shape_of(probe_) << "; put it before flatten, linear or gap");
  }

  std::string param(const std::string& name, torch::Tensor value) {
    module_.register_parameter(name, value.requires_grad_(true), /*is_buffer=*/false);
    return "self." + name;
  }

  void linear(const std::string& name, int64_t out) {
    const int64_t in = probe_.size(-1);
    torch::Tensor w = torch::empty({out, in}, torch::kFloat32), b = torch::empty({out}, torch::kFloat32);
    torch::nn::init::kaiming_uniform_(w, std::sqrt(5.0));
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    b.uniform_(-bound, bound);
    w = w.to(torch::kFloat64);
    b = b.to(torch::kFloat64);
    const std::string wn = param(name + "_weight", w), bn = param(name + "_bias", b);  // in this order
    line("h = torch.linear(h, " + wn + ", " + bn + ")");
    probe_ = torch::linear(probe_, w, b);
  }

  void layer(const Layer& l, bool first) {
    const std::string& n = l.name;
    PK_CHECK(n == "res" || l.body.empty(), "layer '" << show(l) << "': only res(...) holds layers");
    PK_CHECK(first || n != "embed", "layer '" << show(l) << "': embed must be the first layer (it reads the "
                                                          << "token ids)");
    PK_CHECK(!first || (n == "embed") == integer_inputs_,
             (integer_inputs_ ? "the data's inputs are integer codes (token ids): the first layer must be "
                                "embed(VOCAB,DIM), not '" + show(l) + "'"
                              : "layer '" + show(l) + "': embed reads integer token ids, but the data's inputs "
                                "are not integer codes"));
    if (n == "linear") {
      expect_args(l, 1, 1);
      linear("linear" + std::to_string(++count_), to_int(show(l), "width", l.args[0], 1));
    } else if (n == "conv") {
      conv(l);
    } else if (n == "relu" || n == "tanh" || n == "gelu" || n == "sigmoid" || n == "silu" || n == "softplus") {
      expect_args(l, 0, 0);
      line("h = torch." + n + "(h)");
      probe_ = n == "relu"      ? torch::relu(probe_)
               : n == "tanh"    ? torch::tanh(probe_)
               : n == "gelu"    ? torch::gelu(probe_)
               : n == "sigmoid" ? torch::sigmoid(probe_)
               : n == "silu"    ? torch::silu(probe_)
                                : torch::softplus(probe_);
    } else if (n == "leakyrelu") {
      expect_args(l, 0, 1);
      const double slope = l.args.empty() ? 0.01 : to_double(show(l), "slope", l.args[0]);
      line("h = torch.leaky_relu(h, " + literal(slope) + ")");
      probe_ = torch::leaky_relu(probe_, slope);
    } else if (n == "dropout") {
      expect_args(l, 1, 1);
      const double p = to_double(show(l), "probability", l.args[0]);
      PK_CHECK(p >= 0 && p < 1, "layer '" << show(l) << "': probability " << p << " must be in [0, 1)");
      // Seeded masks on the training side only (dropout.h); shape unchanged.
      line("h = torch.dropout(h, " + literal(p) + ", True)");
    } else if (n == "maxpool" || n == "avgpool") {
      expect_args(l, 1, 2);
      expect_image(l);
      const int64_t k = to_int(show(l), "window", l.args[0], 1);
      const int64_t s = l.args.size() > 1 ? to_int(show(l), "stride", l.args[1], 1) : k;
      PK_CHECK(k <= probe_.size(2) && k <= probe_.size(3),
               "layer '" << show(l) << "': window " << k << " is larger than its " << shape_of(probe_) << " input");
      const std::string ks = int_list({k, k}), ss = int_list({s, s});
      if (n == "maxpool") {
        line("h = torch.max_pool2d(h, " + ks + ", " + ss + ")");
        probe_ = torch::max_pool2d(probe_, {k, k}, {s, s});
      } else {
        line("h = torch.avg_pool2d(h, " + ks + ", " + ss + ")");
        probe_ = torch::avg_pool2d(probe_, {k, k}, {s, s});
      }
    } else if (n == "gap") {
      expect_args(l, 0, 0);
      expect_image(l);
      line("h = torch.mean(h, [2, 3])");
      probe_ = probe_.mean({2, 3});
    } else if (n == "flatten") {
      expect_args(l, 0, 0);
      line("h = torch.flatten(h, 1)");
      probe_ = probe_.flatten(1);
    } else if (n == "layernorm") {
      expect_args(l, 0, 0);
      const int64_t d = probe_.size(-1);
      const std::string name = "norm" + std::to_string(++count_);
      torch::Tensor w = torch::ones({d}, torch::kFloat64), b = torch::zeros({d}, torch::kFloat64);
      const std::string wn = param(name + "_weight", w), bn = param(name + "_bias", b);
      line("h = torch.layer_norm(h, [" + std::to_string(d) + "], " + wn + ", " + bn + ", 1e-05, False)");
      probe_ = torch::layer_norm(probe_, {d}, w, b);
    } else if (n == "embed") {
      expect_args(l, 2, 2);
      const int64_t vocab = to_int(show(l), "vocabulary", l.args[0], 1),
                    dim = to_int(show(l), "dimension", l.args[1], 1);
      const std::string name = "embed" + std::to_string(++count_);
      torch::Tensor w = torch::empty({vocab, dim}, torch::kFloat32).normal_().to(torch::kFloat64);
      line("h = torch.embedding(" + param(name + "_weight", w) + ", h, -1, False, False)");
      probe_ = torch::embedding(w, torch::zeros(probe_.sizes(), torch::kLong));
    } else if (n == "res") {
      PK_CHECK(!l.body.empty(), "layer 'res' needs its block's layers, e.g. res(conv(8,3,padding=1),relu)");
      const std::string saved = "r" + std::to_string(++blocks_);
      const std::vector<int64_t> shape = probe_.sizes().vec();
      line(saved + " = h");
      layers(l.body, false);
      PK_CHECK(probe_.sizes().vec() == shape, "layer '" << show(l) << "': the block maps "
                                                        << int_list({shape.begin() + 1, shape.end()}) << " to "
                                                        << shape_of(probe_) << ", but a residual block must keep "
                                                        << "the shape of its input");
      line("h = h + " + saved);
    } else {
      PK_THROW("unknown layer '" << n << "' in '" << show(l) << "'; " << kLayerGrammar);
    }
  }

  void conv(const Layer& l) {
    PK_CHECK(l.args.size() >= 2 && l.args.size() <= 6 && l.body.empty(),
             "layer '" << show(l) << "': expected conv(OUT,K[,stride=S][,padding=P][,dilation=D][,groups=G])");
    expect_image(l);
    const std::string what = show(l);
    const int64_t out = to_int(what, "channels", l.args[0], 1), k = to_int(what, "kernel", l.args[1], 1);
    int64_t stride = 1, padding = 0, dilation = 1, groups = 1;
    for (size_t i = 2; i < l.args.size(); ++i) {
      const std::string& a = l.args[i];
      const size_t eq = a.find('=');
      PK_CHECK(eq != std::string::npos, "layer '" << what << "': argument '" << a << "' should be KEY=VALUE "
                                                  << "with KEY stride, padding, dilation or groups");
      const std::string key = a.substr(0, eq), value = a.substr(eq + 1);
      if (key == "stride") {
        stride = to_int(what, key, value, 1);
      } else if (key == "padding") {
        padding = to_int(what, key, value, 0);
      } else if (key == "dilation") {
        dilation = to_int(what, key, value, 1);
      } else if (key == "groups") {
        groups = to_int(what, key, value, 1);
      } else {
        PK_THROW("layer '" << what << "': unknown argument '" << key << "': expected stride, padding, dilation "
                           << "or groups");
      }
    }
    const int64_t in = probe_.size(1);
    PK_CHECK(in % groups == 0 && out % groups == 0, "layer '" << what << "': groups " << groups << " must divide "
                                                              << "its input channels (" << in << ") and its "
                                                              << "output channels (" << out << ")");
    const int64_t reach = dilation * (k - 1) + 1;
    PK_CHECK(probe_.size(2) + 2 * padding >= reach && probe_.size(3) + 2 * padding >= reach,
             "layer '" << what << "': its kernel reaches " << reach << " pixels, more than its " << shape_of(probe_)
                       << " input with padding " << padding);
    const std::string name = "conv" + std::to_string(++count_);
    torch::Tensor w = torch::empty({out, in / groups, k, k}, torch::kFloat32), b = torch::empty({out}, torch::kFloat32);
    torch::nn::init::kaiming_uniform_(w, std::sqrt(5.0));
    const double bound = 1.0 / std::sqrt(static_cast<double>(in / groups * k * k));
    b.uniform_(-bound, bound);
    w = w.to(torch::kFloat64);
    b = b.to(torch::kFloat64);
    const std::string wn = param(name + "_weight", w), bn = param(name + "_bias", b);
    line("h = torch.conv2d(h, " + wn + ", " + bn + ", " +
         int_list({stride, stride}) + ", " + int_list({padding, padding}) + ", " + int_list({dilation, dilation}) +
         ", " + std::to_string(groups) + ")");
    probe_ = torch::conv2d(probe_, w, b, {stride, stride}, {padding, padding}, {dilation, dilation}, groups);
  }

  torch::jit::Module& module_;
  bool integer_inputs_;
  std::string body_;
  int count_ = 0, blocks_ = 0;
};

}  // namespace

namespace {

void check_names(const std::vector<Layer>& list) {
  static const std::vector<std::string> known{"linear", "conv",    "relu",    "leakyrelu", "tanh",    "gelu",
                                              "sigmoid", "silu",   "softplus", "maxpool",  "avgpool", "gap",
                                              "flatten", "layernorm", "embed", "dropout", "res"};
  for (const Layer& l : list) {
    PK_CHECK(std::find(known.begin(), known.end(), l.name) != known.end(),
             "unknown layer '" << l.name << "' in '" << show(l) << "'; " << kLayerGrammar);
    check_names(l.body);
  }
}

/// The layers of a list whose grammar and names are checked.
std::vector<Layer> read_layer_list(const std::string& layers) {
  PK_CHECK(!layers.empty(), "bad model spec 'layers:': no layers; " << kLayerGrammar);
  std::vector<Layer> list = ListReader(layers).read();
  check_names(list);
  return list;
}

}  // namespace

void check_layer_list(const std::string& layers) { read_layer_list(layers); }

torch::jit::Module build_layer_module(const std::string& layers, const std::vector<int64_t>& input_shape,
                                      int64_t num_classes, bool integer_inputs) {
  const std::vector<Layer> list = read_layer_list(layers);
  torch::jit::Module module(c10::QualifiedName("__torch__.pathkernel.Layers"));
  Compiler c(module, integer_inputs);
  std::vector<int64_t> probe_shape{1};
  probe_shape.insert(probe_shape.end(), input_shape.begin(), input_shape.end());
  c.probe_ = torch::zeros(probe_shape, torch::kFloat64);
  {
    torch::NoGradGuard guard;
    c.layers(list, true);
    c.final_linear(num_classes);
  }
  module.define(c.source());
  return module;
}

}  // namespace pathkernel

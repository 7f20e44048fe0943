// Tests of users' own models: TorchScript modules exported by Python at test
// time, the generic route (autograd) against the structured route and
// against per-example autograd, training, bit-for-bit replay, exact
// decomposition, and the errors for what cannot be decomposed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "pathkernel/decomposition.h"
#include "pathkernel/features.h"
#include "pathkernel/npy.h"
#include "pathkernel/path.h"
#include "pathkernel/run.h"
#include "../test_util.h"
#include "torchscript_util.h"

namespace {

using namespace pathkernel;
using pathkernel::testing::error_message;
using pathkernel::testing::run_shell;
using pathkernel::testing::TempDir;
using namespace pathkernel::testing::script;

/// Saves, as TorchScript at `path`, an MLP laid out like pathkernel's own
/// "mlp:H[:act]" (fc1, out; same parameter order), with `in` inputs and `k` classes.
void export_mlp(const TempDir& dir, const std::string& path, int in, int hidden, int k, const std::string& act) {
  python(dir, "class M(nn.Module):\n"
         "    def __init__(self):\n"
         "        super().__init__()\n"
         "        self.fc1 = nn.Linear(" + std::to_string(in) + ", " + std::to_string(hidden) + ")\n"
         "        self.out = nn.Linear(" + std::to_string(hidden) + ", " + std::to_string(k) + ")\n"
         "    def forward(self, x):\n"
         "        return self.out(torch." + act + "(self.fc1(x.flatten(1))))\n"
         "torch.manual_seed(3)\n"
         "torch.jit.script(M()).save('" + path + "')\n");
}

NetworkOptions options_for(const ModelSpec& spec, int64_t in, int64_t k, OutputMap map) {
  NetworkOptions o;
  o.spec = spec;
  o.input_shape = {in};
  o.num_classes = k;
  o.output = map;
  return o;
}

/// The residual CNN of examples/export_model.py on 8×8 inputs, width 2, 3
/// classes, exported into `dir`, with log-softmax outputs.
NetworkOptions small_resnet(const TempDir& dir) {
  const std::string path = dir.path() + "/resnet.pt";
  const auto r = run_shell(kPython + " " + pathkernel::testing::source_dir() + "/examples/export_model.py resnet " + path +
                           " --size 8 --width 2 --classes 3");
  EXPECT_EQ(r.status, 0) << r.out;
  NetworkOptions o = options_for(ModelSpec::parse("torchscript:" + path), 0, 3, OutputMap::LogSoftmax);
  o.input_shape = {1, 8, 8};
  return o;
}

/// The exact rule on every piece: short pieces take fewer than L nodes where
/// they pass the certificate, so a floor of gauss_nodes makes every piece
/// take the rule's L. A wrong rule or a missed kink fails its piece: the
/// depth cap stops the splitting early. `exact_pieces = false` turns the
/// same options into the adaptive rule they are compared with.
QuadratureOptions exact_rule_options(bool exact_pieces = true) {
  QuadratureOptions q;
  q.min_nodes = q.gauss_nodes;
  q.max_depth = 6;
  q.exact_pieces = exact_pieces;
  return q;
}

/// The generic route (a TorchScript MLP) against the structured route (the
/// same MLP as pathkernel's own) and against per-example autograd: test
/// features, contractions with per-sample gradients, and the output kernel,
/// for both output maps and smooth and piecewise-linear activations.
TEST(TorchScript, GenericRouteAgreesWithStructuredRouteAndAutograd) {
  REQUIRE_PYTHON_TORCH();
  TempDir dir;
  const int64_t in = 5, hidden = 7, K = 3, n = 4, B = 6;
  for (const std::string act : {"tanh", "relu"}) {
    const std::string path = dir.path() + "/mlp_" + act + ".pt";
    export_mlp(dir, path, in, hidden, K, act);
    for (OutputMap map : {OutputMap::LogSoftmax, OutputMap::Logits}) {
      ModelSpec script_spec = ModelSpec::parse("torchscript:" + path);
      ModelSpec own_spec = ModelSpec::parse(act == "tanh" ? "mlp:7:tanh" : "mlp:7");
      Network script = engine_network(options_for(script_spec, in, K, map));
      Network own = engine_network(options_for(own_spec, in, K, map));
      ASSERT_EQ(parameter_count(script), parameter_count(own));
      const std::string where = act + " " + output_map_name(map);
      torch::manual_seed(11);
      const int64_t P = parameter_count(own);
      const torch::Tensor w = flatten_parameters(script);  // the module's own weights
      const torch::Tensor dw = 0.3 * torch::randn({P}, torch::kFloat64);
      const torch::Tensor x = torch::randn({n, in}, torch::kFloat64);
      const torch::Tensor xb = torch::randn({B, in}, torch::kFloat64);
      const torch::Tensor yb = torch::randint(0, K, {B}, torch::kLong);

      SegmentEvaluator gev(script, ModuleRoute::Generic), sev(own), tev(script);
      gev.set_segment(w, dw);
      sev.set_segment(w, dw);
      tev.set_segment(w, dw);
      EXPECT_EQ(gev.route(), "generic");
      EXPECT_EQ(tev.route(), "structured");
      // A fixed rule: the same nodes on both routes; and the reference:
      // per-example autograd at those nodes.
      QuadratureOptions q;
      q.spec = QuadratureSpec::parse("riemann:3");
      TestFeatures gf = test_features(gev, x, q), sf = test_features(sev, x, q), tf = test_features(tev, x, q);
      const torch::Tensor gd = dense_features(gev, gf), sd = dense_features(sev, sf);
      EXPECT_LE(max_rel(dense_features(tev, tf), sd), 1e-12) << where;
      EXPECT_LE(max_rel(contract(tev, tf, train_signals(tev, xb, yb, map)),
                        contract(sev, sf, train_signals(sev, xb, yb, map))), 1e-12) << where;
      Network ref = engine_network(options_for(own_spec, in, K, map));
      torch::Tensor expected = torch::zeros({n, K, P}, torch::kFloat64);
      const QuadratureRule rule = riemann(3);
      for (size_t j = 0; j < rule.nodes.size(); ++j) {
        expected += rule.weights[j] * reference_jacobian(ref, w + rule.nodes[j] * dw, x);
      }
      EXPECT_LE(max_rel(gd, expected), 1e-12) << where;
      EXPECT_LE(max_rel(sd, expected), 1e-12) << where;
      // Contractions with per-sample loss gradients, against explicit loops.
      const torch::Tensor gc = contract(gev, gf, train_signals(gev, xb, yb, map));
      const torch::Tensor sc = contract(sev, sf, train_signals(sev, xb, yb, map));
      torch::Tensor ec = torch::zeros({n, B, K}, torch::kFloat64);
      for (int64_t i = 0; i < B; ++i) {
        const torch::Tensor yi = yb.narrow(0, i, 1);
        const torch::Tensor g = pathkernel::testing::flat_grad(ref, w, xb.narrow(0, i, 1),
                                                   [&](const torch::Tensor& out) { return training_loss(out, yi, map); });
        ec.select(1, i).copy_(torch::matmul(expected, g));
      }
      EXPECT_LE(max_rel(gc, ec), 1e-12) << where;
      EXPECT_LE(max_rel(sc, ec), 1e-12) << where;
      EXPECT_LE(max_rel(output_kernel(gev, gf, xb), output_kernel(sev, sf, xb)), 1e-12) << where;
      EXPECT_LE(max_rel(apply_features(gev, gf, dw), apply_features(sev, sf, dw)), 1e-12) << where;
      if (act == "tanh") {
        // Certified adaptive Gauss on a smooth module: the two routes agree
        // and the certificate holds.
        QuadratureOptions gauss;
        TestFeatures ga = test_features(gev, x, gauss), sa = test_features(sev, x, gauss);
        EXPECT_LE(max_rel(dense_features(gev, ga), dense_features(sev, sa)), 1e-12) << where;
        EXPECT_LE(ga.certificate_gap, 1e-13) << where;
      }
    }
  }
}

/// A transformer (embedding, attention, layer norm, GELU MLP) exported by
/// examples/export_model.py, on integer token data given as npy:DIR: trains
/// with AdamW, replays bit for bit, and decomposes exactly.
TEST(TorchScript, TransformerTrainsReplaysAndDecomposesExactly) {
  REQUIRE_PYTHON_TORCH();
  TempDir dir;
  const std::string model = dir.path() + "/tf.pt", data = dir.path() + "/modadd";
  const auto r = run_shell(kPython + " " + pathkernel::testing::source_dir() + "/examples/export_model.py transformer " + model +
                           " --p 5 --dim 8 --data-dir " + data);
  ASSERT_EQ(r.status, 0) << r.out;
  RunOptions o;
  o.data.spec = "npy:" + data;
  o.model = "torchscript:" + model;
  o.train.optimizer.name = "adamw";
  o.train.optimizer.lr = 0.01;
  o.train.optimizer.weight_decay = 0.1;
  o.train.batch = 4;
  o.train.steps = 9;
  o.train.progress = false;
  o.checkpoint_every = 3;
  o.out = dir.path() + "/run";
  const RunResult result = train_run(o);
  EXPECT_EQ(result.manifest.model_spec, "torchscript:model.pt");
  EXPECT_TRUE(result.manifest.integer_inputs);
  PathReader reader(o.out);
  const ReplayReport report = reader.check();
  EXPECT_EQ(report.mismatches, 0);
  DecompositionOptions d;
  d.progress = false;
  const Decomposition dec = decompose(reader, reader.decoded_dataset().x_test.narrow(0, 0, 3), d);
  const DecompositionSummary s = summarize(dec);
  EXPECT_LE(s.max_rel_error, 1e-12);
  EXPECT_GT(s.max_abs_regularization, 0.0);  // AdamW's decay is attributed, not lost
}

/// The ReLUs inside submodules (a residual block's two) are kink sites, an
/// in-place ReLU included, and splitting at their crossings lets certified
/// Gauss converge without refinement: at most gauss_nodes evaluations per
/// piece between kinks (missed kinks would cost dozens of halvings each).
TEST(TorchScript, FindsTheReLUsOfSubmodulesAsKinkSites) {
  REQUIRE_PYTHON_TORCH();
  TempDir dir;
  const NetworkOptions o = small_resnet(dir);
  Network net = engine_network(o);
  EXPECT_EQ(net->kink_sites(), 3);  // the stem's ReLU and the block's two
  const std::string inplace = dir.path() + "/inplace.pt";
  python(dir, "class M(nn.Module):\n"
              "    def __init__(self):\n"
              "        super().__init__()\n"
              "        self.fc = nn.Linear(4, 5)\n"
              "        self.act = nn.ReLU(inplace=True)\n"
              "        self.out = nn.Linear(5, 3)\n"
              "    def forward(self, x):\n"
              "        return self.out(self.act(self.fc(x)))\n"
              "torch.jit.script(M()).save('" + inplace + "')\n");
  NetworkOptions oi = options_for(ModelSpec::parse("torchscript:" + inplace), 4, 3, OutputMap::LogSoftmax);
  Network in_place = engine_network(oi);
  ASSERT_EQ(in_place->kink_sites(), 1);
  const torch::Tensor xi = torch::randn({1, 4}, torch::kFloat64);
  const auto [out, sites] = in_place->forward_with_sites(xi);
  // The site holds the ReLU's input, signs and all, not its output.
  torch::Tensor pre;
  {
    torch::NoGradGuard guard;
    auto params = in_place->parameters();  // fc.weight, fc.bias, out.weight, out.bias
    pre = torch::addmm(params[1], xi, params[0].t());
  }
  EXPECT_TRUE(torch::allclose(sites[0], pre, 0, 1e-15));
  EXPECT_TRUE(torch::allclose(out, in_place->forward(xi), 0, 1e-15));

  torch::manual_seed(5);
  SegmentEvaluator ev(net, ModuleRoute::Generic);
  const int64_t P = parameter_count(net);
  ev.set_segment(flatten_parameters(net), 0.5 * torch::randn({P}, torch::kFloat64));
  QuadratureOptions q;
  const TestFeatures f = test_features(ev, torch::randn({3, 1, 8, 8}, torch::kFloat64), q);
  EXPECT_GT(f.kinks, 0);
  EXPECT_LE(f.certificate_gap, 1e-13);
  EXPECT_LE(f.evaluations, q.gauss_nodes * (f.kinks + 3)) << f.kinks << " kinks";
}

/// A residual CNN with average pooling is piecewise linear: on the
/// structured route its pieces are integrated exactly (for log-softmax,
/// ⌈L/2⌉ Gauss nodes each and L/2 + 1 moment nodes, L = 4 its parameterised
/// operations), and agree with the generic
/// route's adaptive rule; a module with tanh keeps the adaptive rule.
TEST(TorchScript, PiecewiseLinearModulesIntegrateTheirPiecesExactly) {
  REQUIRE_PYTHON_TORCH();
  TempDir dir;
  const NetworkOptions o = small_resnet(dir);
  Network net = engine_network(o), generic_net = engine_network(o);
  SegmentEvaluator ev(net), gev(generic_net, ModuleRoute::Generic);
  ASSERT_EQ(ev.route(), "structured");
  const int64_t L = static_cast<int64_t>(ev.param_layers().size());
  EXPECT_EQ(ev.polynomial_degree(), L);
  EXPECT_EQ(gev.polynomial_degree(), 0);
  torch::manual_seed(5);
  const int64_t P = parameter_count(net);
  const torch::Tensor w = flatten_parameters(net), dw = 0.05 * torch::randn({P}, torch::kFloat64);
  ev.set_segment(w, dw);
  gev.set_segment(w, dw);
  const torch::Tensor x = torch::randn({3, 1, 8, 8}, torch::kFloat64);
  const TestFeatures f = test_features(ev, x, exact_rule_options());
  EXPECT_LE(f.certificate_gap, 1e-13);
  ASSERT_EQ(L, 4);
  EXPECT_EQ(f.evaluations % 2, 0);
  EXPECT_EQ(f.moment_evaluations * 2, f.evaluations * 3);
  QuadratureOptions tight;
  tight.tol = 1e-15;
  const TestFeatures g = test_features(gev, x, tight);
  EXPECT_LE(max_rel(dense_features(ev, f), dense_features(gev, g)), 1e-12);
  const TestFeatures a = test_features(ev, x, exact_rule_options(false));
  EXPECT_LT(f.evaluations, a.evaluations) << f.kinks << " kinks";

  const std::string tanh_path = dir.path() + "/mlp_tanh.pt";
  export_mlp(dir, tanh_path, 5, 7, 3, "tanh");
  Network smooth = engine_network(options_for(ModelSpec::parse("torchscript:" + tanh_path), 5, 3,
                                              OutputMap::LogSoftmax));
  SegmentEvaluator sev(smooth);
  EXPECT_EQ(sev.route(), "structured");
  EXPECT_EQ(sev.polynomial_degree(), 0);
}

/// A 3-class network of `spec` on 1 × 8 × 8 images, log-softmax outputs.
NetworkOptions pooled_cnn_options(const std::string& spec) {
  NetworkOptions o;
  o.spec = ModelSpec::parse(spec);
  o.input_shape = {1, 8, 8};
  o.num_classes = 3;
  o.output = OutputMap::LogSoftmax;
  return o;
}

/// The generic route on `net` at segment (w, dw): certified Gauss keeps its
/// certificate, agrees with `expected` (dense features of x) and, its scan
/// seeing every switch at the kink sites, converges without refining (a
/// missed switch costs dozens of halvings).
void expect_generic_route_agrees(Network& net, const torch::Tensor& w, const torch::Tensor& dw,
                                 const torch::Tensor& x, const torch::Tensor& expected, const std::string& spec) {
  SegmentEvaluator gev(net, ModuleRoute::Generic);
  gev.set_segment(w, dw);
  const QuadratureOptions adaptive;
  const TestFeatures g = test_features(gev, x, adaptive);
  EXPECT_LE(g.certificate_gap, 1e-13) << spec;
  EXPECT_LE(max_rel(dense_features(gev, g), expected), 1e-12) << spec;
  EXPECT_LE(g.evaluations, adaptive.gauss_nodes * (g.kinks + 3)) << spec << ": " << g.kinks << " kinks";
}

/// Max-pooling of non-overlapping windows beside a ReLU, in either order
/// (they commute), is piecewise linear on the structured route: the
/// argmax switches are kinks of the ReLU's site. A module laid out like
/// pathkernel's own cnn:4,6 integrates its pieces exactly and agrees with
/// the own CNN on the same weights; the generic route's kink scan sees the
/// same switches. A max-pool whose windows overlap, or with no ReLU beside
/// it, keeps the adaptive rule.
TEST(TorchScript, MaxPoolingBesideAReLUIsPiecewiseLinear) {
  Network own = engine_network(pooled_cnn_options("cnn:4,6"));
  SegmentEvaluator oev(own);
  torch::manual_seed(17);
  const int64_t P = parameter_count(own);
  const torch::Tensor w = flatten_parameters(own), dw = 0.3 * torch::randn({P}, torch::kFloat64);
  oev.set_segment(w, dw);
  const torch::Tensor x = torch::randn({3, 1, 8, 8}, torch::kFloat64);
  const QuadratureOptions q = exact_rule_options();
  const TestFeatures of = test_features(oev, x, q);
  ASSERT_GT(of.kinks, 0);
  ASSERT_LE(of.certificate_gap, 1e-13);
  std::vector<std::string> specs{"layers:conv(4,3,padding=1),relu,maxpool(2),conv(6,3,padding=1),relu,maxpool(2)",
                                 "layers:conv(4,3,padding=1),maxpool(2),relu,conv(6,3,padding=1),maxpool(2),relu"};
  TempDir dir;
  if (have_python_torch()) {
    // PyTorch's own modules: an in-place ReLU before nn.MaxPool2d, and a
    // pool before F.relu.
    const std::string path = dir.path() + "/cnn.pt";
    python(dir, "class M(nn.Module):\n"
                "    def __init__(self):\n"
                "        super().__init__()\n"
                "        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)\n"
                "        self.block = nn.Sequential(nn.ReLU(inplace=True), nn.MaxPool2d(2))\n"
                "        self.conv2 = nn.Conv2d(4, 6, 3, padding=1)\n"
                "        self.pool = nn.MaxPool2d(kernel_size=(2, 2), stride=2)\n"
                "        self.out = nn.Linear(24, 3)\n"
                "    def forward(self, x):\n"
                "        h = self.conv2(self.block(self.conv1(x)))\n"
                "        return self.out(torch.flatten(F.relu(self.pool(h)), 1))\n"
                "torch.jit.script(M()).save('" + path + "')\n");
    specs.push_back("torchscript:" + path);
  }
  for (const std::string& spec : specs) {
    Network net = engine_network(pooled_cnn_options(spec));
    ASSERT_EQ(parameter_count(net), P) << spec;
    SegmentEvaluator ev(net);
    ASSERT_EQ(ev.route(), "structured") << spec << ": " << ev.route_reason();
    EXPECT_EQ(ev.polynomial_degree(), 3) << spec;
    // Per kink site, or on a chain walked layer by layer per param layer
    // (0 after the last): the two pools either way.
    std::vector<int64_t> pools;
    for (int64_t k : ev.pool_after()) {
      if (k > 0) pools.push_back(k);
    }
    EXPECT_EQ(pools, std::vector<int64_t>({2, 2})) << spec;
    ev.set_segment(w, dw);
    const TestFeatures f = test_features(ev, x, q);
    EXPECT_LE(f.certificate_gap, 1e-13) << spec;
    EXPECT_GT(f.kinks, 0) << spec;
    // L = 3: 2 Gauss nodes and 1 moment node a piece, or 2 nodes and none
    // where a ReLU then the pool feed the logits (the last site held).
    EXPECT_EQ(f.evaluations % 2, 0) << spec;
    EXPECT_EQ(f.moment_evaluations * 2, ev.last_site_local() ? 0 : f.evaluations) << spec;
    EXPECT_LE(max_rel(dense_features(ev, f), dense_features(oev, of)), 1e-12) << spec;
    EXPECT_LT(f.evaluations, test_features(ev, x, exact_rule_options(false)).evaluations) << spec;
    // The generic route's kink sites are the same pairs: its scan sees the
    // argmax switches too, so certified Gauss splits there and converges
    // without refining (a missed switch costs dozens of halvings).
    EXPECT_EQ(net->kink_site_windows(), std::vector<int64_t>({2, 2})) << spec;
    const auto sites = net->forward_with_sites(x.narrow(0, 0, 1)).second;
    ASSERT_EQ(sites.size(), 2u) << spec;
    EXPECT_EQ(sites[1].sizes(), torch::IntArrayRef({1, 6, 4, 4})) << spec;
    expect_generic_route_agrees(net, w, dw, x, dense_features(oev, of), spec);
  }
  for (const std::string spec : {"layers:conv(4,3,padding=1),relu,maxpool(3,2)",
                                 "layers:conv(4,3,padding=1),maxpool(2),tanh",
                                 "layers:conv(4,3,padding=1),maxpool(2)"}) {
    Network net = engine_network(pooled_cnn_options(spec));
    SegmentEvaluator ev(net);
    ASSERT_EQ(ev.route(), "structured") << spec << ": " << ev.route_reason();
    EXPECT_EQ(ev.polynomial_degree(), 0) << spec;
    for (int64_t window : ev.pool_after()) EXPECT_EQ(window, 0) << spec;
    for (int64_t window : net->kink_site_windows()) EXPECT_EQ(window, 0) << spec;
  }
}

/// A max-pool beside a leaky ReLU of slope > 0 is fused with it too (the
/// two commute: the leaky ReLU is nondecreasing), but the pool passes
/// negative maxima on, so its argmax switches are kinks at any sign. With
/// exact pieces (no refinement to hide a missed kink) the certificate holds,
/// and the generic route, whose scan finds the same switches its own way,
/// agrees without refining. A slope
/// of 0 is a ReLU; a negative slope does not commute with a pool, which is
/// then not fused (the adaptive rule).
TEST(TorchScript, MaxPoolingBesideALeakyReLUIsPiecewiseLinear) {
  const std::string leaky_cnn =
      "layers:conv(4,3,padding=1),leakyrelu(0.1),maxpool(2),conv(6,3,padding=1),maxpool(2),leakyrelu(0.3)";
  for (const std::string& spec : {leaky_cnn, std::string("layers:conv(4,3,padding=1),leakyrelu(0),maxpool(2),"
                                                         "conv(6,3,padding=1),leakyrelu(0.5),maxpool(2)")}) {
    const bool first_leaky = spec == leaky_cnn;
    Network net = engine_network(pooled_cnn_options(spec));
    SegmentEvaluator ev(net);
    ASSERT_EQ(ev.route(), "structured") << spec << ": " << ev.route_reason();
    EXPECT_EQ(ev.polynomial_degree(), 3) << spec;
    EXPECT_EQ(ev.pool_after(), std::vector<int64_t>({2, 2})) << spec;
    EXPECT_EQ(ev.leaky_after(), std::vector<bool>({first_leaky, true})) << spec;
    EXPECT_EQ(net->kink_site_windows(), std::vector<int64_t>({2, 2})) << spec;
    EXPECT_EQ(net->kink_site_leaky(), std::vector<bool>({first_leaky, true})) << spec;
    torch::manual_seed(17);
    const int64_t P = parameter_count(net);
    const torch::Tensor w = flatten_parameters(net), dw = 0.3 * torch::randn({P}, torch::kFloat64);
    // Biases pushed down, so that many windows are negative throughout and
    // their argmax switches are kinks only of the leaky network.
    const torch::Tensor x = torch::randn({3, 1, 8, 8}, torch::kFloat64);
    torch::Tensor w_low = w.clone();
    for (const ParamInfo& p : parameter_layout(net)) {
      if (p.name.find("bias") != std::string::npos) w_low.narrow(0, p.offset, p.numel).sub_(0.4);
    }
    ev.set_segment(w_low, dw);
    const TestFeatures f = test_features(ev, x, exact_rule_options());
    EXPECT_LE(f.certificate_gap, 1e-13) << spec;
    EXPECT_GT(f.kinks, 0) << spec;
    EXPECT_EQ(f.evaluations % 2, 0) << spec;
    expect_generic_route_agrees(net, w_low, dw, x, dense_features(ev, f), spec);
  }
  Network net = engine_network(pooled_cnn_options("layers:conv(4,3,padding=1),leakyrelu(-0.2),maxpool(2)"));
  SegmentEvaluator ev(net);
  EXPECT_EQ(ev.polynomial_degree(), 0);
  EXPECT_EQ(net->kink_site_windows(), std::vector<int64_t>({0}));
}

// A module with a convolution trains with OpenBLAS on one thread, as
// pathkernel's own convolutional networks do (training_blas_threads); a
// module of Linear layers keeps the count it is given.
TEST(TorchScript, AModuleWithAConvolutionTrainsItsBlasOnOneThread) {
  REQUIRE_PYTHON_TORCH();
  TempDir dir("script_blas");
  const std::string mlp = dir.path() + "/mlp.pt";
  export_mlp(dir, mlp, 5, 6, 3, "relu");
  EXPECT_EQ(training_blas_threads(*build_network(small_resnet(dir)), 2), 1);
  EXPECT_EQ(training_blas_threads(*build_network(options_for(ModelSpec::parse("torchscript:" + mlp), 5, 3,
                                                             OutputMap::Logits)), 2),
            2);
}

TEST(TorchScript, RefusesWhatItCannotDecompose) {
  REQUIRE_PYTHON_TORCH();
  TempDir dir;
  // Not TorchScript at all.
  const std::string junk = dir.write("junk.pt", "this is not a module");
  NetworkOptions o = options_for(ModelSpec::parse("torchscript:" + junk), 4, 3, OutputMap::LogSoftmax);
  EXPECT_CONTAINS(error_message([&] { build_network(o); }), "is not a TorchScript module");
  // Training-mode BatchNorm without running statistics: eval mode would use the test batch's.
  const std::string bn = dir.path() + "/bn.pt";
  python(dir, "class M(nn.Module):\n"
         "    def __init__(self):\n"
         "        super().__init__()\n"
         "        self.fc = nn.Linear(4, 3)\n"
         "        self.norm = nn.BatchNorm1d(3, track_running_stats=False)\n"
         "    def forward(self, x):\n"
         "        return self.norm(self.fc(x))\n"
         "torch.jit.script(M()).save('" + bn + "')\n");
  o.spec = ModelSpec::parse("torchscript:" + bn);
  const std::string message = error_message([&] { build_network(o); });
  EXPECT_CONTAINS(message, "'norm' (BatchNorm1d) is in training mode with track_running_stats=False");
  EXPECT_CONTAINS(message, ".eval()");
  // Outputs that are not [n, K].
  const std::string wide = dir.path() + "/wide.pt";
  export_mlp(dir, wide, 4, 5, 2, "tanh");
  o.spec = ModelSpec::parse("torchscript:" + wide);
  Network net = build_network(o);  // 3 classes expected, the module gives 2
  EXPECT_CONTAINS(error_message([&] { net->forward(torch::zeros({2, 4}, torch::kFloat64)); }),
                  "returned shape [2, 2] for 2 inputs, expected [2, 3]");
}

TEST(NpyDataset, ReadsArraysOfAnyShapeAndChecksThem) {
  TempDir dir;
  auto save = [&](const std::string& name, const torch::Tensor& t) { write_npy(dir.path() + "/" + name, t); };
  save("train_x.npy", torch::arange(24, torch::kLong).view({4, 2, 3}));
  save("train_y.npy", torch::tensor({0, 2, 1, 2}, torch::kLong));
  save("test_x.npy", torch::arange(6, torch::kLong).view({1, 2, 3}));
  save("test_y.npy", torch::tensor({1}, torch::kLong));
  DataOptions o;
  o.spec = "npy:" + dir.path();
  Dataset d = load_dataset(o);
  EXPECT_TRUE(d.integer_inputs);
  EXPECT_EQ(d.input_shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(d.num_classes, 3);
  EXPECT_EQ(d.x_train.scalar_type(), torch::kFloat64);
  EXPECT_TRUE(torch::equal(d.x_train, torch::arange(24, torch::kFloat64).view({4, 2, 3})));

  save("test_x.npy", torch::zeros({1, 3, 2}, torch::kLong));
  EXPECT_CONTAINS(error_message([&] { load_dataset(o); }), "test_x.npy has examples of shape [3, 2]");
  save("test_x.npy", torch::zeros({1, 2, 3}, torch::kFloat64));
  EXPECT_CONTAINS(error_message([&] { load_dataset(o); }), "expected both floating point or both integer");
  save("test_x.npy", torch::zeros({1, 2, 3}, torch::kLong));
  save("train_y.npy", torch::tensor({0, -1, 1, 2}, torch::kLong));
  EXPECT_CONTAINS(error_message([&] { load_dataset(o); }), "labels in [-1, 2]");
  save("train_y.npy", torch::tensor({0, 1, 1}, torch::kLong));
  EXPECT_CONTAINS(error_message([&] { load_dataset(o); }), "has 3 labels but train_x.npy has 4 rows");
  save("train_y.npy", torch::tensor({0, 1, 1, 0}, torch::kLong));
  save("train_x.npy", torch::full({4, 2, 3}, std::nan(""), torch::kFloat64));
  save("test_x.npy", torch::zeros({1, 2, 3}, torch::kFloat64));
  EXPECT_CONTAINS(error_message([&] { load_dataset(o); }), "not finite");
  std::filesystem::remove(dir.path() + "/test_y.npy");
  EXPECT_CONTAINS(error_message([&] { load_dataset(o); }), "missing test_y.npy");
}

}  // namespace

// The held last site (last_site.h, docs/math.md §7): its pieces end at the
// earlier sites' kinks only, and the last site's switches inside a piece
// enter through scalar integrals. Compared with the reference where every
// kink ends a piece (QuadratureOptions::LastSite::Pieces), which
// features_test.cpp compares with autograd.
#include <gtest/gtest.h>

#include <algorithm>

#include "pathkernel/features.h"
#include "pathkernel/kinks.h"
#include "pathkernel/model.h"
#include "pathkernel/segment.h"
#include "../model/torchscript_util.h"
#include "../test_util.h"

namespace pathkernel {
namespace {

using Case = testing::NetworkCase;
using testing::script::have_python_torch;

/// A 4-class network of the case's architecture.
NetworkOptions options_for(const Case& c) { return c.options(4, 5); }

/// Held-site features of x on ev's segment (the last site, or with `mode`
/// Hidden the site below the hidden layer) against the reference where every
/// kink ends a piece, to 1e-12: the features, the certificate, and the held
/// logits' layer contracted through its factors against a batch's loss
/// signals and against every output's (the kernel). Returns both.
std::pair<TestFeatures, TestFeatures> expect_held_as_every_kink(
    const SegmentEvaluator& ev, const torch::Tensor& x, OutputMap map, const std::string& name,
    QuadratureOptions::LastSite mode = QuadratureOptions::LastSite::Local) {
  QuadratureOptions q;
  q.last_site = mode;
  TestFeatures held = test_features(ev, x, q);
  q.last_site = QuadratureOptions::LastSite::Pieces;
  TestFeatures every = test_features(ev, x, q);
  const torch::Tensor a = dense_features(ev, held), b = dense_features(ev, every);
  EXPECT_LE((a - b).abs().max().item<double>(), 1e-12 * std::max(1.0, b.abs().max().item<double>())) << name;
  EXPECT_LE(held.certificate_gap, 1e-13) << name;
  EXPECT_TRUE(held.layers.back().held_h.defined()) << name;
  std::vector<int64_t> xs = x.sizes().vec();
  xs[0] = 7;
  const int64_t K = ev.num_outputs();
  const torch::Tensor xt = torch::randn(xs, torch::kFloat64), yt = torch::randint(0, K, {7}, torch::kLong);
  const TrainSignals t = train_signals(ev, xt, yt, map);
  const torch::Tensor ch = contract(ev, held, t), ce = contract(ev, every, t);
  EXPECT_LE((ch - ce).abs().max().item<double>(), 1e-12 * std::max(1.0, ce.abs().max().item<double>())) << name;
  const torch::Tensor kh = output_kernel(ev, held, xt), ke = output_kernel(ev, every, xt);
  EXPECT_LE((kh - ke).abs().max().item<double>(), 1e-12 * std::max(1.0, ke.abs().max().item<double>())) << name;
  return {std::move(held), std::move(every)};
}

/// How scripted_cnn's convolutions are followed: their activation (a
/// function of the module, or "self.act" for an __init__ line setting it),
/// then a pool (F's max_pool2d or avg_pool2d) of windows `first` and `second`.
struct CnnLayers {
  std::string pool = "max_pool2d", first = "2", second = "2", act = "F.relu";
};

/// A user's TorchScript CNN for 1 × 8 × 8 inputs and 4 classes, saved in
/// dir: two convolutions (2 and 3 channels) with the activations and pools of
/// `c`, then the layers `init` (lines of __init__) and `head` (the forward's
/// return, of h flattened).
std::string scripted_cnn(const testing::TempDir& dir, const std::string& init, const std::string& head,
                         const CnnLayers& c = {}) {
  const std::string path = dir.path() + "/cnn.pt";
  testing::script::python(dir, "class M(nn.Module):\n"
                               "    def __init__(self):\n"
                               "        super().__init__()\n"
                               "        self.conv1 = nn.Conv2d(1, 2, 3, padding=1)\n"
                               "        self.conv2 = nn.Conv2d(2, 3, 3, padding=1)\n" +
                                   init +
                                   "    def forward(self, x):\n"
                                   "        h = F." + c.pool + "(" + c.act + "(self.conv1(x)), " + c.first + ")\n"
                                   "        h = torch.flatten(F." + c.pool + "(" + c.act + "(self.conv2(h)), " + c.second +
                                   "), 1)\n"
                                   "        return " +
                                   head + "\ntorch.manual_seed(3)\ntorch.jit.script(M()).save('" + path + "')\n");
  return path;
}

Network scripted_network(const std::string& path, OutputMap map, std::vector<int64_t> input_shape = {1, 8, 8}) {
  NetworkOptions o;
  o.spec = ModelSpec::parse("torchscript:" + path);
  o.input_shape = std::move(input_shape);
  o.num_classes = 4;
  o.output = map;
  return engine_network(o);
}

/// Sets ev (of net) on the tests' long step: from net's weights along 0.5 ×
/// a normal direction drawn from seed 17, which crosses many switches.
void set_long_step(SegmentEvaluator& ev, Network& net) {
  torch::manual_seed(17);
  const torch::Tensor w = flatten_parameters(net), dw = 0.5 * torch::randn_like(w);
  ev.set_segment(w, dw);
}

/// A scripted CNN: its layers (scripted_cnn's), and, where its site is held,
/// whether through its hidden layer (else the last site).
struct ScriptedChain {
  std::string name;
  CnnLayers layers;
  std::string init, head;
  bool hidden = false;
};

/// Calls at(ev, x, map, name) for each chain on both output maps: its module
/// read as the engine's network (checked to be walked as a chain), ev on the
/// tests' long step, x 5 test inputs.
template <typename Fn>
void for_each_chain(const std::vector<ScriptedChain>& chains, Fn&& at) {
  for (const ScriptedChain& c : chains) {
    testing::TempDir dir(c.name);
    const std::string path = scripted_cnn(dir, c.init, c.head, c.layers);
    for (OutputMap map : {OutputMap::LogSoftmax, OutputMap::Logits}) {
      Network net = scripted_network(path, map);
      SegmentEvaluator ev(net);
      set_long_step(ev, net);
      const torch::Tensor x = torch::randn({5, 1, 8, 8}, torch::kFloat64);
      const std::string name = c.name + "/" + output_map_name(map);
      EXPECT_EQ(ev.route(), "structured") << name;
      EXPECT_EQ(ev.route_reason(), "") << name << ": walked as a chain";
      at(ev, x, map, name, c);
    }
  }
}

/// The kinks counted at site l (flips, switches and closed form).
int64_t kinks_at(const TestFeatures& f, size_t l) {
  int64_t n = 0;
  for (size_t i = 3 * l; i < 3 * l + 3 && i < f.kinks_by_site.size(); ++i) n += f.kinks_by_site[i];
  return n;
}

// Networks whose last site can be held: a max-pool after it (its windows
// tiling the site or leaving a row and column out), none (a Linear site),
// and four param layers (the site a cubic on a piece, its roots found
// between sign changes); logits and log-softmax. A long step crosses many
// switches.
TEST(LastSite, HeldSiteGivesTheFeaturesOfEveryKinkAPiece) {
  const std::vector<Case> cases = {
      {"cnn:2,3", {1, 8, 8}, OutputMap::LogSoftmax}, {"cnn:2,3", {1, 9, 9}, OutputMap::Logits},
      {"cnn:3,4", {1, 10, 10}, OutputMap::LogSoftmax}, {"mlp:6,5", {4}, OutputMap::Logits},
      {"mlp:6,5", {4}, OutputMap::LogSoftmax},        {"mlp:6,5,4", {4}, OutputMap::LogSoftmax},
      {"cnn:2,3,3", {1, 22, 22}, OutputMap::LogSoftmax},
  };
  for (const Case& c : cases) {
    Network net = build_network(options_for(c));
    SegmentEvaluator ev(net);
    set_long_step(ev, net);
    std::vector<int64_t> xs{5};
    xs.insert(xs.end(), c.shape.begin(), c.shape.end());
    const torch::Tensor x = torch::randn(xs, torch::kFloat64);
    ASSERT_TRUE(ev.last_site_local()) << c.name();
    const auto [held, every] = expect_held_as_every_kink(ev, x, c.map, c.name());
    // The held site's switches are found on the pieces' interpolants, not
    // searched for: wherever the reference ends a piece and the held
    // features have no break, the network's pattern at the site is the same
    // on either side (the reference's search also cuts where a unit flips
    // after its window's maximum passed to another, which the network does
    // not see). Fewer rows.
    const size_t site = ev.param_layers().size() - 2;
    EXPECT_GT(kinks_at(held, site), 0) << c.name();
    EXPECT_LE(kinks_at(held, site), kinks_at(every, site)) << c.name();
    EXPECT_LT(held.evaluations + held.moment_evaluations, every.evaluations + every.moment_evaluations) << c.name();
    for (size_t i = 0; i < held.breaks.size(); ++i) {
      const std::vector<double>& hb = held.breaks[i];
      std::vector<double> either, after;
      std::vector<int64_t> rows;
      for (double t : every.breaks[i]) {
        auto at = std::lower_bound(hb.begin(), hb.end(), t);
        const double gap = std::min(at == hb.end() ? 1.0 : *at - t, at == hb.begin() ? 1.0 : t - *(at - 1));
        if (gap < 1e-9 || t <= 0 || t >= 1) continue;
        const double d = std::min(1e-9, 0.25 * gap);
        either.push_back(t - d);
        after.push_back(t + d);
      }
      if (either.empty()) continue;
      either.insert(either.end(), after.begin(), after.end());
      const int64_t k = static_cast<int64_t>(after.size());
      const torch::Tensor xi = x.narrow(0, static_cast<int64_t>(i), 1).expand(xs.size() == 2 ? std::vector<int64_t>{2 * k, -1} : std::vector<int64_t>{2 * k, -1, -1, -1});
      const std::vector<torch::Tensor> pattern =
          activation_patterns(ev, ev.sites_at(xi, torch::tensor(either, torch::kFloat64)));
      EXPECT_TRUE(pattern[site].narrow(0, 0, k).equal(pattern[site].narrow(0, k, k)))
          << c.name() << " test " << i << ": a switch of the held site that is not a break";
    }
  }
}

// A user's TorchScript CNN of the same layers, walked as a plain chain on
// the structured route: its site held, the first convolution's selection
// read from the module's own layers.
TEST(LastSite, HeldSiteOfAScriptedChainGivesTheFeaturesOfEveryKinkAPiece) {
  REQUIRE_PYTHON_TORCH();
  for_each_chain({{"scripted_chain", {}, "        self.fc = nn.Linear(12, 4)\n", "self.fc(h)"}},
                 [](const SegmentEvaluator& ev, const torch::Tensor& x, OutputMap map, const std::string& name,
                    const ScriptedChain&) {
                   ASSERT_TRUE(ev.last_site_local()) << name;
                   const auto [held, every] = expect_held_as_every_kink(ev, x, map, name);
                   EXPECT_LT(held.evaluations, every.evaluations) << name;
                   // The reference's pieces take their first two layers from pairs
                   // (QuadratureOptions::piece_pairs); every row walked gives the same.
                   QuadratureOptions q;
                   q.last_site = QuadratureOptions::LastSite::Pieces;
                   q.piece_pairs = false;
                   const torch::Tensor rows = dense_features(ev, test_features(ev, x, q));
                   const torch::Tensor pairs = dense_features(ev, every);
                   EXPECT_LE((pairs - rows).abs().max().item<double>(),
                             1e-12 * std::max(1.0, rows.abs().max().item<double>()))
                       << name << ": pieces' pairs against every row walked";
                 });
}

/// Features of x (mode) with the pieces' first two layers from their pairs
/// against every row walked back to the first layer (piece_pairs off), to
/// 1e-12: the features, the certificate, and the features contracted
/// against a batch's loss signals. The site is held but under Pieces.
void expect_pairs_as_rows(const SegmentEvaluator& ev, const torch::Tensor& x, OutputMap map,
                          QuadratureOptions::LastSite mode, const std::string& name) {
  QuadratureOptions q;
  q.last_site = mode;
  const TestFeatures pairs = test_features(ev, x, q);
  q.piece_pairs = false;
  const TestFeatures rows = test_features(ev, x, q);
  EXPECT_EQ(pairs.layers.back().held_h.defined(), mode != QuadratureOptions::LastSite::Pieces) << name;
  EXPECT_GT(pairs.pair_sums, 0) << name;
  EXPECT_EQ(rows.pair_sums, 0) << name;
  EXPECT_GT(pairs.kinks, 5) << name << ": the segment should cross kinks";
  EXPECT_LE(pairs.certificate_gap, 1e-13) << name;
  const torch::Tensor a = dense_features(ev, pairs), b = dense_features(ev, rows);
  EXPECT_LE((a - b).abs().max().item<double>(), 1e-12 * std::max(1.0, b.abs().max().item<double>())) << name;
  std::vector<int64_t> xs = x.sizes().vec();
  xs[0] = 7;
  const torch::Tensor xt = torch::randn(xs, torch::kFloat64);
  const torch::Tensor yt = torch::randint(0, ev.num_outputs(), {7}, torch::kLong);
  const TrainSignals t = train_signals(ev, xt, yt, map);
  const torch::Tensor cp = contract(ev, pairs, t), cr = contract(ev, rows, t);
  EXPECT_LE((cp - cr).abs().max().item<double>(), 1e-12 * std::max(1.0, cr.abs().max().item<double>())) << name;
}

// Scripted chains that average or scale between their first two layers:
// LeNet's pools (windows of 2, and of 3 leaving a row and a column out), and
// leaky ReLUs (slope 0.2) before a max-pool and an average pool; three and
// four param layers. Each piece's pair is routed by the selection (a unit
// of layer 1's input is the mean of its window's units, each at its
// weight: 1 where positive, else 0 or the leaky slope) and mended where a
// piece's units differ, against every row walked back.
TEST(LastSite, PiecePairsOfAveragingAndLeakyChainsGiveTheFeaturesOfEveryRowWalked) {
  REQUIRE_PYTHON_TORCH();
  const std::string act = "        self.act = nn.LeakyReLU(0.2)\n";
  const std::string hidden3 = "        self.fc1 = nn.Linear(3, 5)\n        self.fc2 = nn.Linear(5, 4)\n";
  for_each_chain(
      {{"avg2", {"avg_pool2d", "2"}, "        self.fc = nn.Linear(12, 4)\n", "self.fc(h)"},
       {"avg3_hidden", {"avg_pool2d", "3"}, hidden3, "self.fc2(F.relu(self.fc1(h)))"},
       {"leaky_max", {"max_pool2d", "2", "2", "self.act"}, act + "        self.fc = nn.Linear(12, 4)\n", "self.fc(h)"},
       {"leaky_avg3_hidden", {"avg_pool2d", "3", "2", "self.act"}, act + hidden3,
        "self.fc2(F.leaky_relu(self.fc1(h), 0.3))"}},
      [](const SegmentEvaluator& ev, const torch::Tensor& x, OutputMap map, const std::string& name,
         const ScriptedChain&) { expect_pairs_as_rows(ev, x, map, QuadratureOptions::LastSite::Pieces, name); });
}

/// Held through the hidden layer against every kink a piece
/// (expect_held_as_every_kink), with the held site's kinks counted, fewer
/// rows, and auto holding it too (the same features, bit for bit). Returns
/// the hidden layer's kinks.
int64_t expect_hidden_held_as_every_kink(const SegmentEvaluator& ev, const torch::Tensor& x, OutputMap map,
                                         const std::string& name) {
  EXPECT_TRUE(ev.hidden_site_local()) << name << " (" << ev.route() << ": " << ev.route_reason() << ")";
  if (!ev.hidden_site_local()) return 0;
  const auto [held, every] = expect_held_as_every_kink(ev, x, map, name, QuadratureOptions::LastSite::Hidden);
  // The hidden layer's block kept as its factors (dense_features formed it above).
  EXPECT_TRUE(held.layers[held.layers.size() - 2].hidden.defined()) << name;
  EXPECT_FALSE(held.layers[held.layers.size() - 2].block.defined()) << name;
  const size_t site = ev.param_layers().size() - 3;
  EXPECT_GT(kinks_at(held, site), 0) << name;
  EXPECT_LT(held.evaluations + held.moment_evaluations, every.evaluations + every.moment_evaluations) << name;
  // Auto holds it at four and five param layers.
  const torch::Tensor a = dense_features(ev, test_features(ev, x, QuadratureOptions())), b = dense_features(ev, held);
  EXPECT_TRUE(a.equal(b)) << name << ": auto holds the site through the hidden layer";
  return kinks_at(held, site + 1);
}

// Networks whose site below a hidden Linear layer can be held through it:
// MLPs of four and five param layers; logits and log-softmax. Pieces end at
// the earlier sites' kinks and the hidden layer's, which are found on the
// pieces' interpolants: a long step crosses both.
TEST(LastSite, SiteHeldThroughAHiddenLayerGivesTheFeaturesOfEveryKinkAPiece) {
  const std::vector<Case> cases = {
      {"mlp:6,5,4", {4}, OutputMap::LogSoftmax},
      {"mlp:6,5,4", {4}, OutputMap::Logits},
      {"mlp:6,5,4,3", {4}, OutputMap::LogSoftmax},
  };
  int64_t hidden_kinks = 0;
  for (const Case& c : cases) {
    Network net = build_network(options_for(c));
    SegmentEvaluator ev(net);
    set_long_step(ev, net);
    hidden_kinks += expect_hidden_held_as_every_kink(ev, torch::randn({5, 4}, torch::kFloat64), c.map, c.name());
  }
  EXPECT_GT(hidden_kinks, 0) << "no case crossed a switch of the hidden layer";
}

// A user's TorchScript CNN like the bench's (two convolutions with ReLU and
// max-pools, a hidden Linear layer and its ReLU, the logits), walked as a
// chain: the second convolution's site held through the hidden layer.
TEST(LastSite, SiteOfAScriptedCnnHeldThroughItsHiddenLayer) {
  REQUIRE_PYTHON_TORCH();
  // The hidden layer with a bias and without.
  std::vector<ScriptedChain> chains;
  for (const std::string bias : {"True", "False"}) {
    chains.push_back({"scripted_cnn_bias_" + bias, {},
                      "        self.fc1 = nn.Linear(12, 5, bias=" + bias + ")\n        self.fc2 = nn.Linear(5, 4)\n",
                      "self.fc2(F.relu(self.fc1(h)))", true});
  }
  for_each_chain(chains, [](const SegmentEvaluator& ev, const torch::Tensor& x, OutputMap map,
                            const std::string& name, const ScriptedChain&) {
    expect_hidden_held_as_every_kink(ev, x, map, name);
  });
}

/// Each chain, on both output maps, walked as a chain with its site held
/// against every kink a piece (expect_held_as_every_kink, or
/// expect_hidden_held_as_every_kink), the last site's with fewer rows.
/// Returns the held last sites' switches and the hidden layers' kinks.
std::pair<int64_t, int64_t> expect_chains_held_as_every_kink(const std::vector<ScriptedChain>& chains) {
  int64_t switches = 0, hidden_kinks = 0;
  for_each_chain(chains, [&](const SegmentEvaluator& ev, const torch::Tensor& x, OutputMap map, const std::string& name,
                             const ScriptedChain& c) {
    if (c.hidden) {
      hidden_kinks += expect_hidden_held_as_every_kink(ev, x, map, name);
      return;
    }
    EXPECT_TRUE(ev.last_site_local()) << name;
    if (!ev.last_site_local()) return;
    const auto [held, every] = expect_held_as_every_kink(ev, x, map, name);
    switches += kinks_at(held, ev.param_layers().size() - 2);
    EXPECT_LT(held.evaluations + held.moment_evaluations, every.evaluations + every.moment_evaluations) << name;
  });
  return {switches, hidden_kinks};
}

/// A hidden layer of 5 units on `in` inputs and the logits, as
/// scripted_cnn's __init__ lines.
std::string hidden_layers(int in) {
  return "        self.fc1 = nn.Linear(" + std::to_string(in) + ", 5)\n        self.fc2 = nn.Linear(5, 4)\n";
}

// Scripted chains whose held site an average pool follows: each unit of the
// logits' (or hidden layer's) input is the mean of its window's positive
// units, so every unit's flip is a switch of the site, and its share 1 / k²
// enters the fields. The last site held (three param layers), and the site
// held through a hidden layer (four), the second pool's windows tiling the
// map or leaving a row and a column out; logits and log-softmax.
TEST(LastSite, HeldSiteUnderAnAveragePoolGivesTheFeaturesOfEveryKinkAPiece) {
  REQUIRE_PYTHON_TORCH();
  const std::string hidden_head = "self.fc2(F.relu(self.fc1(h)))";
  const CnnLayers tiled{"avg_pool2d", "2", "2"}, cut{"avg_pool2d", "2", "3"};
  const int64_t switches = expect_chains_held_as_every_kink({
      {"avg2", tiled, "        self.fc = nn.Linear(12, 4)\n", "self.fc(h)"},
      {"avg2_3", cut, "        self.fc = nn.Linear(3, 4)\n", "self.fc(h)"},
      {"avg2_hidden", tiled, hidden_layers(12), hidden_head, true},
      {"avg2_3_hidden", cut, hidden_layers(3), hidden_head, true},
  }).first;
  EXPECT_GT(switches, 0) << "no case crossed a switch of the held site";
}

// Scripted chains of leaky ReLUs (slopes 0.2 at the convolutions, 0.3 at
// the hidden layer): a negative unit passes on its slope's share, so every
// unit's flip is a switch of the site, and after a max-pool every argmax
// switch, whatever the window's sign; the hidden layer's mask D is 1 or its
// slope. The last site held (three param layers) and the site held through
// the hidden layer (four), under max-pools and average pools; logits and
// log-softmax.
TEST(LastSite, HeldSiteOfLeakyReLUsGivesTheFeaturesOfEveryKinkAPiece) {
  REQUIRE_PYTHON_TORCH();
  const std::string act = "        self.act = nn.LeakyReLU(0.2)\n", logits = "        self.fc = nn.Linear(12, 4)\n";
  const std::string hidden_head = "self.fc2(F.leaky_relu(self.fc1(h), 0.3))";
  const CnnLayers max{"max_pool2d", "2", "2", "self.act"}, avg{"avg_pool2d", "2", "2", "self.act"};
  const auto [switches, hidden_kinks] = expect_chains_held_as_every_kink({
      {"leaky_max", max, act + logits, "self.fc(h)"},
      {"leaky_avg", avg, act + logits, "self.fc(h)"},
      {"leaky_max_hidden", max, act + hidden_layers(12), hidden_head, true},
      {"leaky_avg_hidden", avg, act + hidden_layers(12), hidden_head, true},
  });
  EXPECT_GT(switches, 0) << "no case crossed a switch of the held site";
  EXPECT_GT(hidden_kinks, 0) << "no case crossed a switch of the hidden layer";
}

/// A user's TorchScript CNN for 1 × 12 × 12 inputs and 4 classes, saved in
/// dir: three convolutions (2, 3 and 3 channels) with ReLU and 2 × 2
/// max-pools, a hidden layer of 5 units and its ReLU, the logits.
std::string scripted_three_conv(const testing::TempDir& dir) {
  const std::string path = dir.path() + "/cnn3.pt";
  testing::script::python(dir, "class M(nn.Module):\n"
                               "    def __init__(self):\n"
                               "        super().__init__()\n"
                               "        self.conv1 = nn.Conv2d(1, 2, 3, padding=1)\n"
                               "        self.conv2 = nn.Conv2d(2, 3, 3, padding=1)\n"
                               "        self.conv3 = nn.Conv2d(3, 3, 3, padding=1)\n" +
                                   hidden_layers(3) +
                                   "    def forward(self, x):\n"
                                   "        h = F.max_pool2d(F.relu(self.conv1(x)), 2)\n"
                                   "        h = F.max_pool2d(F.relu(self.conv2(h)), 2)\n"
                                   "        h = torch.flatten(F.max_pool2d(F.relu(self.conv3(h)), 2), 1)\n"
                                   "        return self.fc2(F.relu(self.fc1(h)))\n"
                                   "torch.manual_seed(3)\ntorch.jit.script(M()).save('" + path + "')\n");
  return path;
}


// A site held above param layer 1 whose layer 1 is a convolution (the last
// site of three convolutions and the logits; the site below the hidden layer
// of a user's TorchScript CNN of three convolutions): the nodes' cotangents
// on the site walk back to layer 1 alone, and each piece's first two layers
// come from its pair there (docs/math.md §7), against every row walked back
// to the first layer; logits and log-softmax. A Linear layer 1 (an MLP of
// five param layers, held through its hidden layer) keeps the rows' walks.
TEST(LastSite, SiteHeldAboveLayerOneTakesTheFirstTwoLayersFromPiecePairs) {
  using LastSite = QuadratureOptions::LastSite;
  {
    const Case c{"cnn:2,3,3", {1, 22, 22}, OutputMap::LogSoftmax};
    Network net = build_network(options_for(c));
    SegmentEvaluator ev(net);
    set_long_step(ev, net);
    expect_pairs_as_rows(ev, torch::randn({5, 1, 22, 22}, torch::kFloat64), c.map, LastSite::Local, c.name());
  }
  {
    Network net = build_network(options_for({"mlp:6,5,4,3", {4}, OutputMap::Logits}));
    SegmentEvaluator ev(net);
    set_long_step(ev, net);
    QuadratureOptions q;
    q.last_site = LastSite::Hidden;
    const TestFeatures f = test_features(ev, torch::randn({5, 4}, torch::kFloat64), q);
    EXPECT_TRUE(f.layers.back().held_h.defined()) << "mlp:6,5,4,3: the site is held";
    EXPECT_EQ(f.pair_sums, 0) << "mlp:6,5,4,3: a Linear layer 1 keeps the rows' walks";
  }
  REQUIRE_PYTHON_TORCH();
  testing::TempDir dir;
  const std::string path = scripted_three_conv(dir);
  for (OutputMap map : {OutputMap::LogSoftmax, OutputMap::Logits}) {
    Network net = scripted_network(path, map, {1, 12, 12});
    SegmentEvaluator ev(net);
    set_long_step(ev, net);
    const std::string name = "three convolutions/" + output_map_name(map);
    ASSERT_EQ(ev.route(), "structured") << name << ": " << ev.route_reason();
    ASSERT_TRUE(ev.hidden_site_local()) << name;
    expect_pairs_as_rows(ev, torch::randn({5, 1, 12, 12}, torch::kFloat64), map, LastSite::Hidden, name);
  }
}

// Only a piecewise-linear network of three param layers or more holds its
// last site: with two, that site is the first, whose kinks are closed-form
// already; smooth units have no kinks.
TEST(LastSite, OnlyASiteFeedingTheLogitsAloneIsHeld) {
  for (const Case& c : std::vector<Case>{{"cnn:3", {1, 8, 8}, OutputMap::LogSoftmax},
                                         {"mlp:6", {4}, OutputMap::Logits},
                                         {"mlp:6,5:tanh", {4}, OutputMap::Logits}}) {
    Network net = build_network(options_for(c));
    SegmentEvaluator ev(net);
    EXPECT_FALSE(ev.last_site_local()) << c.name();
    EXPECT_FALSE(ev.hidden_site_local()) << c.name();
  }
  // Through a hidden layer only where the logits' input is the hidden
  // layer's ReLU alone, fed by a Linear layer.
  for (const Case& c : std::vector<Case>{{"cnn:2,3", {1, 8, 8}, OutputMap::LogSoftmax},
                                         {"cnn:2,3,3", {1, 8, 8}, OutputMap::LogSoftmax},
                                         {"mlp:6,5", {4}, OutputMap::Logits}}) {
    Network net = build_network(options_for(c));
    SegmentEvaluator ev(net);
    EXPECT_FALSE(ev.hidden_site_local()) << c.name();
  }
}

}  // namespace
}  // namespace pathkernel

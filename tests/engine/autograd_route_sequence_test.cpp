// The generic route on a sequence model (sequence.h): a tiny causal
// transformer (examples/char_transformer.py) on token sequences, its
// training signals against autograd of each sequence's mean token loss, and
// its run trained, replayed bit for bit and decomposed exactly at two
// positions; what a sequence data set refuses.
#include <filesystem>

#include <gtest/gtest.h>

#include "../model/torchscript_util.h"
#include "../test_paths.h"
#include "pathkernel/evaluate.h"
#include "pathkernel/features.h"
#include "pathkernel/loss.h"
#include "pathkernel/report.h"
#include "pathkernel/sequence.h"

namespace pathkernel {
namespace {

using namespace testing::script;
using testing::error_message;
using testing::run_shell;
using testing::TempDir;

constexpr int64_t kV = 7, kT = 5;

/// 12 training and 3 test sequences [T] of tokens in [0, V), their targets
/// the next token, written as npy:DIR/data; the causal transformer (width 8)
/// exported to DIR/model.pt.
void write_sequences(const TempDir& dir) {
  const std::string data = dir.path() + "/data";
  std::filesystem::create_directories(data);
  torch::manual_seed(7);
  const torch::Tensor train = torch::randint(0, kV, {12, kT + 1}, torch::kLong);
  const torch::Tensor test = torch::randint(0, kV, {3, kT + 1}, torch::kLong);
  write_npy(data + "/train_x.npy", train.narrow(1, 0, kT).contiguous());
  write_npy(data + "/train_y.npy", train.narrow(1, 1, kT).contiguous());
  write_npy(data + "/test_x.npy", test.narrow(1, 0, kT).contiguous());
  write_npy(data + "/test_y.npy", test.narrow(1, 1, kT).contiguous());
  const auto r = run_shell(kPython + " " + testing::source_dir() + "/examples/char_transformer.py export " +
                           dir.path() + "/model.pt --vocab " + std::to_string(kV) + " --length " +
                           std::to_string(kT) + " --width 8");
  ASSERT_EQ(r.status, 0) << r.out;
}

RunOptions sequence_run(const TempDir& dir) {
  RunOptions o;
  o.data.spec = "npy:" + dir.path() + "/data";
  o.model = "torchscript:" + dir.path() + "/model.pt";
  o.output = OutputMap::Logits;
  o.train.optimizer.name = "adamw";
  o.train.optimizer.lr = 0.02;
  o.train.optimizer.weight_decay = 0.1;
  o.train.batch = 4;
  o.train.steps = 6;
  o.train.progress = false;
  o.checkpoint_every = 3;
  o.out = dir.path() + "/run";
  return o;
}

// A training point is a sequence: its signal is the gradient of its own mean
// token loss, u_i [T, V] contracted with the Jacobian of all T positions.
TEST(AutogradRoute, SequenceSignalsAreEachSequencesLossGradient) {
  REQUIRE_PYTHON_TORCH();
  TempDir dir;
  write_sequences(dir);
  const RunOptions o = sequence_run(dir);
  train_run(o);
  PathReader reader(o.out);
  Network net = engine_network(reader.manifest().network_options());
  SegmentEvaluator ev(net);
  EXPECT_EQ(ev.route(), "generic");
  const torch::Tensor w = reader.checkpoint(1);
  ev.set_segment(w, torch::zeros_like(w));
  const torch::Tensor x = reader.decoded_dataset().x_train.narrow(0, 0, 3), y = reader.decoded_dataset().y_train.narrow(0, 0, 3);
  const TrainSignals t = train_signals(ev, x, y, OutputMap::Logits);
  Network ref = engine_network(reader.manifest().network_options());
  for (int64_t i = 0; i < 3; ++i) {
    set_flat_parameters(ref, w);
    for (auto& p : ref->parameters()) p.mutable_grad() = torch::Tensor();
    const torch::Tensor f = ref->forward(x.narrow(0, i, 1));  // [1, T, V]
    ASSERT_EQ(f.sizes(), (std::vector<int64_t>{1, kT, kV}));
    (-torch::log_softmax(f[0], 1).gather(1, y[i].unsqueeze(1)).mean()).backward();
    std::vector<torch::Tensor> g;
    for (auto& p : ref->parameters()) g.push_back(p.grad().reshape({-1}));
    EXPECT_LE(max_rel(t.signals[0][i], torch::cat(g)), 1e-14) << "sequence " << i;
  }
}

// Trained with AdamW, replayed bit for bit, and exact at the last position
// and at position 1, whose outputs are the module's at those positions.
TEST(AutogradRoute, CausalTransformerDecomposesExactlyAtTwoPositions) {
  REQUIRE_PYTHON_TORCH();
  TempDir dir;
  write_sequences(dir);
  const RunOptions o = sequence_run(dir);
  const RunResult result = train_run(o);
  EXPECT_EQ(result.manifest.sequence_length, kT);
  EXPECT_EQ(result.manifest.num_classes, kV);
  PathReader reader(o.out);
  EXPECT_EQ(reader.check().mismatches, 0);
  const torch::Tensor x = reader.decoded_dataset().x_test;
  Network net = engine_network(reader.manifest().network_options());
  set_flat_parameters(net, reader.checkpoint(reader.manifest().checkpoints.size() - 1));
  const torch::Tensor fN = net->forward(x).detach();  // [3, T, V]
  for (const int64_t position : {int64_t(-1), int64_t(1)}) {
    DecompositionOptions d;
    d.progress = false;
    d.position = position;
    EXPECT_EQ(engine_route(reader, d).route, "generic");
    const Decomposition dec = decompose(reader, x, d);
    EXPECT_LE(summarize(dec).max_rel_error, 1e-12) << "position " << position;
    EXPECT_LE(dec.completeness_gap().abs().max().item<double>(), 1e-12 * dec.fN.abs().max().item<double>());
    EXPECT_TRUE(torch::equal(dec.fN, at_position(fN, position))) << "position " << position;
    EXPECT_GT(dec.contributions.abs().max().item<double>(), 0.0);
  }
}

TEST(AutogradRoute, SequenceDataRefusesWhatItCannotDecompose) {
  REQUIRE_PYTHON_TORCH();
  TempDir dir;
  write_sequences(dir);
  RunOptions o = sequence_run(dir);
  train_run(o);
  PathReader reader(o.out);
  DecompositionOptions d;
  d.progress = false;
  d.position = kT;
  EXPECT_CONTAINS(error_message([&] { decompose(reader, reader.decoded_dataset().x_test, d); }),
                  "the position decomposed 5 is out of range: the sequences have 5 positions, expected 0 .. 4");
  EXPECT_CONTAINS(error_message([&] { evaluate(reader, torch::arange(2), dir.path() + "/ev", EvaluateOptions{}); }),
                  "trains on sequences (outputs [n, 5, 7]), which evaluate does not take yet");
  EXPECT_CONTAINS(error_message([&] { report_data(reader, ReportOptions{}); }),
                  "trains on sequences (outputs [n, 5, 7]), which report does not take yet");
  o.out = dir.path() + "/mse";
  o.loss = LossKind::Mse;
  EXPECT_CONTAINS(error_message([&] { train_run(o); }), "holds sequences (labels of shape [12, 5]): the loss is the mean over a sequence's tokens");
  o.loss = LossKind::CrossEntropy;
  o.out = dir.path() + "/mlp";
  o.model = "mlp:8";
  EXPECT_CONTAINS(error_message([&] { train_run(o); }), "which need a module whose outputs are [n, T, V]");
  // A module whose outputs are [n, V] on sequence data.
  python(dir, "class M(nn.Module):\n"
              "    def __init__(self):\n"
              "        super().__init__()\n"
              "        self.e = nn.Embedding(7, 7)\n"
              "    def forward(self, x):\n"
              "        return self.e(x).sum(1)\n"
              "torch.jit.script(M().double()).save('" + dir.path() + "/flat.pt')\n");
  o.out = dir.path() + "/flat";
  o.model = "torchscript:" + dir.path() + "/flat.pt";
  EXPECT_CONTAINS(error_message([&] { train_run(o); }), ", 5, 7] (the data's labels are tokens [n, 5]: one logit per token");
}

}  // namespace
}  // namespace pathkernel

// The batch gradient c_s G_s summed from the training rows' signals
// (Walk::signals_gradient, src/engine/decomposition_walk.cpp) against
// autograd's gradient of the batch's mean loss, the slow reference.
#include <gtest/gtest.h>

#include "../../src/engine/decomposition_walk.h"
#include "../test_util.h"
#include "pathkernel/decomposition.h"

namespace pathkernel {
namespace {

/// A 3-step Adam run of `model` on 40 training points of `data`, in float32,
/// so that its training rows' signals are recomputed, not the replay's.
RunOptions float32_run(const std::string& out, const std::string& data, const std::string& model) {
  RunOptions r = testing::small_run(out, "adam", 3, 3);
  r.data.spec = data;
  r.data.train_size = 40;
  r.model = model;
  r.data.dtype = torch::kFloat32;
  train_run(r);
  return r;
}

/// A Walk of the first test point on a 3-step float32 Adam run of `model`
/// on `data` (float32_run), with the run it reads.
struct RunWalk {
  RunWalk(const std::string& name, const std::string& data, const std::string& model)
      : dir(name),
        run(float32_run(dir / "run", data, model)),
        reader(run.out),
        options(quiet_options()),
        w(reader, reader.decoded_dataset().x_test.narrow(0, 0, 1), options) {}
  static DecompositionOptions quiet_options() {
    DecompositionOptions o;
    o.progress = false;
    return o;
  }
  testing::TempDir dir;
  RunOptions run;
  PathReader reader;
  DecompositionOptions options;
  decomposition_walk::Walk w;
};

TEST(SignalsGradient, EqualsAutogradsBatchGradient) {
  struct Case {
    std::string data, model;
  };
  for (const Case& c : {Case{"gaussians3", "mlp:6,5"}, Case{"mnist", "cnn:2,3"}}) {
    SCOPED_TRACE(c.model);
    RunWalk run("signals-gradient", c.data, c.model);
    PathReader& reader = run.reader;
    decomposition_walk::Walk& w = run.w;
    ASSERT_TRUE(w.gradient_from_signals);
    int64_t steps = 0;
    reader.forward([&](const PathStep& st) {
      w.ev.set_segment(st.w, st.delta);  // as the walks do: the training rows' signals are at w_s
      const torch::Tensor want = w.batch(reader, st, false).gradient;  // autograd, one pass of its own
      const double scale = want.abs().max().item<double>();
      ASSERT_GT(scale, 0);
      for (int64_t chunk : {1024, 7}) {  // one chunk, and several
        const torch::Tensor got = w.batch(reader, st, false, chunk).gradient;
        EXPECT_LE((got - want).abs().max().item<double>(), 1e-13 * scale) << "chunk " << chunk;
      }
      ++steps;
    });
    EXPECT_EQ(steps, 3);
  }
}

// The reverse walk's training side formed ahead: its task forms the
// batch's signals only (batch_signals), the walk's thread the per-sample
// gradients and c_s G_s (finish_batch). The same bits as batch(), whether
// the chunks were kept or formed again, and the kept chunks hold their
// per-sample gradients afterwards, their patches gone.
TEST(SignalsGradient, FormedLaterIsBatchsBitForBit) {
  RunWalk c("signals-gradient-later", "mnist", "cnn:2,3");
  PathReader& reader = c.reader;
  decomposition_walk::Walk& w = c.w;
  ASSERT_TRUE(w.gradient_from_signals);
  const int64_t chunk = 7;  // several chunks to a batch
  int64_t steps = 0;
  reader.forward([&](const PathStep& st) {
    w.ev.set_segment(st.w, st.delta);
    auto& slot = w.kept[static_cast<size_t>(st.step % 2)];
    const torch::Tensor want = w.batch(reader, st, false, chunk).gradient;
    for (int64_t keep : {w.keep_doubles, int64_t{0}}) {  // chunks kept, and formed again
      SCOPED_TRACE("keep_doubles " + std::to_string(keep));
      slot.hold(-1);
      w.keep_doubles = keep;
      decomposition_walk::Walk::Batch bt = w.batch_signals(reader, st, chunk, w.ev);
      EXPECT_FALSE(bt.gradient.defined());
      if (keep > 0) {
        EXPECT_EQ(static_cast<int64_t>(slot.chunks.size()), (bt.b + chunk - 1) / chunk);
        for (const auto& [rows, t] : slot.chunks) {
          ASSERT_TRUE(t.patches.size() > 0 && t.patches[0].defined());  // the first convolution's
        }
      }
      w.finish_batch(st, bt, chunk);
      EXPECT_TRUE(torch::equal(bt.gradient, want));
      for (const auto& [rows, t] : slot.chunks) {
        ASSERT_TRUE(t.gradients.size() > 0 && t.gradients[0].defined());
        EXPECT_FALSE(t.patches[0].defined());
      }
    }
    w.keep_doubles = c.options.memory_doubles / 4;
    ++steps;
  });
  EXPECT_EQ(steps, 3);
}

// A step's kept training rows (views of the replay's layer inputs and
// signals) go when its walk ends: release_kept empties the step's slot,
// except while two steps are kept (the reverse walk's training side
// ahead), and leaving that mode empties both slots.
TEST(SignalsGradient, KeptRowsGoWhenTheStepsWalkEnds) {
  RunWalk c("signals-gradient-kept", "mnist", "cnn:2,3");
  PathReader& reader = c.reader;
  decomposition_walk::Walk& w = c.w;
  ASSERT_TRUE(w.gradient_from_signals);
  ASSERT_GT(w.keep_doubles, 0);
  const int64_t chunk = 7;
  auto held = [&](int64_t step) {
    const auto& slot = w.kept[static_cast<size_t>(step % 2)];
    return slot.step == step && !slot.chunks.empty() && slot.doubles > 0;
  };
  int64_t steps = 0;
  reader.forward([&](const PathStep& st) {
    SCOPED_TRACE("step " + std::to_string(st.step));
    w.ev.set_segment(st.w, st.delta);
    (void)w.batch(reader, st, false, chunk);
    ASSERT_TRUE(held(st.step));
    if (st.step == 1) {  // two steps kept: step 1's rows stay through its release
      w.keep_two_steps(true);
      w.release_kept(st.step);
      EXPECT_TRUE(held(st.step));
      w.keep_two_steps(false);
      EXPECT_TRUE(w.kept[0].chunks.empty() && w.kept[1].chunks.empty());
      EXPECT_EQ(w.kept[0].doubles + w.kept[1].doubles, 0);
    } else {
      w.release_kept(st.step + 2);  // another step of its parity: its slot stays
      EXPECT_TRUE(held(st.step));
      w.release_kept(st.step);
      EXPECT_FALSE(held(st.step));
      EXPECT_TRUE(w.kept[static_cast<size_t>(st.step % 2)].chunks.empty());
    }
    ++steps;
  });
  EXPECT_EQ(steps, 3);
}

}  // namespace
}  // namespace pathkernel

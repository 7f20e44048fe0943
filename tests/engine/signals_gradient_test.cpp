// The batch gradient c_s G_s summed from the training rows' signals
// (Walk::signals_gradient, src/engine/decomposition_walk.cpp) against
// autograd's gradient of the batch's mean loss, the slow reference.
#include <gtest/gtest.h>

#include "../../src/engine/decomposition_walk.h"
#include "../test_util.h"
#include "pathkernel/decomposition.h"

namespace pathkernel {
namespace {

TEST(SignalsGradient, EqualsAutogradsBatchGradient) {
  struct Case {
    std::string data, model;
  };
  for (const Case& c : {Case{"gaussians3", "mlp:6,5"}, Case{"mnist", "cnn:2,3"}}) {
    SCOPED_TRACE(c.model);
    testing::TempDir dir("signals-gradient");
    RunOptions r = testing::small_run(dir / "run", "adam", 3, 3);
    r.data.spec = c.data;
    r.data.train_size = 40;
    r.model = c.model;
    r.data.dtype = torch::kFloat32;  // the signals are recomputed, not the replay's
    train_run(r);
    PathReader reader(r.out);
    DecompositionOptions o;
    o.progress = false;
    decomposition_walk::Walk w(reader, reader.dataset().x_test.narrow(0, 0, 1), o);
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

}  // namespace
}  // namespace pathkernel

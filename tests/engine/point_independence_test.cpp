// A test point's decomposition does not depend on the other points it is
// decomposed with (docs/math.md §11): the same bits alone as in a chunk of
// ten. Splitting the test points across processes (distributed_jobs.h)
// relies on it.
#include <gtest/gtest.h>

#include "../test_util.h"
#include "pathkernel/decomposition.h"

namespace pathkernel {
namespace {

TEST(PointIndependence, EachPointAloneGivesTheBitsOfTheWholeChunk) {
  for (const std::string opt : {"gd", "sgd", "momentum", "adam"}) {
    testing::TempDir dir(opt);
    RunOptions r = testing::small_run(dir / "run", opt, 6, 2);
    // 24 x 24: whether a point's second layer is contracted densely depends
    // on its own quadrature rows (12 or fewer: by rows), so a chunk mixes both.
    r.model = "mlp:24,24";
    r.train.optimizer.weight_decay = 1e-2;
    train_run(r);
    PathReader reader(r.out);
    const torch::Tensor x = reader.dataset().x_test.narrow(0, 0, 10);
    DecompositionOptions options;
    options.progress = false;
    options.kernel = opt == "gd" || opt == "sgd";
    const Decomposition all = decompose(reader, x, options);
    for (int64_t i = 0; i < x.size(0); ++i) {
      const Decomposition one = decompose(reader, x.narrow(0, i, 1), options);
      const std::string where = opt + ", test point " + std::to_string(i);
      EXPECT_TRUE(torch::equal(one.contributions[0], all.contributions[i])) << where;
      EXPECT_TRUE(torch::equal(one.rounding[0], all.rounding[i])) << where;
      EXPECT_TRUE(torch::equal(one.regularization[0], all.regularization[i])) << where;
      EXPECT_TRUE(torch::equal(one.f0[0], all.f0[i])) << where;
      EXPECT_TRUE(torch::equal(one.fN[0], all.fN[i])) << where;
      if (options.kernel) EXPECT_TRUE(torch::equal(one.kernel[0], all.kernel[i])) << where;
    }
    EXPECT_LT(summarize(all).max_rel_error, 1e-10) << opt;
  }
}

}  // namespace
}  // namespace pathkernel

// explain --by-layer (ExplainOptions::by_layer): layer_contributions.npy,
// its entry in explain.json and each listed point's split.
#include <gtest/gtest.h>

#include <filesystem>

#include "../test_util.h"
#include "pathkernel/explanation.h"
#include "pathkernel/files.h"
#include "pathkernel/npy.h"

namespace pathkernel {
namespace {

TEST(ExplainByLayer, WritesTheSplitThatSumsToTheContributions) {
  testing::TempDir dir("by_layer");
  RunOptions r = testing::small_run(dir / "run", "momentum", 5, 2);
  train_run(r);
  PathReader reader(r.out);
  ExplainOptions options;
  options.decomposition.progress = false;
  options.top = 3;
  const torch::Tensor idx = torch::tensor({4, 0}, torch::kLong);
  const Explanation plain = explain(reader, idx, dir / "plain", options);
  EXPECT_FALSE(std::filesystem::exists(dir / "plain/layer_contributions.npy"));
  EXPECT_EQ(read_file(dir / "plain/explain.json").find("layer_contributions"), std::string::npos);
  EXPECT_EQ(read_file(dir / "plain/explain.json").find("\"layers\""), std::string::npos);
  options.by_layer = true;
  const Explanation e = explain(reader, idx, dir / "split", options);
  EXPECT_EQ(read_file(dir / "split/contributions.npy"), read_file(dir / "plain/contributions.npy"));
  EXPECT_FALSE(std::filesystem::exists(dir / "split/.progress"));

  const torch::Tensor layers = read_npy(dir / "split/layer_contributions.npy");
  const Manifest& m = reader.manifest();
  const int64_t L = static_cast<int64_t>(m.parameters.size());
  EXPECT_EQ(layers.sizes(), (std::vector<int64_t>{2, m.num_train, m.num_classes, L}));
  const torch::Tensor c = e.decomposition.contributions;
  EXPECT_LE((layers.sum(3) - c).abs().max().item<double>(), 1e-12 * c.abs().max().item<double>());

  const ExplainDirectory back = read_explain_directory(dir / "split", m);
  ASSERT_TRUE(back.document.layers.has_value());
  EXPECT_EQ(back.document.layers->shape, layers.sizes().vec());
  ASSERT_EQ(back.document.layers->tensors.size(), static_cast<size_t>(L));
  for (int64_t t = 0; t < L; ++t) {
    EXPECT_EQ(back.document.layers->tensors[static_cast<size_t>(t)].name, m.parameters[static_cast<size_t>(t)].name);
    EXPECT_EQ(back.document.layers->tensors[static_cast<size_t>(t)].shape, m.parameters[static_cast<size_t>(t)].shape);
  }
  EXPECT_EQ(explain_json(back.document).dump(2), explain_json(e.document).dump(2));
  for (const ExplainedPoint& p : back.document.points) {
    for (const RankedPoint& q : p.proponents) {
      ASSERT_EQ(q.layers.size(), static_cast<size_t>(L));
      double sum = 0;
      for (double v : q.layers) sum += v;
      EXPECT_NEAR(sum, q.value, 1e-12 * std::max(1.0, std::abs(q.value)));
    }
  }
}

}  // namespace
}  // namespace pathkernel

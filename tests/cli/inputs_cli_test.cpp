// The command line's --inputs, --labels and --by-layer (verify, explain):
// what they write and say, and their errors.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "pathkernel/files.h"
#include "pathkernel/npy.h"
#include "pathkernel/path.h"

namespace pathkernel {
namespace {

testing::CommandOutput run(const std::string& args) {
  return testing::run_shell(testing::binary_path() + " --threads 1 --quiet " + args);
}

nlohmann::json last_json(std::string s) {
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return nlohmann::json::parse(s.substr(s.rfind('\n') == std::string::npos ? 0 : s.rfind('\n') + 1));
}

TEST(InputsCli, VerifyAndExplainInputsOfAFile) {
  testing::TempDir dir("inputs_cli");
  const std::string r = dir / "R";
  ASSERT_EQ(run("train --data gaussians3 --train-size 60 --model mlp:6 --optimizer sgd --batch 20 --steps 6 --out " + r)
                .status,
            0);
  PathReader reader(r);
  const torch::Tensor idx = torch::tensor({3, 8}, torch::kLong);
  write_npy(dir / "x.npy", reader.decoded_dataset().x_test.index_select(0, idx));
  write_npy(dir / "y.npy", reader.decoded_dataset().y_test.index_select(0, idx));

  auto v = run("verify " + r + " --inputs " + (dir / "x.npy") + " --labels " + (dir / "y.npy") + " --json");
  ASSERT_EQ(v.status, 0) << v.out;
  const nlohmann::json vj = last_json(v.out);
  EXPECT_EQ(vj["test_points"], 2);
  EXPECT_LE(vj["max_rel_error"].get<double>(), 1e-12);
  EXPECT_EQ(vj["inputs"], dir / "x.npy");
  EXPECT_TRUE(vj.contains("accuracy"));

  auto a = run("explain " + r + " --test-index 3,8 --out " + (dir / "A"));
  ASSERT_EQ(a.status, 0) << a.out;
  auto b = run("explain " + r + " --inputs " + (dir / "x.npy") + " --by-layer --out " + (dir / "B"));
  ASSERT_EQ(b.status, 0) << b.out;
  EXPECT_EQ(read_file(dir / "A/contributions.npy"), read_file(dir / "B/contributions.npy"));
  EXPECT_TRUE(std::filesystem::exists(dir / "B/layer_contributions.npy"));
  EXPECT_TRUE(std::filesystem::exists(dir / "B/inputs.npy"));
  auto rep = run("report " + r + " --explain " + (dir / "B") + " --test 2 --gram-points 0 --grid 0 --out " +
                 (dir / "report.html"));
  ASSERT_EQ(rep.status, 0) << rep.out;
  EXPECT_CONTAINS(read_file(dir / "report.html"), "layer_tensors");
}

TEST(InputsCli, BadFilesAndCombinationsGetClearErrors) {
  testing::TempDir dir("inputs_cli_bad");
  const std::string r = dir / "R";
  ASSERT_EQ(run("train --data gaussians3 --train-size 30 --model mlp:4 --optimizer gd --steps 2 --out " + r).status, 0);
  write_npy(dir / "wide.npy", torch::zeros({2, 7}, torch::kFloat64));
  auto e = run("explain " + r + " --inputs " + (dir / "wide.npy"));
  EXPECT_NE(e.status, 0);
  EXPECT_CONTAINS(e.out, "inputs file '" + (dir / "wide.npy") + "' has shape [2, 7], expected [n, 100]");
  write_npy(dir / "x.npy", torch::zeros({2, 100}, torch::kFloat64));
  write_npy(dir / "y.npy", torch::zeros({3}, torch::kLong));
  e = run("verify " + r + " --inputs " + (dir / "x.npy") + " --labels " + (dir / "y.npy"));
  EXPECT_NE(e.status, 0);
  EXPECT_CONTAINS(e.out, "has shape [3], expected [2] (a label per input)");
  e = run("explain " + r + " --inputs " + (dir / "x.npy") + " --test-index 0");
  EXPECT_NE(e.status, 0);
  EXPECT_CONTAINS(e.out, "excludes");
  e = run("explain " + r + " --labels " + (dir / "y.npy"));
  EXPECT_NE(e.status, 0);
  EXPECT_CONTAINS(e.out, "requires");
  e = run("explain " + r + " --by-layer --method metagradient");
  EXPECT_NE(e.status, 0);
  EXPECT_CONTAINS(e.out, "--inputs and --by-layer belong to --method exact");
}

}  // namespace
}  // namespace pathkernel

// A Gram matrix's file and sidecar: write -> read -> equal, read -> write
// gives the same bytes, and bad sidecars and indices are refused by name.
#include <gtest/gtest.h>

#include <filesystem>

#include "../test_util.h"
#include "pathkernel/files.h"
#include "pathkernel/gram_file.h"
#include "pathkernel/npy.h"

namespace pathkernel {
namespace {

GramOptions quiet(const std::string& kernel, bool trace) {
  GramOptions o;
  o.kernel = GramSpec::parse(kernel);
  o.trace = trace;
  o.progress = false;
  return o;
}

TEST(GramFile, WrittenFilesReadBackEqual) {
  testing::TempDir dir;
  RunOptions r = testing::small_run(dir / "run", "sgd", 3, 2);
  train_run(r);
  PathReader reader(r.out);
  const torch::Tensor rows = torch::tensor({4, 0, 7}, torch::kLong), cols = torch::tensor({1, 2}, torch::kLong);
  for (bool trace : {false, true}) {
    const GramFile g = gram_between(reader, "test", rows, "train", cols, quiet("epk", trace));
    // The matrix is gram() on the chosen points, in the order given.
    const Dataset& data = reader.decoded_dataset();
    const torch::Tensor direct = gram(reader, data.x_test.index_select(0, rows), true, data.x_train.index_select(0, cols),
                                      false, quiet("epk", trace));
    EXPECT_TRUE(torch::equal(g.matrix, direct)) << "trace=" << trace;
    EXPECT_EQ(g.record.shape, trace ? (std::vector<int64_t>{3, 2}) : (std::vector<int64_t>{3, 2, 3, 3}));
    EXPECT_EQ(g.record.row_indices, (std::vector<int64_t>{4, 0, 7}));
    EXPECT_EQ(g.record.quadrature, "gauss");
    EXPECT_EQ(g.record.steps, 3);

    const std::string npy = dir / (trace ? "g/epk_trace.npy" : "g/epk_full.npy");
    const nlohmann::ordered_json j = write_gram_file(npy, g.matrix, g.record);
    const std::string sidecar = npy.substr(0, npy.size() - 4) + ".json";
    EXPECT_EQ(j["file"], std::filesystem::path(npy).filename().string());
    EXPECT_EQ(j["axes"].size(), trace ? 2u : 4u);
    const GramFile back = read_gram_file(sidecar);
    EXPECT_TRUE(torch::equal(back.matrix, g.matrix));
    EXPECT_EQ(back.record.run, g.record.run);
    EXPECT_EQ(back.record.kernel.str(), "epk");
    EXPECT_EQ(back.record.row_set, "test");
    EXPECT_EQ(back.record.col_set, "train");
    EXPECT_EQ(back.record.row_indices, g.record.row_indices);
    EXPECT_EQ(back.record.col_indices, g.record.col_indices);
    EXPECT_EQ(back.record.trace, trace);
    EXPECT_EQ(back.record.shape, g.record.shape);
    EXPECT_EQ(back.record.steps, g.record.steps);
    EXPECT_EQ(back.record.quadrature, g.record.quadrature);
    EXPECT_EQ(back.record.seconds, g.record.seconds);
    // Read, write again: the same bytes.
    const std::string first = read_file(sidecar), first_npy = read_file(npy);
    write_gram_file(npy, back.matrix, back.record);
    EXPECT_EQ(read_file(sidecar), first);
    EXPECT_EQ(read_file(npy), first_npy);
  }
  // A kernel without quadrature says so; ntk:S keeps its step.
  const GramFile n = gram_between(reader, "train", cols, "train", cols, quiet("ntk:1", true));
  EXPECT_EQ(n.record.quadrature, "none");
  write_gram_file(dir / "n.npy", n.matrix, n.record);
  EXPECT_EQ(read_gram_file(dir / "n.json").record.kernel.str(), "ntk:1");
}

TEST(GramFile, BadFilesAndIndicesAreRefusedByName) {
  testing::TempDir dir;
  RunOptions r = testing::small_run(dir / "run", "sgd", 2, 1);
  train_run(r);
  PathReader reader(r.out);
  const torch::Tensor two = torch::arange(2, torch::kLong);
  EXPECT_CONTAINS(testing::error_message([&] {
                    gram_between(reader, "test", torch::tensor({30}, torch::kLong), "train", two, quiet("dpk", true));
                  }),
                  "test index 30 is out of range [0, 30)");
  EXPECT_CONTAINS(testing::error_message([&] { gram_between(reader, "val", two, "train", two, quiet("dpk", true)); }),
                  "point set 'val', expected train or test");

  GramFile g = gram_between(reader, "train", two, "train", two, quiet("dpk", true));
  GramRecord wrong = g.record;
  wrong.shape = {2, 3};
  EXPECT_CONTAINS(testing::error_message([&] { write_gram_file(dir / "w.npy", g.matrix, wrong); }),
                  "does not match its record's shape [2,3]");
  write_gram_file(dir / "g.npy", g.matrix, g.record);
  write_npy(dir / "g.npy", torch::zeros({3, 2}, torch::kFloat64));
  EXPECT_CONTAINS(testing::error_message([&] { read_gram_file(dir / "g.json"); }), "its sidecar says [2,2]");

  struct Case {
    std::string edit, message;
  };
  const nlohmann::ordered_json good = g.record.to_json("g.npy");
  for (const Case& c : std::vector<Case>{{"kernel", "unknown kernel 'rbf'"},
                                         {"outputs", "outputs 'half', expected full or trace"},
                                         {"shape", "does not fit 2 rows, 2 columns and outputs trace"},
                                         {"file", "must be a file name beside the sidecar"},
                                         {"steps", "not a Gram matrix sidecar"},
                                         {"steps_huge", "steps must be a whole number, got 1e+300"},
                                         {"shape_fraction", "shape element must be a whole number, got 2.5"}}) {
    nlohmann::ordered_json j = good;
    if (c.edit == "kernel") j["kernel"] = "rbf";
    if (c.edit == "outputs") j["outputs"] = "half";
    if (c.edit == "shape") j["shape"] = {2, 2, 3, 3};
    if (c.edit == "file") j["file"] = "../g.npy";
    if (c.edit == "steps") j.erase("steps");
    if (c.edit == "steps_huge") j["steps"] = 1e300;
    if (c.edit == "shape_fraction") j["shape"] = {2.5, 2};
    write_file_atomic(dir / "bad.json", j.dump());
    EXPECT_CONTAINS(testing::error_message([&] { read_gram_file(dir / "bad.json"); }), c.message) << c.edit;
  }
  write_file_atomic(dir / "bad.json", "{");
  EXPECT_CONTAINS(testing::error_message([&] { read_gram_file(dir / "bad.json"); }), "is not JSON");
}

}  // namespace
}  // namespace pathkernel

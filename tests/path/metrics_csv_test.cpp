// metrics.csv: written rows read back equal, a real run's file read and
// rewritten byte for byte, and malformed files refused by row.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "../test_util.h"
#include "pathkernel/files.h"
#include "pathkernel/metrics_csv.h"

namespace pathkernel {
namespace {

TEST(MetricsCsv, WrittenRowsReadBackEqual) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const std::vector<MetricsRow> rows = {{0, 0.1, 1.0986122886681098, 0.34},
                                        {1, 1e-3 / 3, 2.0 / 3, 1.0},
                                        {2, 5e-324, 1e308, 0.0},
                                        {3, 0.05, inf, 0.125},
                                        {4, 0.05, nan, 0.0}};
  const std::string text = metrics_csv(rows);
  EXPECT_EQ(text.substr(0, text.find('\n') + 1), "step,lr,loss,batch_accuracy\n");
  const std::vector<MetricsRow> back = parse_metrics_csv(text, "test");
  ASSERT_EQ(back.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(back[i].step, rows[i].step) << i;
    EXPECT_EQ(back[i].lr, rows[i].lr) << i;
    EXPECT_EQ(back[i].batch_accuracy, rows[i].batch_accuracy) << i;
    if (std::isnan(rows[i].loss)) {
      EXPECT_TRUE(std::isnan(back[i].loss)) << i;
    } else {
      EXPECT_EQ(back[i].loss, rows[i].loss) << i;
    }
  }
  EXPECT_EQ(metrics_csv(back), text);
}

TEST(MetricsCsv, ARunsFileReadsBackAndRewritesByteForByte) {
  testing::TempDir dir;
  RunOptions r = testing::small_run(dir / "run", "sgd", 7, 3);
  train_run(r);
  const std::string path = dir / "run/metrics.csv";
  const std::vector<MetricsRow> rows = read_metrics_csv(path);
  ASSERT_EQ(rows.size(), 7u);
  for (size_t s = 0; s < rows.size(); ++s) {
    EXPECT_EQ(rows[s].step, static_cast<int64_t>(s));
    EXPECT_EQ(rows[s].lr, 0.05);
    EXPECT_GT(rows[s].loss, 0);
    EXPECT_GE(rows[s].batch_accuracy, 0);
    EXPECT_LE(rows[s].batch_accuracy, 1);
  }
  EXPECT_EQ(metrics_csv(rows), read_file(path));
}

TEST(MetricsCsv, MalformedFilesAreRefusedByLine) {
  struct Case {
    std::string text, message;
  };
  for (const Case& c : std::vector<Case>{
           {"", "the first line is '', expected the header 'step,lr,loss,batch_accuracy'"},
           {"step,loss\n0,1\n", "expected the header"},
           {"step,lr,loss,batch_accuracy\n0,0.1,1.0\n", "line 2 is '0,0.1,1.0', expected four numbers"},
           {"step,lr,loss,batch_accuracy\n0,0.1,1.0,0.5\n1.5,0.1,1,1\n", "line 3 is '1.5,0.1,1,1'"},
           {"step,lr,loss,batch_accuracy\n-1,0.1,1,1\n", "integral step >= 0"},
           {"step,lr,loss,batch_accuracy\n0,x,1,1\n", "line 2 is '0,x,1,1'"},
       }) {
    EXPECT_CONTAINS(testing::error_message([&] { parse_metrics_csv(c.text, "'m.csv'"); }), c.message);
  }
  EXPECT_EQ(parse_metrics_csv("step,lr,loss,batch_accuracy\r\n0,0.1,1,1\r\n\n", "x").size(), 1u);
}

}  // namespace
}  // namespace pathkernel

// The gnuplot helper: PNGs, data tables and clear errors.
#include "pathkernel/plot.h"

#include <filesystem>

#include "pathkernel/files.h"
#include "../test_util.h"

namespace pathkernel {
namespace {

using testing::error_message;
using testing::ScopedEnv;
using testing::TempDir;

Figure line_figure(const TempDir& dir) {
  Figure f;
  f.png = dir / "sub/line.png";
  f.data = {{"line.dat", data_table({"x", "y"}, {torch::arange(5), torch::arange(5) * 2.0})}};
  f.script = "plot 'line.dat' using 1:2 with lines title 'y = 2x'\n";
  return f;
}

TEST(Plot, WritesPngScriptAndData) {
  TempDir dir;
  render(line_figure(dir));
  const std::string png = read_file(dir / "sub/line.png");
  ASSERT_GT(png.size(), 8u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_CONTAINS(read_file(dir / "sub/line.gp"), "plot 'line.dat'");
  EXPECT_CONTAINS(read_file(dir / "sub/line.dat"), "# x y\n0 0\n1 2\n");
  // Nothing but the figure's own files is left behind.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir / "sub")) files += e.is_regular_file();
  EXPECT_EQ(files, 3);
}

TEST(Plot, MissingGnuplotNamesTheCommand) {
  TempDir dir;
  ScopedEnv env("PATHKERNEL_GNUPLOT", "/nonexistent/gnuplot-missing");
  const std::string msg = error_message([&] { render(line_figure(dir)); });
  EXPECT_CONTAINS(msg, "/nonexistent/gnuplot-missing line.gp");
  EXPECT_CONTAINS(msg, "status 127");
  EXPECT_CONTAINS(msg, "install gnuplot");
  EXPECT_FALSE(std::filesystem::exists(dir / "sub/line.png"));
}

TEST(Plot, GnuplotErrorsAreShown) {
  TempDir dir;
  Figure f = line_figure(dir);
  f.script = "plot 'no-such-file.dat' using 1:2\n";
  const std::string msg = error_message([&] { render(f); });
  EXPECT_CONTAINS(msg, "cannot draw");
  EXPECT_CONTAINS(msg, "no-such-file.dat");
  EXPECT_FALSE(std::filesystem::exists(dir / "sub/line.png"));
}

TEST(Plot, DataTableChecksColumns) {
  EXPECT_EQ(data_table({"a", "b"}, {torch::tensor({1.5, 2.0}), torch::tensor({int64_t{3}, int64_t{4}})}),
            "# a b\n1.5 3\n2 4\n");
  EXPECT_CONTAINS(error_message([] { data_table({"a", "b"}, {torch::zeros({2}), torch::zeros({3})}); }),
                  "column 'b' has 3 rows, expected 2");
  EXPECT_CONTAINS(error_message([] { data_table({"a"}, {torch::zeros({2}), torch::zeros({2})}); }),
                  "1 column names for 2 columns");
}

}  // namespace
}  // namespace pathkernel

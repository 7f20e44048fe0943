// End to end: train a small MNIST run, explain two test digits, write the
// report with the CLI, check its numbers against contributions.npy, then load
// it in headless Chromium: no console errors, the key elements present, and a
// screenshot that is not blank. Skipped (with the reason) without Chromium.
#include <gtest/gtest.h>
#include <stb_image.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "pathkernel/files.h"
#include "pathkernel/npy.h"

namespace pathkernel {
namespace {

using Output = testing::CommandOutput;

Output shell(const std::string& cmd) { return testing::run_shell(cmd); }

Output pathkernel(const std::string& args) { return shell(std::string(PATHKERNEL_BINARY) + " --threads 1 " + args); }

/// The JSON the page plots, cut out of the HTML.
nlohmann::json page_data(const std::string& html) {
  const std::string open = "<script type=\"application/json\" id=\"pk-data\">";
  const size_t a = html.find(open);
  EXPECT_NE(a, std::string::npos);
  const size_t b = html.find("</script>", a);
  std::string text = html.substr(a + open.size(), b - a - open.size());
  return nlohmann::json::parse(text);
}

const char* kChromium = "/usr/bin/chromium";

/// Headless Chromium on a file with a fresh profile; `what` is --dump-dom or --screenshot=PATH.
Output chromium(const std::string& page, const std::string& profile, const std::string& what) {
  return shell(std::string("timeout 180 ") + kChromium +
               " --headless --no-sandbox --disable-gpu --no-first-run --disable-background-networking"
               " --disable-component-update --disable-sync --user-data-dir=" + profile +
               // No network at all: the report must render from the file alone.
               " --host-resolver-rules='MAP * ~NOTFOUND' --proxy-server=127.0.0.1:9" +
               " --enable-logging=stderr --v=0 --window-size=1400,4000 --virtual-time-budget=20000 " + what +
               " file://" + page);
}

class ReportCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir("report");
    const std::string r = *dir_ / "R";
    Output t = pathkernel("train --data mnist --train-size 300 --test-size 50 --model mlp:8 --optimizer sgd "
                          "--batch 50 --lr 0.1 --steps 24 --quiet --out " + r);
    ASSERT_EQ(t.status, 0) << t.out;
    Output e = pathkernel("explain " + r + " --test-index 0,7 --top 8 --quiet");
    ASSERT_EQ(e.status, 0) << e.out;
    Output mg = pathkernel("explain " + r + " --method metagradient --test-index 0 --quiet");
    ASSERT_EQ(mg.status, 0) << mg.out;
    Output rep = pathkernel("report " + r + " --test 6 --gram-points 20 --quiet --out " + (*dir_ / "report.html"));
    ASSERT_EQ(rep.status, 0) << rep.out;
    report_out_ = new std::string(rep.out);
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete report_out_;
  }
  static testing::TempDir* dir_;
  static std::string* report_out_;
};
testing::TempDir* ReportCli::dir_ = nullptr;
std::string* ReportCli::report_out_ = nullptr;

TEST_F(ReportCli, PerStepCurvesSumToContributionsNpy) {
  ASSERT_NE(dir_, nullptr);
  EXPECT_CONTAINS(*report_out_, "wrote " + (*dir_ / "report.html"));
  const nlohmann::json data = page_data(read_file(*dir_ / "report.html"));
  const torch::Tensor c = read_npy(*dir_ / "R/explain/contributions.npy");  // [2, M, K]
  ASSERT_EQ(data["points"].size(), 2u);
  int checked = 0;
  for (size_t e = 0; e < 2; ++e) {
    const auto& p = data["points"][e];
    const int64_t k = p["predicted"].get<int64_t>();
    for (const char* side : {"proponents", "opponents"}) {
      ASSERT_EQ(p[side].size(), 8u) << side;
      for (const auto& t : p[side]) {
        double sum = 0, mass = 0;
        for (double v : t["per_step"]) {
          sum += v;
          mass += std::abs(v);
        }
        ASSERT_EQ(t["per_step"].size(), 24u);
        const double want = c[static_cast<int64_t>(e)][t["index"].get<int64_t>()][k].item<double>();
        // The page keeps four significant digits of each term.
        EXPECT_NEAR(sum, want, 1e-3 * mass + 1e-12) << "test " << p["test_index"] << " training " << t["index"];
        EXPECT_NEAR(t["total"].get<double>(), want, 1e-3 * std::abs(want) + 1e-12);
        EXPECT_EQ(t["input"]["png"].get<std::string>().rfind("data:image/png;base64,", 0), 0u);
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 32);
  EXPECT_LT(data["kernel_machine"]["max_rel_error"].get<double>(), 1e-10);
  EXPECT_EQ(data["kernel_machine"]["test_index"].size(), 6u);
  EXPECT_EQ(data["steps"]["certificate_gap"].size(), 24u);
  EXPECT_EQ(data["gram"]["index"].size(), 20u);
}

TEST_F(ReportCli, BadInputGetsAClearError) {
  ASSERT_NE(dir_, nullptr);
  Output missing = pathkernel("report " + (*dir_ / "nowhere"));
  EXPECT_NE(missing.status, 0);
  EXPECT_CONTAINS(missing.out, "run directory '" + (*dir_ / "nowhere") + "' does not exist");
  Output bad = pathkernel("report " + (*dir_ / "R") + " --explain " + (*dir_ / "R/checkpoints"));
  EXPECT_NE(bad.status, 0);
  EXPECT_CONTAINS(bad.out, "has no explain.json");
  Output option = pathkernel("report " + (*dir_ / "R") + " --colour red");
  EXPECT_NE(option.status, 0);
  EXPECT_CONTAINS(option.out, "--colour");
}

TEST_F(ReportCli, OpensInHeadlessChromium) {
  ASSERT_NE(dir_, nullptr);
  if (!std::filesystem::exists(kChromium)) {
    std::printf("skipping the browser test: %s is not installed (scripts/deps.sh installs Debian's chromium)\n",
                kChromium);
    GTEST_SKIP() << kChromium << " is not installed (scripts/deps.sh installs Debian's chromium)";
  }
  const std::string page = *dir_ / "report.html";
  const Output dom = chromium(page, *dir_ / "profile-dom", "--dump-dom");
  ASSERT_EQ(dom.status, 0) << dom.out.substr(0, 4000);
  // Console errors and uncaught exceptions set the page's status (page.js); Chromium logs them too.
  EXPECT_CONTAINS(dom.out, "data-status=\"ok\"");
  EXPECT_EQ(dom.out.find("Uncaught"), std::string::npos) << dom.out.substr(0, 4000);
  for (const char* id : {"id=\"plot-training\"", "id=\"plot-scatter\"", "id=\"plot-certificate\"",
                         "id=\"plot-mass\"", "id=\"plot-angle\"", "id=\"plot-gram\"", "id=\"pk-max-error\"",
                         "id=\"test-input\"", "id=\"point-0\"", "id=\"plot-views-0\"", "id=\"point-7\"", "class=\"tile proponents\"",
                         "class=\"tile opponents\"", "id=\"pk-manifest\"", "id=\"curve-0\""}) {
    EXPECT_CONTAINS(dom.out, id);
  }
  // Plotly drew every plot: 6 sections, one curve per explained point and the
  // metagradient's scatter of the one point it explains.
  EXPECT_CONTAINS(dom.out, "data-plots=\"9\"");
  EXPECT_NE(dom.out.find("class=\"main-svg\""), std::string::npos);

  const std::string png = *dir_ / "screenshot.png";
  const Output shot = chromium(page, *dir_ / "profile-shot", "--screenshot=" + png);
  ASSERT_EQ(shot.status, 0) << shot.out.substr(0, 4000);
  ASSERT_TRUE(std::filesystem::exists(png)) << shot.out.substr(0, 4000);
  int w = 0, h = 0, c = 0;
  unsigned char* px = stbi_load(png.c_str(), &w, &h, &c, 3);
  ASSERT_NE(px, nullptr) << "cannot decode " << png;
  std::set<uint32_t> colours;
  int64_t non_white = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(w) * h; ++i) {
    const unsigned char* p = px + 3 * i;
    colours.insert((uint32_t(p[0]) << 16) | (uint32_t(p[1]) << 8) | p[2]);
    non_white += (p[0] < 245 || p[1] < 245 || p[2] < 245);
  }
  stbi_image_free(px);
  EXPECT_GE(w, 1000);
  EXPECT_GT(colours.size(), 200u) << "the screenshot looks blank";
  EXPECT_GT(static_cast<double>(non_white) / (static_cast<double>(w) * h), 0.03) << "the screenshot looks blank";
}

}  // namespace
}  // namespace pathkernel

// End to end: train a small MNIST run, explain two test digits, evaluate the
// attributions, write the report with the CLI, check its numbers against
// contributions.npy and evaluate.json, then load it in headless Chromium: no
// console errors, the key elements present, and a screenshot that is not
// blank; a report written before evaluate has no evaluation section. The
// browser parts are skipped (with the reason) without Chromium.
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

Output pathkernel(const std::string& args) { return shell(pathkernel::testing::binary_path() + " --threads 1 " + args); }

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
    // Before evaluate has run: a page without its section.
    Output plain = pathkernel("report " + r + " --test 2 --gram-points 0 --out " + (*dir_ / "plain.html"));
    ASSERT_EQ(plain.status, 0) << plain.out;
    plain_out_ = new std::string(plain.out);
    Output ev = pathkernel("evaluate " + r + " --test-index 0,7 --methods epk,grad-dot,random --metrics loo,lds "
                           "--loo-extremes 2 --loo-random 3 --lds-subsets 4 --workers 2 --quiet");
    ASSERT_EQ(ev.status, 0) << ev.out;
    Output rep = pathkernel("report " + r + " --test 6 --gram-points 20 --quiet --out " + (*dir_ / "report.html"));
    ASSERT_EQ(rep.status, 0) << rep.out;
    report_out_ = new std::string(rep.out);
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete report_out_;
    delete plain_out_;
  }
  static testing::TempDir* dir_;
  static std::string* report_out_;
  static std::string* plain_out_;
};
testing::TempDir* ReportCli::dir_ = nullptr;
std::string* ReportCli::report_out_ = nullptr;
std::string* ReportCli::plain_out_ = nullptr;

bool has_chromium() {
  if (std::filesystem::exists(kChromium)) return true;
  std::printf("skipping the browser test: %s is not installed (scripts/deps.sh installs Debian's chromium)\n",
              kChromium);
  return false;
}

/// The report finds RUN/evaluate by itself and shows what evaluate wrote
/// there (read here on its own): the table, and per test point every
/// method's leave-one-out scores and actual changes.
TEST_F(ReportCli, EvaluationSectionShowsWhatEvaluateWrote) {
  ASSERT_NE(dir_, nullptr);
  const nlohmann::json want = nlohmann::json::parse(read_file(*dir_ / "R/evaluate/evaluate.json"));
  const nlohmann::json data = page_data(read_file(*dir_ / "report.html"));
  ASSERT_TRUE(data.contains("evaluation"));
  const nlohmann::json& ev = data["evaluation"];
  EXPECT_EQ(ev["dir"], *dir_ / "R/evaluate");
  EXPECT_EQ(ev["table"], want["table"]);
  EXPECT_EQ(ev["methods"], nlohmann::json(std::vector<std::string>{"epk", "grad-dot", "random"}));
  ASSERT_EQ(ev["loo"]["per_test"].size(), 2u);
  for (size_t t = 0; t < 2; ++t) {
    const nlohmann::json& w = want["loo"]["per_test"][t];
    const nlohmann::json& p = ev["loo"]["per_test"][t];
    EXPECT_EQ(p["test_index"], t == 0 ? 0 : 7);
    ASSERT_EQ(p["index"], w["sample"]);
    for (size_t r = 0; r < w["sample"].size(); ++r) {
      const double e = w["effect"][r], g = w["scores"]["grad-dot"][r];
      // The page keeps four significant digits.
      EXPECT_NEAR(p["effect"][r].get<double>(), e, 5e-4 * std::abs(e)) << r;
      EXPECT_NEAR(p["scores"]["grad-dot"][r].get<double>(), g, 5e-4 * std::abs(g)) << r;
    }
    EXPECT_EQ(p["spearman"], w["spearman"]);
  }
}

/// With no evaluate output the report says nothing of it and has no section.
TEST_F(ReportCli, NoEvaluationSectionWithoutEvaluateOutput) {
  ASSERT_NE(dir_, nullptr);
  EXPECT_EQ(plain_out_->find("evaluate"), std::string::npos) << *plain_out_;
  const nlohmann::json data = page_data(read_file(*dir_ / "plain.html"));
  EXPECT_FALSE(data.contains("evaluation"));
  if (!has_chromium()) GTEST_SKIP() << kChromium << " is not installed (scripts/deps.sh installs Debian's chromium)";
  const Output dom = chromium(*dir_ / "plain.html", *dir_ / "profile-plain", "--dump-dom");
  ASSERT_EQ(dom.status, 0) << dom.out.substr(0, 4000);
  EXPECT_CONTAINS(dom.out, "data-status=\"ok\"");
  EXPECT_CONTAINS(dom.out, "id=\"plot-training\"");
  // (The page's script is in the dump too, so look for what it would draw.)
  for (const char* absent : {"id=\"evaluation\"", "id=\"pk-evaluate-table\"", "id=\"plot-evaluate-0\"",
                             "<h2>Attributions against retraining</h2>"}) {
    EXPECT_EQ(dom.out.find(absent), std::string::npos) << absent;
  }
}

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
  Output no_eval = pathkernel("report " + (*dir_ / "R") + " --evaluate " + (*dir_ / "nowhere"));
  EXPECT_NE(no_eval.status, 0);
  EXPECT_CONTAINS(no_eval.out, "--evaluate '" + (*dir_ / "nowhere") + "' does not exist");
  Output bad_eval = pathkernel("report " + (*dir_ / "R") + " --evaluate " + (*dir_ / "R/checkpoints"));
  EXPECT_NE(bad_eval.status, 0);
  EXPECT_CONTAINS(bad_eval.out, "has no evaluate.json");
  Output option = pathkernel("report " + (*dir_ / "R") + " --colour red");
  EXPECT_NE(option.status, 0);
  EXPECT_CONTAINS(option.out, "--colour");
}

TEST_F(ReportCli, OpensInHeadlessChromium) {
  ASSERT_NE(dir_, nullptr);
  if (!has_chromium()) GTEST_SKIP() << kChromium << " is not installed (scripts/deps.sh installs Debian's chromium)";
  const std::string page = *dir_ / "report.html";
  const Output dom = chromium(page, *dir_ / "profile-dom", "--dump-dom");
  ASSERT_EQ(dom.status, 0) << dom.out.substr(0, 4000);
  // Console errors and uncaught exceptions set the page's status (page.js); Chromium logs them too.
  EXPECT_CONTAINS(dom.out, "data-status=\"ok\"");
  EXPECT_EQ(dom.out.find("Uncaught"), std::string::npos) << dom.out.substr(0, 4000);
  for (const char* id : {"id=\"plot-training\"", "id=\"plot-scatter\"", "id=\"plot-certificate\"",
                         "id=\"plot-mass\"", "id=\"plot-angle\"", "id=\"plot-gram\"", "id=\"pk-max-error\"",
                         "id=\"test-input\"", "id=\"point-0\"", "id=\"plot-views-0\"", "id=\"point-7\"", "class=\"tile proponents\"",
                         "class=\"tile opponents\"", "id=\"pk-manifest\"", "id=\"curve-0\"",
                         "id=\"evaluation\"", "id=\"pk-evaluate-table\"", "id=\"plot-evaluate-0\"",
                         "id=\"plot-evaluate-1\"", "id=\"caption-evaluate-0\"", "id=\"pk-evaluate-note\""}) {
    EXPECT_CONTAINS(dom.out, id);
  }
  // The captions give each method's correlations; the table has a row per method.
  EXPECT_CONTAINS(dom.out, "test #7, output ");
  EXPECT_CONTAINS(dom.out, "epk Spearman ");
  EXPECT_CONTAINS(dom.out, "; grad-dot Spearman ");
  EXPECT_CONTAINS(dom.out, "<td>random</td>");
  // Plotly drew every plot: 6 sections, one curve per explained point, the
  // metagradient's scatter of the one point it explains, and evaluate's
  // leave-one-out scatter of its two test points.
  EXPECT_CONTAINS(dom.out, "data-plots=\"11\"");
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

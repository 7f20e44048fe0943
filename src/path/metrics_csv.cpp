// metrics.csv: its rows written and read back.
#include "pathkernel/metrics_csv.h"

#include <cmath>
#include <cstdio>

#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/text.h"

namespace pathkernel {

std::string metrics_csv_header() { return "step,lr,loss,batch_accuracy\n"; }

std::string metrics_csv_row(const MetricsRow& row) {
  char line[128];
  std::snprintf(line, sizeof line, "%lld,%.17g,%.17g,%.17g\n", static_cast<long long>(row.step), row.lr, row.loss,
                row.batch_accuracy);
  return line;
}

std::string metrics_csv(const std::vector<MetricsRow>& rows) {
  std::string text = metrics_csv_header();
  for (const MetricsRow& r : rows) text += metrics_csv_row(r);
  return text;
}

std::vector<MetricsRow> parse_metrics_csv(const std::string& text, const std::string& where) {
  const std::vector<std::string> lines = split(text, '\n');
  const std::string header = trim(metrics_csv_header(), "\n");
  const std::string first = lines.empty() ? "" : trim(lines.front(), "\r");
  PK_CHECK(first == header, where << ": the first line is '" << first << "', expected the header '" << header << "'");
  std::vector<MetricsRow> rows;
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::string line = trim(lines[i], "\r");
    if (line.empty()) continue;
    const std::vector<std::string> cells = split(line, ',');
    double v[4] = {0, 0, 0, 0};
    bool ok = cells.size() == 4;
    for (size_t c = 0; ok && c < 4; ++c) ok = parse_number(cells[c], v[c]);
    ok = ok && std::isfinite(v[0]) && v[0] >= 0 && v[0] == std::floor(v[0]);
    PK_CHECK(ok, where << ": line " << i + 1 << " is '" << line
                       << "', expected four numbers step,lr,loss,batch_accuracy with an integral step >= 0");
    rows.push_back({static_cast<int64_t>(v[0]), v[1], v[2], v[3]});
  }
  return rows;
}

std::vector<MetricsRow> read_metrics_csv(const std::string& path) {
  return parse_metrics_csv(read_file(path), "'" + path + "'");
}

}  // namespace pathkernel

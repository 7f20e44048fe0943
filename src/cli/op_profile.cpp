#include "op_profile.h"

#include <ATen/record_function.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>
#include <vector>

#include "op_callers.h"
#include "pathkernel/files.h"

namespace pathkernel::cli {

namespace {

using Clock = std::chrono::steady_clock;

/// The operations in progress on one thread, outermost first.
struct OpenOp {
  const char* name;
  Clock::time_point start;
};

struct Totals {
  int64_t calls = 0;
  double seconds = 0;
};

/// The shapes of an operation's tensor inputs (a list's in turn), e.g. "[15, 16, 14, 14] [64, 16, 3, 3]".
std::string input_shapes(const at::RecordFunction& fn) {
  std::ostringstream out;
  auto add = [&](const at::Tensor& t) {
    if (t.defined()) out << (out.tellp() > 0 ? " " : "") << t.sizes();
  };
  for (const c10::IValue& v : fn.inputs()) {
    if (v.isTensor()) add(v.toTensor());
    if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) add(t);
    }
  }
  return out.str();
}

}  // namespace

struct OpProfile::Tally {
  std::mutex mutex;
  std::atomic<int> threads{0};
  /// (thread, operation, input shapes) -> totals, of operations called from
  /// outside any other.
  std::map<std::tuple<int, std::string, std::string>, Totals> by_shape;
  /// (operation, the program's frames that called it) -> totals, over threads.
  std::map<std::pair<std::string, ProgramCallers>, Totals> by_callers;
};

namespace {

OpProfile::Tally* active = nullptr;  // the one profile's tally, while it lives
int generation = 0;                  // profiles begun in this process

struct ThreadState {
  int generation = 0;  // the profile the rest is of
  int thread = -1;
  std::vector<OpenOp> open;
  std::string shapes;  // the outermost operation's input shapes
  ProgramCallers callers{};  // the outermost operation's callers in the program
};
thread_local ThreadState state;

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (active == nullptr) return nullptr;
  if (state.generation != generation) {
    state = ThreadState();
    state.generation = generation;
  }
  if (state.thread < 0) state.thread = active->threads++;
  if (state.open.empty()) {
    state.shapes = input_shapes(fn);
    state.callers = program_callers();
  }
  state.open.push_back({fn.name(), Clock::now()});
  return nullptr;
}

void on_end(const at::RecordFunction&, at::ObserverContext*) {
  if (active == nullptr || state.open.empty()) return;  // after the profile, or started before it
  const OpenOp op = state.open.back();
  state.open.pop_back();
  if (!state.open.empty()) return;
  const double seconds = std::chrono::duration<double>(Clock::now() - op.start).count();
  std::lock_guard<std::mutex> lock(active->mutex);
  Totals& s = active->by_shape[{state.thread, op.name, state.shapes}];
  ++s.calls;
  s.seconds += seconds;
  Totals& c = active->by_callers[{op.name, state.callers}];
  ++c.calls;
  c.seconds += seconds;
}

/// Rows "seconds calls thread operation [shapes]", costliest first, at most `limit`.
template <typename Key>
void write_rows(std::ostringstream& out, const std::map<Key, Totals>& totals, size_t limit,
                std::string (*label)(const Key&)) {
  std::vector<std::pair<const Key*, const Totals*>> rows;
  for (const auto& [key, t] : totals) rows.push_back({&key, &t});
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second->seconds > b.second->seconds; });
  char line[64];
  for (size_t i = 0; i < rows.size() && i < limit; ++i) {
    std::snprintf(line, sizeof line, "%10.3f %9lld  ", rows[i].second->seconds,
                  static_cast<long long>(rows[i].second->calls));
    out << line << label(*rows[i].first) << "\n";
  }
}

std::string outer_label(const std::pair<int, std::string>& k) {
  return "thread " + std::to_string(k.first) + "  " + k.second;
}

std::string shape_label(const std::tuple<int, std::string, std::string>& k) {
  return "thread " + std::to_string(std::get<0>(k)) + "  " + std::get<1>(k) + "  " + std::get<2>(k);
}

std::string caller_label(const std::pair<std::string, std::string>& k) { return k.first + "  " + k.second; }

/// The totals by (the pathkernel function that called the operation, the
/// operation), the callers' frames named by one call of addr2line.
std::map<std::pair<std::string, std::string>, Totals> by_calling_function(
    const std::map<std::pair<std::string, ProgramCallers>, Totals>& by_callers) {
  std::map<uintptr_t, std::string> name;
  for (const auto& [key, t] : by_callers) {
    for (uintptr_t a : key.second) {
      if (a != 0) name[a];
    }
  }
  std::vector<uintptr_t> offsets;
  for (const auto& [a, n] : name) offsets.push_back(a);
  const std::vector<std::string> names = program_functions(offsets);
  for (size_t i = 0; i < offsets.size(); ++i) name[offsets[i]] = names[i];
  std::map<std::pair<std::string, std::string>, Totals> out;
  for (const auto& [key, t] : by_callers) {
    std::vector<std::string> frames;
    for (uintptr_t a : key.second) frames.push_back(a != 0 ? name[a] : "");
    std::string function = calling_function(frames);
    Totals& sum = out[{function.empty() ? "(no frame of the program)" : function, key.first}];
    sum.calls += t.calls;
    sum.seconds += t.seconds;
  }
  return out;
}

}  // namespace

OpProfile::OpProfile(std::string path) : path_(std::move(path)), tally_(std::make_unique<Tally>()) {
  ++generation;
  active = tally_.get();
  handle_ = at::addGlobalCallback(at::RecordFunctionCallback(on_start, on_end).needsInputs(true));
}

OpProfile::~OpProfile() {
  active = nullptr;  // operations still running on other threads count no more
  at::removeCallback(handle_);
  std::ostringstream out;
  {
    std::lock_guard<std::mutex> lock(tally_->mutex);
    std::map<std::pair<int, std::string>, Totals> outer;  // (thread, operation), over their shapes
    std::map<int, Totals> per_thread;
    for (const auto& [key, t] : tally_->by_shape) {
      for (Totals* sum : {&outer[{std::get<0>(key), std::get<1>(key)}], &per_thread[std::get<0>(key)]}) {
        sum->calls += t.calls;
        sum->seconds += t.seconds;
      }
    }
    out << "# pathkernel operation profile: LibTorch operations called from outside any other, per thread\n"
        << "# (0: the program's own thread; others in the order they first ran one)\n"
        << "# seconds     calls  thread  operation\n";
    for (const auto& [thread, t] : per_thread) {
      out << "# thread " << thread << ": " << t.calls << " operations, " << t.seconds << " s\n";
    }
    write_rows(out, outer, 200, outer_label);
    out << "\n# the same by their inputs' shapes\n";
    write_rows(out, tally_->by_shape, 200, shape_label);
    out << "\n# the same by the pathkernel function that called them, over the threads\n";
    write_rows(out, by_calling_function(tally_->by_callers), 200, caller_label);
  }
  try {
    write_file_atomic(path_, out.str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pathkernel: warning: the operation profile was not written: %s\n", e.what());
  }
}

std::unique_ptr<OpProfile> op_profile_from_environment() {
  const char* path = std::getenv("PATHKERNEL_OP_PROFILE");
  if (path == nullptr || *path == '\0') return nullptr;
  return std::make_unique<OpProfile>(path);
}

}  // namespace pathkernel::cli

// The machine a run was trained on, as far as replaying it bit for bit
// depends on it.
//
// Replay re-runs the recorded steps and compares the checkpoints bit for bit.
// The same code on the same inputs rounds the same way only when the
// floating-point kernels are the same: the CPU's instruction set picks the
// BLAS kernels (OpenBLAS chooses them per CPU at run time) and LibTorch's own
// vectorised kernels, and the thread count splits reductions. The manifest
// records this environment so that a replay that differs on another machine
// can say which of these differ.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace pathkernel {

/// The most threads a run may say it trained on (its training's, its
/// OpenBLAS's): a manifest's larger count is a hostile or corrupt number.
constexpr int64_t kMaxRunThreads = 4096;

struct ReplayEnvironment {
  std::string cpu;             ///< the CPU model name, e.g. "AMD EPYC 7B13"
  std::string cpu_capability;  ///< LibTorch's vectorised kernel family: "AVX512", "AVX2", "DEFAULT"
  std::string blas;            ///< the BLAS library LibTorch calls, e.g. "OpenBLAS 0.3.21 ..."
  std::string blas_kernels;    ///< the BLAS's kernel family for this CPU, e.g. "Haswell", "Zen"
  std::string libtorch;        ///< LibTorch version
  int64_t threads = 0;         ///< intra-op threads
  /// OpenBLAS's own threads where they were not `threads`: a recorder's
  /// loop (torch.set_num_threads leaves OpenBLAS's count alone), or one for
  /// a network with a convolution that the engine's own training ran on
  /// several threads (training_blas_threads); 0: not recorded, the same as
  /// `threads`. A product split
  /// over more threads may add in another order, so a replay runs OpenBLAS
  /// at the run's count (PathReader::run_blas_threads).
  int64_t blas_threads = 0;
  /// The pieces each Linear layer's products were split into
  /// (pieced_linear.h): pathkernel's own MLP trained on several threads
  /// (training_linear_pieces); 0: not recorded, one piece. The replay splits
  /// them the same, whatever its threads.
  int64_t linear_pieces = 0;

  /// This process's environment, with the given thread count.
  static ReplayEnvironment current(int64_t threads);

  /// Whether nothing was recorded (runs written before the field existed).
  bool empty() const { return cpu.empty() && blas.empty() && libtorch.empty(); }

  nlohmann::ordered_json to_json() const;
  /// Parses the object written by to_json(); throws Error naming a mistyped field.
  static ReplayEnvironment from_json(const nlohmann::ordered_json& j);

  /// The fields in which `here` differs from this (recorded) environment, each
  /// as "<what> '<here>' (the run recorded '<this>')"; empty when they agree
  /// or when this is empty.
  std::vector<std::string> differences(const ReplayEnvironment& here) const;
};

}  // namespace pathkernel

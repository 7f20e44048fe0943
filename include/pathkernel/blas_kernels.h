// Which of OpenBLAS's kernels a pathkernel process uses, chosen before
// OpenBLAS loads (it reads OPENBLAS_CORETYPE once, as it loads).
//
// OpenBLAS picks its kernels from the CPU's model number. A CPU it does not
// know (a newer model, or one a virtual machine describes only by its
// features) gets its oldest x86-64 kernels, "Prescott": on the 2-core
// machine of docs/cli.md float64 matrix products ran 4.7 times slower with
// them than with SkylakeX's (scripts/blas_kernels.sh measures it).
// pathkernel chooses by the CPU's features instead, with two rules:
// - a run is replayed with the kernels that trained it (its manifest's
//   environment.blas_kernels): replay reproduces the checkpoints bit for bit
//   only with the same arithmetic, and kernels differ in their rounding;
// - otherwise, the best kernels the CPU can run.
// A user's OPENBLAS_CORETYPE is kept as it is.
//
// Header-only, without LibTorch: the `pathkernel` launcher uses it.
#pragma once

#include <strings.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace pathkernel {

/// What the CPU (and the operating system, which must save the wider
/// registers) supports of the instruction sets OpenBLAS's kernels use.
struct CpuFeatures {
  bool avx512 = false;  ///< AVX-512 F, DQ, BW and VL
  bool avx512_bf16 = false;  ///< AVX-512 BF16 (OpenBLAS's Cooperlake kernels; AMD's Zen 4 has it too)
  bool avx2_fma = false;
  bool avx = false;

  static CpuFeatures current() {
    CpuFeatures c;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    c.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
    c.avx512_bf16 = c.avx512 && __builtin_cpu_supports("avx512bf16");
    c.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    c.avx = __builtin_cpu_supports("avx");
#endif
    return c;
  }
};

/// The best OpenBLAS kernels for a CPU with `cpu`'s features, as
/// OPENBLAS_CORETYPE names them, or "" to leave the choice to OpenBLAS.
inline std::string best_blas_kernels(const CpuFeatures& cpu) {
  if (cpu.avx512) return "SkylakeX";
  if (cpu.avx2_fma) return "Haswell";
  return "";
}

/// Whether OpenBLAS's kernels `a` and `b` (OPENBLAS_CORETYPE names, any
/// case) do the same float64 arithmetic, so that switching between them
/// would gain nothing: the same name, or one of two pairs.
/// - Zen and Haswell: OpenBLAS's Zen target builds its GEMM from Haswell's
///   kernels; on a 2-core AMD EPYC without AVX-512, float64 products up to an
///   inner dimension of 10,000 and a convolution through LibTorch gave the
///   same bits with either, at the same speed.
/// - Cooperlake and SkylakeX: OpenBLAS's Cooperlake target is SkylakeX's
///   kernels and blocking with bfloat16 kernels added; on a 2-core AMD EPYC
///   with AVX-512 BF16, float64 products up to an inner dimension of 10,000
///   and a convolution gave the same bits with either, at the same speed
///   (scripts/blas_kernels.sh: 64.4 and 64.6 GFLOP/s). Their float32
///   products differ, which is why a run recorded with Cooperlake is still
///   replayed with Cooperlake (blas_kernels_for); only the engine's float64
///   work is spared a switch.
inline bool same_blas_arithmetic(const std::string& a, const std::string& b) {
  auto is = [](const std::string& x, const char* name) { return ::strcasecmp(x.c_str(), name) == 0; };
  if (is(a, b.c_str())) return true;
  auto pair = [&](const char* x, const char* y) { return (is(a, x) && is(b, y)) || (is(a, y) && is(b, x)); };
  return pair("Zen", "Haswell") || pair("Cooperlake", "SkylakeX");
}

/// The best kernels for a CPU with `cpu`'s features (best_blas_kernels)
/// where they are wider than `kernels`, the ones in use: not the same float64
/// arithmetic. "" when there are none, or when `kernels` is "" (unknown).
/// What the engine switches to for its own work, and what a run trained on
/// `kernels` gives up for its replays.
inline std::string wider_blas_kernels(const std::string& kernels, const CpuFeatures& cpu) {
  const std::string best = best_blas_kernels(cpu);
  if (best.empty() || kernels.empty() || same_blas_arithmetic(kernels, best)) return "";
  return best;
}

/// Whether a CPU with `cpu`'s features runs OpenBLAS's kernels `name`:
/// false for names this table does not know (they are not forced).
inline bool runs_blas_kernels(const CpuFeatures& cpu, const std::string& name) {
  for (const char* sse : {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Nano", "Opteron",
                          "Opteron(SSE3)", "Barcelona", "Bobcat"}) {
    if (name == sse) return true;  // every x86-64 CPU has SSE3
  }
  if (name == "Sandybridge" || name == "Bulldozer" || name == "Piledriver") return cpu.avx;
  if (name == "Haswell" || name == "Zen" || name == "Steamroller" || name == "Excavator") return cpu.avx2_fma;
  if (name == "SkylakeX") return cpu.avx512;
  if (name == "Cooperlake") return cpu.avx512_bf16;
  return false;
}

/// The kernels recorded by the run in `dir` (its manifest.json's
/// environment.blas_kernels), or "" when `dir` is not a run or records none.
inline std::string recorded_blas_kernels(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return "";
  std::ifstream in(dir + "/manifest.json");
  if (!in) return "";
  const nlohmann::json m = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!m.is_object() || !m.contains("environment") || !m["environment"].is_object()) return "";
  const nlohmann::json& kernels = m["environment"].value("blas_kernels", nlohmann::json());
  return kernels.is_string() ? kernels.get<std::string>() : "";
}

/// The OPENBLAS_CORETYPE for a command line: the kernels recorded by the
/// first run directory among `args` when this CPU runs them, else the best
/// for this CPU ("" for OpenBLAS's own choice).
inline std::string blas_kernels_for(int argc, char** argv, const CpuFeatures& cpu) {
  for (int i = 1; i < argc; ++i) {
    const std::string recorded = recorded_blas_kernels(argv[i]);
    if (!recorded.empty()) return runs_blas_kernels(cpu, recorded) ? recorded : best_blas_kernels(cpu);
  }
  return best_blas_kernels(cpu);
}

/// Set (to "1") beside OPENBLAS_CORETYPE when pathkernel chose the kernels,
/// not the user: the engine may then switch them (blas_switch.h).
constexpr const char* kBlasKernelsChosenVariable = "PATHKERNEL_CHOSE_BLAS_KERNELS";

/// Sets OPENBLAS_CORETYPE for this command line unless the user set it;
/// true when it set it (the process must then start again for OpenBLAS to
/// read it).
inline bool choose_blas_kernels(int argc, char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return false;
  const std::string kernels = blas_kernels_for(argc, argv, CpuFeatures::current());
  if (kernels.empty()) return false;
  ::setenv("OPENBLAS_CORETYPE", kernels.c_str(), 1);
  ::setenv(kBlasKernelsChosenVariable, "1", 1);
  return true;
}

}  // namespace pathkernel

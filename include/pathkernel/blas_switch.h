// OpenBLAS's kernels switched inside one process: a run's replay with the
// kernels that trained it, the engine's own float64 arithmetic with the best
// kernels for this CPU.
//
// A run is replayed bit for bit only with the kernels that trained it
// (blas_kernels.h), so the `pathkernel` launcher loads OpenBLAS with those.
// A loop recorded from Python where OpenBLAS did not know the CPU ran with
// its oldest x86-64 kernels ("Prescott"), and the whole decomposition then ran
// with them too: on the user CNN of docs/measurements.md their float64
// matrix products took half of `verify`'s time, at a quarter of the speed of
// the AVX-512 ones. OpenBLAS built with DYNAMIC_ARCH (Debian's) chooses its
// kernels once, as it loads, from OPENBLAS_CORETYPE, and exports the two
// functions that do it; calling them again switches the kernels. The path
// reader (src/path/path_reader.cpp) hands each replayed step to the engine
// inside an EngineBlasKernels scope.
//
// A switch must not meet a BLAS call in flight on another thread (OpenBLAS
// forgets its kernels, then chooses again: a call in flight crashes). Scopes
// are opened and closed between the steps of a walk, and work a walk hands
// to another thread that may outlast a step (the reverse walk's training
// side formed ahead) holds a BlasKernelsHeld, for which a switch waits.
// OpenBLAS's thread count is the process's too: a replayed step that sets
// the run's count keeps such work out meanwhile (BlasAlone).
//
// A float32 run needs no switch at all. OpenBLAS calls every routine through
// one table of kernels, and a float32 replay calls only its float32 entries,
// the engine's float64 work only the float64 ones. mix_blas_kernels has
// OpenBLAS run a table of its own: the run's kernels' table with the float64
// entries (the double-precision block sizes, kernels and copy routines) of
// the widest kernels this CPU runs. The replay then keeps its bits and runs
// ahead of the walk, which runs at the wider kernels' speed.
#pragma once

#include <string>

namespace pathkernel {

/// The kernels OpenBLAS runs now, as OPENBLAS_CORETYPE names them
/// ("SkylakeX", "Prescott"), or "" when the BLAS cannot switch its kernels
/// (not OpenBLAS, or OpenBLAS built for one CPU).
std::string active_blas_kernels();

/// Switches OpenBLAS to the kernels `name` (an OPENBLAS_CORETYPE name, which
/// this CPU must run: blas_kernels.h's runs_blas_kernels). True when OpenBLAS
/// runs them afterwards; false, with the kernels unchanged, when the BLAS
/// cannot switch or does not know `name`. OPENBLAS_CORETYPE is left as it
/// was (child processes load with it).
bool switch_blas_kernels(const std::string& name);

/// Has OpenBLAS run its float64 routines with the kernels
/// `float64_kernels` (an OPENBLAS_CORETYPE name this CPU runs) and every
/// other routine with the kernels it runs now (active_blas_kernels), which
/// stay what active_blas_kernels names. True when it does afterwards
/// (at once when it already did); false, with the kernels unchanged, when
/// the BLAS cannot switch, does not know the name, or its table of kernels
/// is not laid out as checked here (the float64 entries found by the names
/// of the kernels they point to). switch_blas_kernels ends the mix.
bool mix_blas_kernels(const std::string& float64_kernels);

/// OpenBLAS back to one set of kernels, the active ones; nothing while it
/// runs one set already.
void unmix_blas_kernels();

/// The kernels of OpenBLAS's float64 routines while mixed (mix_blas_kernels);
/// "" while OpenBLAS runs one set of kernels.
std::string mixed_float64_kernels();

/// For a run whose replay is float32: the float64 routines mixed onto the
/// widest kernels this CPU runs where they are wider than the active ones
/// (wider_blas_kernels), whoever chose those. For any other run
/// unmix_blas_kernels: its replay calls the float64 routines. Between a
/// walk's uses of the BLAS, as a run is opened.
void blas_kernels_for_replay(bool float32_replay);

/// Whether pathkernel chose this process's kernels (the launcher, or the
/// program's own re-execution, set OPENBLAS_CORETYPE): a user's own
/// OPENBLAS_CORETYPE is kept by every switch (EngineBlasKernels), and by
/// a mix for every routine but the float64 ones of a float32 run's walk.
bool blas_kernels_chosen_by_pathkernel();

/// The kernels an EngineBlasKernels scope would switch to: the best for
/// this CPU when pathkernel chose the process's kernels and they are
/// others; "" when a scope would switch nothing (and while mixed: the
/// float64 routines already run the widest).
std::string engine_blas_kernels();

/// Work on another thread that calls the BLAS with the kernels of when it
/// was handed on: made by the handing thread, before it hands the work on,
/// and ended by the work (on its own thread) when its last BLAS call is
/// done. switch_blas_kernels waits until no BlasKernelsHeld is left, so the
/// work neither crashes nor runs on other kernels (other bits) than its
/// hander meant.
class BlasKernelsHeld {
 public:
  BlasKernelsHeld();
  ~BlasKernelsHeld();
  BlasKernelsHeld(const BlasKernelsHeld&) = delete;
  BlasKernelsHeld& operator=(const BlasKernelsHeld&) = delete;
};

/// For its scope, no work handed on to another thread calls the BLAS: made
/// once no BlasKernelsHeld is left, and a new one waits until the scope
/// ends. For a replayed step that runs OpenBLAS at the run's thread count,
/// which is the process's: work on another thread would run on that count,
/// or set its own back in the middle of the step (a user CNN's replay in
/// turn with a reverse walk drifted at one of its ten checkpoints, another
/// each run). The scope's own thread must not make a BlasKernelsHeld.
class BlasAlone {
 public:
  BlasAlone();
  ~BlasAlone();
  BlasAlone(const BlasAlone&) = delete;
  BlasAlone& operator=(const BlasAlone&) = delete;
};

/// The BlasKernelsHeld alive now (for tests).
int blas_kernels_held();

/// For its scope, the best kernels for this CPU (best_blas_kernels) when
/// pathkernel chose the process's kernels and they are others; the kernels
/// before it at its end.
class EngineBlasKernels {
 public:
  EngineBlasKernels();
  ~EngineBlasKernels();
  EngineBlasKernels(const EngineBlasKernels&) = delete;
  EngineBlasKernels& operator=(const EngineBlasKernels&) = delete;

 private:
  std::string previous_;  ///< the kernels to restore; "" when nothing was switched
};

}  // namespace pathkernel

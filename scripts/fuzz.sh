#!/usr/bin/env bash
# make fuzz: builds the libFuzzer harnesses (fuzz/) with clang in build-fuzz/
# and runs each for FUZZ_SECONDS (default 60) from its committed seed corpus
# fuzz/corpus/NAME. New inputs go to build-fuzz/corpus/NAME, crashes to
# build-fuzz/artifacts/NAME/. Prints a table (also written to
# build-fuzz/results.md) and fails if any harness found a crash.
#
#   FUZZ_SECONDS=600 make fuzz            # longer runs
#   FUZZ_HARNESSES="npy manifest" make fuzz
#   FUZZ_SEED=1 make fuzz                 # the same inputs in the same order
#                                         # on every machine (CI); 0: random
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_EACH=${FUZZ_SECONDS:-60}
HARNESSES=${FUZZ_HARNESSES:-idx csv manifest npy npydir points inputs}
BUILD=${FUZZ_BUILD:-build-fuzz}
case $BUILD in /*) ;; *) BUILD=$PWD/$BUILD ;; esac
CXX_FUZZ=${FUZZ_CXX:-clang++-14}
JOBS=${JOBS:-$(nproc)}

# A cache made with another compiler or without PATHKERNEL_FUZZ is started
# afresh (CMake would otherwise drop the options on a compiler change).
cxx_path=$(command -v "$CXX_FUZZ") || { echo "fuzz: $CXX_FUZZ not found (run scripts/deps.sh --fuzz)" >&2; exit 1; }
if [[ -f "$BUILD/CMakeCache.txt" ]] &&
   ! { grep -qx "CMAKE_CXX_COMPILER:[A-Z]*=$cxx_path" "$BUILD/CMakeCache.txt" &&
       grep -qx "PATHKERNEL_FUZZ:BOOL=ON" "$BUILD/CMakeCache.txt"; }; then
  rm -rf "$BUILD/CMakeCache.txt" "$BUILD/CMakeFiles"
fi
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DPATHKERNEL_FUZZ=ON \
  -DCMAKE_CXX_COMPILER="$cxx_path" > /dev/null
# The fuzz build holds only the harnesses; build them all in parallel.
cmake --build "$BUILD" -j "$JOBS"

# Huge allocations count as crashes: a header claiming 10^12 elements must be
# refused, not allocated.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_container_overflow=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# The harnesses' scratch files (the manifest harness's run directory) go here.
export TMPDIR=$BUILD/tmp
rm -rf "$TMPDIR" && mkdir -p "$TMPDIR"
results="$BUILD/results.md"
{
  echo "| harness | seconds | execs | execs/s | cov | ft | corpus | peak RSS (MB) | crashes |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
} > "$results"
failed=0
for h in $HARNESSES; do
  mkdir -p "$BUILD/corpus/$h" "$BUILD/artifacts/$h" "$BUILD/logs"
  log="$BUILD/logs/$h.log"
  echo "fuzz: $h for ${SECONDS_EACH} s" >&2
  status=0
  OMP_NUM_THREADS=1 "$BUILD/fuzz_$h" -max_total_time="$SECONDS_EACH" -seed="${FUZZ_SEED:-0}" -rss_limit_mb=2048 \
    -malloc_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$BUILD/artifacts/$h/" "$BUILD/corpus/$h" "fuzz/corpus/$h" > "$log" 2>&1 || status=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<< "$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<< "$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<< "$last")
  crashes=$(find "$BUILD/artifacts/$h" -type f | wc -l)
  if [[ $status -ne 0 ]]; then
    failed=1
    echo "fuzz: $h FAILED (exit $status); see $log and $BUILD/artifacts/$h/" >&2
    grep -E "ERROR|SUMMARY|pathkernel fuzz|terminate" "$log" | head -5 >&2 || true
  fi
  rate=$(( ${execs:-0} / (SECONDS_EACH > 0 ? SECONDS_EACH : 1) ))
  echo "| $h | $SECONDS_EACH | ${execs:-?} | $rate | ${cov:-?} | ${ft:-?} | ${corp:-?} | ${rss:-?} | $crashes |" >> "$results"
done
rm -rf "$TMPDIR"
cat "$results"
exit $failed

#!/usr/bin/env bash
# make test-sanitize: builds the library, the CLI and the tests with
# AddressSanitizer and UndefinedBehaviorSanitizer in build-sanitize/ and runs
# the suite there. Any report in pathkernel's own code fails the run.
#
# LibTorch, OpenMP and OpenBLAS are not instrumented; the suppressions in
# tests/sanitize/ are scoped to those libraries only (see docs/fuzzing.md).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${SANITIZE_BUILD:-build-sanitize}
JOBS=${JOBS:-$(nproc)}
SUPP=$PWD/tests/sanitize

# detect_container_overflow=0: LibTorch's std::vector code is not
# instrumented, so ASan's container annotations see half the operations and
# report false overflows; real heap overflows are still caught.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:detect_container_overflow=0:abort_on_error=0:strict_string_checks=1:check_initialization_order=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$SUPP/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1:suppressions=$SUPP/ubsan.supp}

start=$(date +%s)
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DPATHKERNEL_SANITIZE=ON > /dev/null
cmake --build "$BUILD" -j "$JOBS"
built=$(date +%s)
# SANITIZE_ONLY / SANITIZE_EXCLUDE: ctest -R / -E regexes selecting tests
# (all by default).
(cd "$BUILD" && ctest --output-on-failure -j "$JOBS" ${SANITIZE_ONLY:+-R "$SANITIZE_ONLY"} \
  ${SANITIZE_EXCLUDE:+-E "$SANITIZE_EXCLUDE"})
end=$(date +%s)
echo "test-sanitize: build $((built - start)) s, tests $((end - built)) s"

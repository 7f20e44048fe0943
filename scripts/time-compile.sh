#!/usr/bin/env bash
# Build-time measurement (cmake -DPATHKERNEL_TIME_COMPILES=ON): CMake runs
# every compilation and link through this script, which runs it and appends its wall
# seconds and its output to $PATHKERNEL_COMPILE_TIMES (one line each, tab
# separated). `sort -rn build/compile-times.tsv | head` lists the slowest.
log=${PATHKERNEL_COMPILE_TIMES:?PATHKERNEL_COMPILE_TIMES must name the log file}
object=?
args=("$@")
for ((i = 0; i < ${#args[@]} - 1; i++)); do
  [[ ${args[i]} == -o ]] && object=${args[i + 1]}
done
start=$(date +%s.%N)
"$@"
status=$?
end=$(date +%s.%N)
awk -v s="$start" -v e="$end" -v o="$object" 'BEGIN { printf "%.2f\t%s\n", e - s, o }' >> "$log"
exit $status

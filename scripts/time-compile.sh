#!/usr/bin/env bash
# Build-time measurement (cmake -DPATHKERNEL_TIME_COMPILES=ON): CMake runs
# every compilation and link through this script, which runs it and appends its wall
# seconds and its output to $PATHKERNEL_COMPILE_TIMES (one line each, tab
# separated). `sort -rn build/compile-times.tsv | head` lists the slowest.
log=${PATHKERNEL_COMPILE_TIMES:?PATHKERNEL_COMPILE_TIMES must name the log file}
object=?
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  if [[ ${args[i]} == -o ]] && ((i + 1 < ${#args[@]})); then
    object=${args[i + 1]}
  elif [[ ${args[i]} == */link.txt ]]; then  # a link: cmake -E cmake_link_script DIR/link.txt
    object="link ${args[i]%/link.txt}"
  fi
done
start=$(date +%s.%N)
"$@"
status=$?
end=$(date +%s.%N)
awk -v s="$start" -v e="$end" -v o="$object" 'BEGIN { printf "%.2f\t%s\n", e - s, o }' >> "$log"
exit $status

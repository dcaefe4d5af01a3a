#!/usr/bin/env bash
# Runs every README.md command block marked `<!-- readme-test -->` (the
# blocks that start a daemon or a job), each in its own process group from
# the repository root with `bash -e`, bounded by README_RECIPE_TIMEOUT_S
# (300) seconds; whatever a block leaves running is killed. Prints one line
# per block and "N passed, N failed"; exit code non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."
timeout_s=${README_RECIPE_TIMEOUT_S:-300}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# Extract the marked blocks into $dir/block_N.sh.
awk -v dir="$dir" '
  /^<!-- readme-test -->$/ { marked = 1; next }
  marked && /^```/ && !inside { inside = 1; n++; file = dir "/block_" n ".sh"; next }
  inside && /^```/ { inside = 0; marked = 0; close(file); next }
  inside { print > file }
' README.md
passed=0
failed=0
for block in "$dir"/block_*.sh; do
  [[ -f $block ]] || continue
  name=$(basename "$block" .sh)
  log=$dir/$name.log
  start=$(date +%s)
  setsid bash -e "$block" >"$log" 2>&1 &
  pid=$!
  rc=0
  # Wait with a bound; then stop the block's whole process group.
  for ((i = 0; i < timeout_s * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "readme_recipes: $name timed out after ${timeout_s} s"
    rc=124
  else
    wait "$pid" || rc=$?
  fi
  kill -TERM -- "-$pid" 2>/dev/null || true
  sleep 0.2
  kill -KILL -- "-$pid" 2>/dev/null || true
  if [[ $rc -eq 0 ]]; then
    echo "readme_recipes: $name OK ($(( $(date +%s) - start )) s)"
    passed=$((passed + 1))
  else
    echo "readme_recipes: $name FAILED (exit $rc); its output:"
    sed 's/^/    /' "$log"
    failed=$((failed + 1))
  fi
done
echo "$passed passed, $failed failed"
[[ $failed -eq 0 && $passed -gt 0 ]]

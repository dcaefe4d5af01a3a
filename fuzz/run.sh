#!/usr/bin/env bash
# Runs one libFuzzer target for SECONDS on its corpus and reports.
#
# Usage: fuzz/run.sh TARGET SECONDS      TARGET: spec, manifest, npy, checkpoint
#   Builds the target (fuzz/build.sh), then fuzzes with the committed seeds
#   fuzz/corpus/TARGET/ (read only) and a working corpus
#   fuzz/out/corpus/TARGET/ (git-ignored; new inputs go there and are reused
#   by later runs), the dictionary fuzz/dict/TARGET.dict, -timeout=10 -rss_limit_mb=2048, -max_len per target.
#   A crash, sanitizer report, leak, timeout or OOM stops the run; its
#   reproducer is written to fuzz/out/artifacts/TARGET/ (crash-*, leak-*,
#   timeout-*, oom-*) and the script exits non-zero. Replay one with
#   `fuzz/out/TARGET_fuzzer FILE`.
# Env: FUZZ_KEEP_GOING=1 keeps fuzzing after a crash/timeout/OOM (libFuzzer's
#   -fork=1 with -ignore_crashes/-ignore_timeouts/-ignore_ooms) to collect
#   several distinct reproducers in one run; any artifact still fails it.
#   FUZZ_NO_BUILD=1 skips the build.
# Before fuzzing, the reproducers kept in fuzz/crashes/TARGET/ (findings
# since fixed) are replayed: one that fails again fails the run.
# Prints one line "fuzz TARGET: N execs in S s, C crashes, T timeouts,
# O ooms/leaks, K corpus units" and the artifacts' paths.
set -uo pipefail
cd "$(dirname "$0")/.."
if [[ $# -ne 2 || ! $2 =~ ^[0-9]+$ ]]; then
  echo "usage: fuzz/run.sh TARGET SECONDS" >&2
  exit 2
fi
target=$1
seconds=$2
case $target in
  spec) max_len=16384 ;;
  manifest) max_len=8192 ;;
  npy) max_len=4096 ;;
  checkpoint) max_len=8192 ;;
  *) echo "fuzz/run.sh: unknown target $target (spec, manifest, npy, checkpoint)" >&2; exit 2 ;;
esac
bin=fuzz/out/${target}_fuzzer
if [[ ${FUZZ_NO_BUILD:-0} != 1 ]]; then
  bash fuzz/build.sh "$target" || { echo "fuzz $target: build failed"; exit 2; }
fi
seeds=fuzz/corpus/$target
work=fuzz/out/corpus/$target
artifacts=fuzz/out/artifacts/$target
mkdir -p "$work" "$artifacts"
log=fuzz/out/$target.log
marker=fuzz/out/.$target.start
touch "$marker"
args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048
  -max_len="$max_len" -artifact_prefix="$artifacts/" -print_final_stats=1)
if [[ -f fuzz/dict/$target.dict ]]; then args+=(-dict="fuzz/dict/$target.dict"); fi
if [[ ${FUZZ_KEEP_GOING:-0} == 1 ]]; then
  args+=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
fi
# Regression: the reproducers of fixed findings (fuzz/crashes/TARGET/) run
# first; any that still fails fails the run.
if compgen -G "fuzz/crashes/$target/*" >/dev/null; then
  if ! "$bin" -timeout=10 -rss_limit_mb=2048 fuzz/crashes/"$target"/* >"$log.replay" 2>&1; then
    echo "fuzz $target: a reproducer in fuzz/crashes/$target/ fails again (log: $log.replay):"
    grep -m3 -E 'Running:|ERROR|runtime error|what\(\)' "$log.replay" | sed 's/^/  /'
    echo "fuzz $target: FAILED"
    exit 1
  fi
fi
start=$(date +%s)
"$bin" "${args[@]}" "$work" "$seeds" >"$log" 2>&1
status=$?
elapsed=$(( $(date +%s) - start ))
crashes=$(grep -c -E '^(==[0-9]+==ERROR|.*runtime error:|==[0-9]+== ERROR: libFuzzer: deadly signal)' "$log")
timeouts=$(grep -c 'ERROR: libFuzzer: timeout' "$log")
ooms=$(grep -c -E 'ERROR: libFuzzer: out-of-memory|ERROR: LeakSanitizer' "$log")
# Fork mode (FUZZ_KEEP_GOING=1) counts in its status lines instead.
if fork=$(grep -o 'oom/timeout/crash: [0-9]*/[0-9]*/[0-9]*' "$log" | tail -1 | grep -o '[0-9/]*$'); then
  IFS=/ read -r o t c <<<"$fork"
  ooms=$((ooms + o)); timeouts=$((timeouts + t)); crashes=$((crashes + c))
fi
execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | awk '{s += $2} END {print s + 0}')
if [[ $execs -eq 0 ]]; then
  # Fork mode prints no final stats: take the last status line's count.
  execs=$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#')
fi
units=$(find "$work" -type f | wc -l)
echo "fuzz $target: ${execs:-0} execs in ${elapsed} s, $crashes crashes, $timeouts timeouts, $ooms ooms/leaks, $units corpus units (log: $log)"
arts=$(find "$artifacts" -type f -newer "$marker" | sort)
if [[ -n $arts ]]; then
  echo "fuzz $target: reproducers (replay with $bin FILE):"
  echo "$arts" | sed 's/^/  /'
  grep -m3 -E 'ERROR|runtime error|terminate called|what\(\)' "$log" | sed 's/^/  /'
fi
if [[ $status -ne 0 || $crashes -ne 0 || $timeouts -ne 0 || $ooms -ne 0 ]]; then
  echo "fuzz $target: FAILED (libFuzzer exit $status)"
  exit 1
fi
echo "fuzz $target: OK"

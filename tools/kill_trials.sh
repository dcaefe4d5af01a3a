#!/bin/sh
# Failure propagation: N (default 100) kill -9 trials of 4 rank processes with a
# muon-coordinator daemon (heartbeat timeout 1 s): a random rank killed at a
# random moment; prints each trial and the tally (hangs, trials where a
# survivor's error did not name the killed rank, seconds from the kill until
# every survivor exited). Exit status: 0 when every trial passed.
#   tools/kill_trials.sh [N] [SEED]
set -eu
n="${1:-100}"
seed="${2:-20261122}"
cd "$(dirname "$0")/.."
if ! bazel build //tests/integration:kill_trials_test >/dev/null 2>&1; then
  bazel build //tests/integration:kill_trials_test
  exit 1
fi
runfiles="bazel-bin/tests/integration/kill_trials_test.runfiles/muon"
cd "$runfiles"
KILL_TRIALS="$n" KILL_TRIALS_SEED="$seed" \
  ./tests/integration/kill_trials_test \
  --gtest_filter='KillTrialsTest.KillRandomRank_*' 2>/dev/null |
  grep -E '^(trial|kill trials|rank [0-9]+ \(exit)|\[  (PASSED|FAILED)'

#!/bin/sh
# Failure propagation: N (default 100) kill -9 trials of 4 rank processes with a
# muon-coordinator daemon (heartbeat timeout 1 s): a random rank killed at a
# random moment; prints each trial and the tally (hangs, trials where a
# survivor's error did not name the killed rank, seconds from the kill until
# every survivor exited). Exit status: 0 when every trial passed.
#   tools/kill_trials.sh [N] [SEED]
# With --hosts: the job as 2 hosts of 2 ranks, each host a muonrun (its host
# agent); N (default 20) trials each of killing a rank, a whole host (muonrun
# and its ranks) and the coordinator.
#   tools/kill_trials.sh --hosts [N]
set -eu
hosts=0
if [ "${1:-}" = "--hosts" ]; then
  hosts=1
  shift
fi
if [ "$hosts" = 1 ]; then n="${1:-20}"; else n="${1:-100}"; fi
seed="${2:-20261122}"
cd "$(dirname "$0")/.."
if ! bazel build //tests/integration:kill_trials_test >/dev/null 2>&1; then
  bazel build //tests/integration:kill_trials_test
  exit 1
fi
runfiles="bazel-bin/tests/integration/kill_trials_test.runfiles/muon"
cd "$runfiles"
if [ "$hosts" = 1 ]; then
  KILL_HOST_TRIALS="$n" ./tests/integration/kill_trials_test \
    --gtest_filter='KillTrialsTest.HostAgents_*' 2>/dev/null |
    grep -E '^(host trial|host kill trials|host [0-9]+ .*did not)|\[  (PASSED|FAILED)'
else
  KILL_TRIALS="$n" KILL_TRIALS_SEED="$seed" \
    ./tests/integration/kill_trials_test \
    --gtest_filter='KillTrialsTest.KillRandomRank_*' 2>/dev/null |
    grep -E '^(trial|kill trials|rank [0-9]+ \(exit)|\[  (PASSED|FAILED)'
fi

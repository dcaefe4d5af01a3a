#!/bin/sh
# The soak of tests/soak:soak_test outside Bazel's test runner, with other
# counts. A muon-coordinator daemon and RANKS (default 8) rank processes (FSDP
# over all of them, Gloo on loopback) run STEPS (default 10000) Muon steps;
# prints one line per process (RSS in kB at the warm-up step, at the end,
# growth, largest sample after warm-up, every sample) and the wall time. Exit
# status 0 when every rank finished every step and no RSS grew past the test's
# bound.
#   tools/soak.sh [STEPS] [RANKS]
# SOAK_WARMUP and SOAK_SAMPLE_EVERY (default 1000 each), SOAK_TIMEOUT_S
# (600) and MUON_JOB_SECRET pass through to the test.
set -eu
steps="${1:-10000}"
ranks="${2:-8}"
cd "$(dirname "$0")/.."
if ! bazel build //tests/soak:soak_test >/dev/null 2>&1; then
  bazel build //tests/soak:soak_test
  exit 1
fi
cd bazel-bin/tests/soak/soak_test.runfiles/muon
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
rc=0
SOAK_STEPS="$steps" SOAK_RANKS="$ranks" ./tests/soak/soak_test >"$log" 2>&1 ||
  rc=$?
grep -Ev '^(\[ *(RUN|OK|==========|----------) *\]|Running main|$)' "$log" || true
exit "$rc"

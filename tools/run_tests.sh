#!/usr/bin/env bash
# Builds everything and runs every test; ends with "N passed, N failed"
# (GoogleTest cases, from each test's XML report; a test target that
# crashed or timed out without a report counts as one failure). Exit code
# non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh || exit 1
rc=0
bazel build //... || rc=$?
if [[ $rc -eq 0 ]]; then
  bazel test --test_summary=short //... 2>&1 | tee /tmp/muon-test-output.txt
  rc=${PIPESTATUS[0]}
else
  : >/tmp/muon-test-output.txt
fi
passed=0
failed=0
skipped=0
while read -r target status; do
  dir=bazel-testlogs/${target#//}
  dir=${dir/://}
  xml=$dir/test.xml
  if [[ -f $xml ]] && grep -q '<testsuites' "$xml"; then
    t=$(grep -m1 -o '<testsuites[^>]*' "$xml" | grep -o ' tests="[0-9]*"' | grep -o '[0-9]*')
    f=$(grep -m1 -o '<testsuites[^>]*' "$xml" | grep -o ' failures="[0-9]*"' | grep -o '[0-9]*')
    e=$(grep -m1 -o '<testsuites[^>]*' "$xml" | grep -o ' errors="[0-9]*"' | grep -o '[0-9]*')
    d=$(grep -m1 -o '<testsuites[^>]*' "$xml" | grep -o ' disabled="[0-9]*"' | grep -o '[0-9]*')
    f=$(( ${f:-0} + ${e:-0} ))
    s=$(grep -c 'result="skipped"' "$xml")
    skipped=$(( skipped + ${s:-0} ))
    passed=$(( passed + ${t:-0} - f - ${d:-0} - ${s:-0} ))
    failed=$(( failed + f ))
    if [[ $status != PASSED && $f -eq 0 ]]; then failed=$((failed + 1)); fi
  elif [[ $status == PASSED ]]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
  fi
done < <(grep -E '^//[^ ]+ +(\(cached\) )?(PASSED|FAILED|TIMEOUT|NO STATUS|FLAKY)' /tmp/muon-test-output.txt \
          | sed -E 's/\(cached\) //' | awk '{print $1, $2}')
# Python tests (the muonrt package over libmuonrt.so), counted the same way
# from pytest's JUnit XML report.
if [[ -d tests/python && $rc -eq 0 ]]; then
  xml=/tmp/muon-pytest.xml
  rm -f "$xml"
  MUONRT_LIBRARY="$PWD/bazel-bin/capi/libmuonrt.so" PYTHONPATH="$PWD/python" \
    MUONRUN="$PWD/bazel-bin/tools/muonrun" \
    timeout -k 10 1800 /usr/bin/python3 -m pytest -q -p no:cacheprovider \
    --junitxml="$xml" tests/python || rc=1
  if [[ -f $xml ]]; then
    attrs=$(grep -m1 -o '<testsuite [^>]*' "$xml")
    num() { echo "$attrs" | grep -o " $1=\"[0-9]*\"" | grep -o '[0-9]*' || echo 0; }
    t=$(num tests); f=$(num failures); e=$(num errors); s=$(num skipped)
    passed=$(( passed + t - f - e - s ))
    failed=$(( failed + f + e ))
    skipped=$(( skipped + s ))
  else
    echo "run_tests: pytest wrote no report"
    failed=$((failed + 1))
  fi
fi
# The CUDA configuration must compile and link too (CI has the toolkit but no
# GPU; GPU tests skip there with their reason).
if [[ -x /usr/local/cuda/bin/nvcc ]]; then
  if ! bazel build --config=cuda //...; then
    echo "run_tests: bazel build --config=cuda //... failed"
    failed=$((failed + 1))
    rc=1
  fi
else
  echo "run_tests: no CUDA toolkit at /usr/local/cuda: skipping the --config=cuda build"
fi
# Formatting: every C++/CUDA source as clang-format (Google style) writes it.
if ! bash tools/check_format.sh; then
  failed=$((failed + 1))
  rc=1
fi
if [[ $rc -ne 0 && $failed -eq 0 ]]; then failed=1; fi
bazel shutdown >/dev/null 2>&1 || true
echo "$passed passed, $failed failed, $skipped skipped"
[[ $rc -eq 0 && $failed -eq 0 ]]

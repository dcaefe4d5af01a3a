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
# Adds the GoogleTest cases of one `bazel test` run (its output in $1) to
# passed/failed/skipped, reading each target's XML report under
# bazel-testlogs (the tree of that run's configuration).
count_bazel_results() {
  local target status dir xml t f e d s
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
  done < <(grep -E '^//[^ ]+ +(\(cached\) )?(PASSED|FAILED|TIMEOUT|NO STATUS|FLAKY)' "$1" \
            | sed -E 's/\(cached\) //' | awk '{print $1, $2}')
}
count_bazel_results /tmp/muon-test-output.txt
# Adds the cases of a pytest JUnit XML report ($1) to the counts; a missing
# report counts as one failure.
count_pytest_results() {
  local xml=$1 attrs t f e s
  if [[ ! -f $xml ]]; then
    echo "run_tests: pytest wrote no report ($xml)"
    failed=$((failed + 1))
    return
  fi
  attrs=$(grep -m1 -o '<testsuite [^>]*' "$xml")
  num() { echo "$attrs" | grep -o " $1=\"[0-9]*\"" | grep -o '[0-9]*' || echo 0; }
  t=$(num tests); f=$(num failures); e=$(num errors); s=$(num skipped)
  passed=$(( passed + t - f - e - s ))
  failed=$(( failed + f + e ))
  skipped=$(( skipped + s ))
}
# The self-contained library (tools/graft_libs.py): libmuonrt.so with its
# own renamed copies of Gloo, gRPC, protobuf, Abseil, OpenBLAS, ... in
# python/muonrt/lib, where the package finds it first; muonrun and muonctl
# on the same copies in python/muonrt/bin.
if [[ $rc -eq 0 ]]; then
  rm -rf python/muonrt/lib python/muonrt/bin
  if ! python3 tools/graft_libs.py --out python/muonrt \
      --bin bazel-bin/tools/muonrun bazel-bin/tools/muonctl -- \
      bazel-bin/capi/libmuonrt.so | tail -n 2; then
    echo "run_tests: tools/graft_libs.py failed"
    rc=1
  fi
fi
# Python tests (the muonrt package over the self-contained libmuonrt.so,
# next to Debian 12's torch 1.13 on Python 3.11), counted the same way from
# pytest's JUnit XML report.
if [[ -d tests/python && $rc -eq 0 ]]; then
  xml=/tmp/muon-pytest.xml
  rm -f "$xml"
  MUONRT_LIBRARY="$PWD/python/muonrt/lib/libmuonrt.so" PYTHONPATH="$PWD/python" \
    MUONRUN="$PWD/bazel-bin/tools/muonrun" \
    timeout -k 10 1800 /usr/bin/python3 -m pytest -q -p no:cacheprovider \
    --junitxml="$xml" tests/python || rc=1
  count_pytest_results "$xml"
fi
# The same package next to PyTorch 2.x: a Debian sid chroot with its
# python3-torch (FSDP2, DTensor, DCP, torch.optim.Muon; made once and
# reused while current, tools/torch2_env.sh), running the suites that use
# torch: the package's own and tests/python/torch2 (real FSDP2/DTensor
# layouts on 4 gloo ranks, and the library beside torch's own Gloo).
TORCH2_TESTS=(tests/python/torch2 tests/python/test_optimizer.py
              tests/python/test_lib.py tests/python/test_state.py
              tests/python/test_dtensor.py tests/python/test_errors.py
              tests/python/test_self_contained.py tests/python/test_overlap.py
              tests/python/test_qk_clip.py tests/python/test_startup.py)
if [[ $rc -eq 0 ]]; then
  start=$SECONDS
  if bash tools/torch2_env.sh make >/dev/null; then
    echo "run_tests: PyTorch 2.x environment ready in $((SECONDS - start)) s"
    root=$(bash tools/torch2_env.sh make 2>/dev/null)
    rm -f "$root/opt/muon/pytest-torch2.xml"
    timeout -k 10 1800 bash tools/torch2_env.sh run python3 -m pytest -q \
      -p no:cacheprovider --junitxml=/opt/muon/pytest-torch2.xml \
      "${TORCH2_TESTS[@]}" || rc=1
    cp "$root/opt/muon/pytest-torch2.xml" /tmp/muon-pytest-torch2.xml 2>/dev/null
    count_pytest_results /tmp/muon-pytest-torch2.xml
  else
    echo "run_tests: making the PyTorch 2.x environment failed"
    failed=$((failed + 1))
    rc=1
  fi
fi
# The docs' command blocks as written (tools/doc_blocks.py: each block
# marked <!-- doc-test --> is one test; the others say why they do not run).
if [[ $rc -eq 0 ]]; then
  summary=$(/usr/bin/python3 tools/doc_blocks.py README.md python/README.md \
    docs/user_guide.md | tee /dev/stderr | tail -1)
  p=$(echo "$summary" | grep -o '^[0-9]* passed' | grep -o '[0-9]*')
  f=$(echo "$summary" | grep -o '[0-9]* failed' | grep -o '[0-9]*')
  passed=$(( passed + ${p:-0} ))
  failed=$(( failed + ${f:-1} ))
  if [[ ${f:-1} -ne 0 ]]; then rc=1; fi
fi
# ThreadSanitizer: the host streams, the step executor on streams (one and
# two ranks over Gloo, both modes, and the deliberately dropped event waits,
# which TSan must report) and the communicators, built with --config=tsan
# (gcc's -fsanitize=thread; a tree of its own). A report fails the test.
# OpenBLAS runs on the calling thread (its own pool synchronizes by
# spinning, which TSan cannot see). No suppressions: the code these tests
# run synchronizes with std:: primitives, which TSan sees.
TSAN_TESTS=(//tests/device:host_stream_test //tests/client:executor_streams_test
            //tests/comm:communicator_test)
if [[ $rc -eq 0 ]]; then
  bazel test --config=tsan --test_env=OPENBLAS_NUM_THREADS=1 --test_summary=short \
    "${TSAN_TESTS[@]}" 2>&1 | tee /tmp/muon-tsan-output.txt
  if [[ ${PIPESTATUS[0]} -ne 0 ]]; then rc=1; fi
  count_bazel_results /tmp/muon-tsan-output.txt
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
# Every package is in the layering test (tests/layering).
if bash tests/layering/check_coverage.sh; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  rc=1
fi
# Fuzzing: each libFuzzer target (fuzz/: job spec, manifests + Join, .npy
# reader, checkpoint reader) built with clang-14 and run for
# ${MUON_FUZZ_SECONDS:-30} s on its corpus, one after another; each target
# counts as one test (a crash, sanitizer report, leak, timeout or OOM fails
# it; the reproducer's path is printed).
if ! command -v clang++-14 >/dev/null; then
  echo "run_tests: clang++-14 not found (apt-get install clang-14 libfuzzer-14-dev): skipping the fuzz targets"
elif [[ ! -f $(clang++-14 -print-file-name=libclang_rt.fuzzer-x86_64.a) ]]; then
  echo "run_tests: libFuzzer runtime not found (apt-get install libfuzzer-14-dev): skipping the fuzz targets"
elif ! bash fuzz/build.sh; then
  echo "run_tests: fuzz/build.sh failed"
  failed=$((failed + 1))
  rc=1
else
  for target in spec manifest npy checkpoint; do
    if FUZZ_NO_BUILD=1 bash fuzz/run.sh "$target" "${MUON_FUZZ_SECONDS:-30}"; then
      passed=$((passed + 1))
    else
      failed=$((failed + 1))
      rc=1
    fi
  done
fi
if [[ $rc -ne 0 && $failed -eq 0 ]]; then failed=1; fi
bazel shutdown >/dev/null 2>&1 || true
echo "$passed passed, $failed failed, $skipped skipped"
[[ $rc -eq 0 && $failed -eq 0 ]]

#!/bin/bash
# Run from the repository root (tools/run_tests.sh does): every top-level
# package with a BUILD.bazel, but the tests, examples and vendored code, is
# in tests/layering/BUILD.bazel's PACKAGES and calls package_deps_query(),
# so that layering_test covers it. (A Bazel test cannot list the
# workspace's packages.)
set -u
failed=0
for build in */BUILD.bazel; do
  pkg=${build%/BUILD.bazel}
  case $pkg in tests | examples | fuzz | python | docs | third_party | bazel-*) continue ;; esac
  if ! grep -q "^    \"$pkg\",$" tests/layering/BUILD.bazel; then
    echo "check_coverage: package $pkg is not in tests/layering/BUILD.bazel's PACKAGES"
    failed=1
  fi
  if ! grep -q '^package_deps_query()' "$build"; then
    echo "check_coverage: $build does not call package_deps_query()"
    failed=1
  fi
done
((failed)) || echo "check_coverage: every package is in the layering test"
exit $failed

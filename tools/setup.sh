#!/usr/bin/env bash
# Installs the Debian packages the project needs (idempotent: quick when they
# are already there). Used by tools/run_job.sh and tools/run_tests.sh.
set -euo pipefail
packages=(
  bazel-bootstrap pkg-config g++ protobuf-compiler protobuf-compiler-grpc
  libgrpc++-dev libprotobuf-dev libabsl-dev libgtest-dev libgmock-dev
  libgloo-dev libopenblas-dev zlib1g-dev dataset-fashion-mnist clang-format
  nlohmann-json3-dev python3-torch python3-pytest python3-numpy
  python3-pip python3-setuptools python3-wheel python3-venv  # pip install ./python (tests, python/README.md)
  libcli11-dev libgoogle-glog-dev prometheus-cpp-dev
  chromium  # tests/python/test_report_page.py: muonctl report in headless Chromium
  iproute2  # ip netns: tests/multihost:two_hosts_test
  clang-14 libfuzzer-14-dev  # fuzz/: libFuzzer targets (fuzz/build.sh)
  patchelf  # tools/graft_libs.py: the self-contained libmuonrt.so
  mmdebstrap  # tools/torch2_env.sh: the PyTorch 2.x chroot (sid)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get -o DPkg::Lock::Timeout=900 update -qq
  "${sudo_cmd[@]}" apt-get -o DPkg::Lock::Timeout=900 install -y -qq "${missing[@]}" >/dev/null
fi

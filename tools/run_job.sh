#!/usr/bin/env bash
# The main job: Fashion-MNIST trained by a PyTorch model (Debian's
# python3-torch) whose matrices muonrt.Muon steps, on 4 rank processes
# launched by muonrun (FSDP-style sharded optimizer state, coordinator
# embedded in rank 0), next to the same trainer in one process and to a
# plain-PyTorch Muon step (examples/fashion_mnist_torch/train.py).
# Extra arguments go to the trainer (e.g. --nproc 2 --epochs 1 --layout ddp).
# The C++-only trainer stays as an example:
#   bazel build //examples/fashion_mnist && bazel-bin/examples/fashion_mnist/fashion_mnist
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bazel build //capi:libmuonrt.so //tools:muonrun //tools:muonctl //server:muon-coordinator
MUONRT_LIBRARY="$PWD/bazel-bin/capi/libmuonrt.so" \
  MUONRUN="$PWD/bazel-bin/tools/muonrun" \
  /usr/bin/python3 examples/fashion_mnist_torch/train.py "$@"

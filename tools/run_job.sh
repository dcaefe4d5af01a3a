#!/usr/bin/env bash
# The main job: Fashion-MNIST on 4 local rank processes (FSDP, distributed
# Muon, coordinator embedded in rank 0) next to a single-device run.
# Extra arguments go to the job (e.g. --nproc 2 --epochs 1 --layout ddp).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bazel build //examples/fashion_mnist:fashion_mnist //server:muon-coordinator //tools:muonctl
bazel-bin/examples/fashion_mnist/fashion_mnist "$@"

#!/usr/bin/env bash
# The main job: Fashion-MNIST trained by a PyTorch 2.x model sharded with
# FSDP2 (fully_shard on a DeviceMesh) on 4 gloo ranks, its DTensor matrices
# stepped by muonrt.Muon, next to the same trainer in one process and to
# torch.optim.Muon (examples/fashion_mnist_torch/train.py). PyTorch 2.x runs
# in a Debian sid chroot made on first use and reused (tools/torch2_env.sh);
# the library is the self-contained libmuonrt.so (tools/graft_libs.py).
# Extra arguments go to the trainer (e.g. --nproc 2 --epochs 1).
# The same trainer runs on the host's torch 1.13 too (hand-made shards,
# muonrun): MUONRT_LIBRARY=python/muonrt/lib/libmuonrt.so
#   /usr/bin/python3 examples/fashion_mnist_torch/train.py
# The C++-only trainer stays as an example:
#   bazel build //examples/fashion_mnist && bazel-bin/examples/fashion_mnist/fashion_mnist
set -euo pipefail
cd "$(dirname "$0")/.."
echo "run_job: installing what is missing (tools/setup.sh)"
bash tools/setup.sh
echo "run_job: building libmuonrt.so and the tools (bazel)"
bazel build //capi:libmuonrt.so //tools:muonrun //tools:muonctl //server:muon-coordinator
echo "run_job: making the self-contained library (python/muonrt/lib)"
rm -rf python/muonrt/lib python/muonrt/bin
python3 tools/graft_libs.py --out python/muonrt --bin bazel-bin/tools/muonrun \
  bazel-bin/tools/muonctl -- bazel-bin/capi/libmuonrt.so | tail -n 1
echo "run_job: the PyTorch 2.x environment (first time: about 2-3 minutes)"
start=$SECONDS
bash tools/torch2_env.sh make >/dev/null
echo "run_job: PyTorch 2.x environment ready in $((SECONDS - start)) s"
bash tools/torch2_env.sh run python3 examples/fashion_mnist_torch/train.py \
  --data-dir /opt/muon/data/fashion-mnist "$@"

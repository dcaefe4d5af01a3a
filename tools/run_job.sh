#!/usr/bin/env bash
# The main job: Fashion-MNIST trained by a PyTorch 2.x model sharded with
# FSDP2 (fully_shard on a DeviceMesh) on 4 gloo ranks, its DTensor matrices
# stepped by muonrt.Muon, next to the same trainer in one process and to
# torch.optim.Muon (examples/fashion_mnist_torch/train.py). PyTorch 2.x runs
# in a Debian sid chroot made on first use and reused (tools/torch2_env.sh);
# the library is the self-contained libmuonrt.so (tools/graft_libs.py).
# Extra arguments go to the trainer (e.g. --nproc 2 --epochs 1).
# --device cuda trains in one process on cuda:0, muonrt.Muon next to
# torch.optim.Muon (no distributed run: several ranks with CUDA parameters
# are not supported yet). The chroot's PyTorch has no CUDA, so that runs
# where python3's PyTorch is 2.x with a CUDA device: the GPU machine, with
# no Bazel and no chroot, from the bundle of tools/pack_device.sh (.device:
# its CUDA build of the library, its launcher for the CUDA and NCCL
# libraries, its Fashion-MNIST files), skipping setup, build and chroot.
# The same trainer runs on the host's torch 1.13 too (hand-made shards,
# muonrun): MUONRT_LIBRARY=python/muonrt/lib/libmuonrt.so
#   /usr/bin/python3 examples/fashion_mnist_torch/train.py
# The C++-only trainer stays as an example:
#   bazel build //examples/fashion_mnist && bazel-bin/examples/fashion_mnist/fashion_mnist
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=.device

# The value of the trainer's --device among the arguments (default cpu).
device_arg() {
  local device=cpu
  while [[ $# -gt 0 ]]; do
    case $1 in
      --device) device=${2:-}; shift ;;
      --device=*) device=${1#--device=} ;;
    esac
    shift
  done
  echo "$device"
}

# Whether python3 here has PyTorch 2.x or later with a CUDA device.
torch_with_cuda() {
  python3 -c 'import sys, torch
sys.exit(int(torch.__version__.split(".")[0]) < 2 or not torch.cuda.is_available())' \
    2>/dev/null
}

# The trainer on this machine's python3, with the bundle's library unpacked
# into /tmp (files written into the bundle do not outlive a device run).
run_from_bundle() {
  local f
  for f in muonrt-lib.tar.xz run.sh bundle.tar.xz data/fashion-mnist; do
    if [[ ! -e $bundle/$f ]]; then
      echo "run_job: --device cuda: $bundle/$f not found; make the bundle" \
        "with bash tools/pack_device.sh (not --without-data) and bring" \
        "$bundle here" >&2
      exit 1
    fi
  done
  lib=$(mktemp -d /tmp/muonrt-job.XXXXXX)
  trap 'rm -rf "$lib"' EXIT
  tar -C "$lib" -xJf "$bundle/muonrt-lib.tar.xz"
  if [[ ! -f $lib/lib/libmuonrt.so ]]; then
    echo "run_job: --device cuda: $bundle/muonrt-lib.tar.xz has no" \
      "lib/libmuonrt.so (pack the bundle again)" >&2
    exit 1
  fi
  echo "run_job: --device cuda on $(python3 -c 'import torch
print("torch", torch.__version__, torch.cuda.get_device_name(0))'), from $bundle"
  "$bundle/run.sh" env MUONRT_LIBRARY="$lib/lib/libmuonrt.so" \
    PYTHONPATH="$PWD/python" python3 examples/fashion_mnist_torch/train.py \
    --data-dir "$PWD/$bundle/data/fashion-mnist" "$@"
}

if [[ $(device_arg "$@") == cuda ]]; then
  if torch_with_cuda; then
    run_from_bundle "$@"
    exit
  fi
  here=$(python3 -c 'import torch
print("torch", torch.__version__, "cuda available", torch.cuda.is_available())' \
    2>&1 | tail -n 1) || true
  echo "run_job: --device cuda: python3 here has no PyTorch 2.x with a CUDA" \
    "device ($here), and the PyTorch 2.x chroot has no CUDA: run it on a GPU" \
    "machine" >&2
  exit 1
fi

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

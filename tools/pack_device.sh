#!/usr/bin/env bash
# Builds the CUDA configuration and packs what a GPU machine needs into
# .device/ (git-ignored, < 64 MiB): the GPU tests, the GPU benchmark, muonctl
# and the coordinator, muonrun and libmuonrt.so (with python/ for muonrt),
# with their Debian libraries (tools/device_bundle.sh), plus the PyTorch comparison scripts, the main job's
# Fashion-MNIST files (data/fashion-mnist) and tools/device_checks.sh,
# which runs them all there:
#   bash tools/pack_device.sh [--without-data]
#   # on the device: bash .device/device_checks.sh   (writes to $OUT)
#   # or the main job alone: bash tools/run_job.sh --device cuda
# --without-data leaves the Fashion-MNIST files out (about 30 MiB of the
# 64 MiB the device run takes): device_checks.sh then records the main
# job's step as skipped, with that reason.
set -euo pipefail
cd "$(dirname "$0")/.."
with_data=1
for arg in "$@"; do
  case $arg in
    --without-data) with_data=0 ;;
    *)
      echo "pack_device: unknown flag '$arg' (only --without-data)" >&2
      exit 2
      ;;
  esac
done
targets=(
  //tests/kernels:gpu_newton_schulz_test
  //tests/kernels:gpu_muon_update_test
  //tests/kernels:cuda_api_test
  //tests/comm:nccl_communicator_test
  //tests/device:cuda_stream_test
  //tests/device:host_stream_test
  //tests/client:executor_streams_test
  //tests/client:gpu_executor_test
  //tests/client:gpu_muon_test
  //tests/control:process_group_backend_test
  //tests/control:staged_ranks_test
  //tests/kernels:step_kernels_test
  //tools:ns_gpu_bench
  //tools:muonctl
  //tools:muonrun
  //server:muon-coordinator
  //capi:libmuonrt.so
)
bazel build --config=cuda "${targets[@]}"
bin=$(bazel info --config=cuda bazel-bin 2>/dev/null)
paths=()
for t in "${targets[@]}"; do
  p=${t#//}
  paths+=("$bin/${p/://}")
done
rm -rf .device
tools/device_bundle.sh .device "${paths[@]}"
# The launcher: it unpacks the bundle, resolves the CUDA/NCCL library
# folders once and says which it chose (tools/device_run.sh).
cp tools/device_run.sh .device/run.sh
cp tools/torch_ns_bench.py tools/torch_muon_compare.py tools/device_checks.sh \
  tools/gpu_step_bench.py tools/ns_accuracy.py .device/
cp -r examples/specs .device/specs
# The Python package and the PyTorch job for the device's PyTorch:
# on the device, MUONRT_LIBRARY=/tmp/muon-bundle/bin/libmuonrt.so and
# PYTHONPATH=.device/python (the bundle's run.sh sets LD_LIBRARY_PATH).
cp -r python .device/python
# (lib/ and bin/ of a host build, when tools/run_tests.sh made them, are
# not the CUDA build's: the archive below replaces them.)
rm -rf .device/python/muonrt/lib .device/python/muonrt/bin
# The self-contained libmuonrt.so of the CUDA build, with muonrun and
# muonctl on the same grafted libraries (tools/graft_libs.py --bin, as
# tools/run_tests.sh makes python/muonrt; the machine's CUDA and NCCL stay
# outside), compressed: lib/ and bin/, which device_checks.sh unpacks into
# a copy of python/muonrt under /tmp, where muonrt finds the library and
# the tests find muonrun (MUONRUN) and muonctl.
graft=$(mktemp -d)
python3 tools/graft_libs.py --out "$graft" \
  --bin "$bin/tools/muonrun" "$bin/tools/muonctl" -- \
  "$bin/capi/libmuonrt.so" | tail -n 1
XZ_OPT=-9 tar -C "$graft" -cJf .device/muonrt-lib.tar.xz .
rm -rf "$graft"
mkdir -p .device/tests && cp -r tests/python .device/tests/python
mkdir -p .device/examples && cp -r examples/fashion_mnist_torch .device/examples/
# The main job's data (the GPU machine has no dataset-fashion-mnist): the
# four gzipped IDX files the trainer reads, about 30 MB.
pack_data() {
  local data=/usr/share/datasets/fashion-mnist f
  mkdir -p .device/data/fashion-mnist
  for f in train-images-idx3-ubyte train-labels-idx1-ubyte \
    t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
    if [[ ! -f $data/$f.gz ]]; then
      echo "pack_device: $data/$f.gz not found (apt-get install" \
        "dataset-fashion-mnist; tools/setup.sh does)" >&2
      exit 1
    fi
    cp "$data/$f.gz" .device/data/fashion-mnist/
  done
  du -sh .device/data
}
if ((with_data)); then pack_data; fi
du -sh .device
# The device machine takes at most 64 MiB of working tree: .device with
# the tracked and untracked-not-ignored files that travel beside it.
tree_bytes=$(git ls-files -z --cached --others --exclude-standard |
  du -cb --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)
total_mib=$(((tree_bytes + $(du -sb .device | cut -f1)) >> 20))
echo "pack_device: $total_mib MiB travel with .device"
if ((total_mib >= 64)); then
  echo "pack_device: .device and the working tree are 64 MiB or more: the" \
    "device run will refuse them (--without-data leaves out 30 MiB)" >&2
  exit 1
fi

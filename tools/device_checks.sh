#!/usr/bin/env bash
# Runs on a GPU machine from the repository root, after tools/pack_device.sh:
# every GPU check of the project, each output saved under $OUT (or /tmp/out).
#   1. GPU Newton-Schulz vs the CPU float64 reference (bf16/tf32/fp32),
#      fused kernels, CUDA API checks;
#   2. the device layer (CUDA streams, events, memory; host streams and the
#      stream executor), the NCCL communicator (world size 1, also on a
#      device-layer stream; 2 ranks when 2 GPUs);
#   3. Muon over CUDA parameters (the device-resident step: bitwise equal
#      to host-staged Newton-Schulz in fp32 mode; bf16 within bound), and
#      a single-device GPU step vs torch.optim.Muon (bf16 tolerance), also
#      through muonrt on CUDA tensors (tests/python/test_cuda_step.py);
#   4. 4 host-staged ranks sharing one GPU, bitwise vs single-device GPU;
#   5. Newton-Schulz TFLOP/s vs PyTorch's own and the bf16 GEMM rate.
# MUON_REQUIRE_GPU=1 turns the GPU tests' "no GPU" skips into failures (on
# this machine they mean a broken setup). Each step runs under `timeout`
# ($STEP_TIMEOUT_S seconds, default 300). Prints one line per step and a
# summary; exits 1 when any step failed or timed out.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/out}
step_timeout=${STEP_TIMEOUT_S:-300}
mkdir -p "$out"
export MUON_REQUIRE_GPU=1
failed=()
run() {
  local name=$1
  shift
  echo "== $name: $*"
  timeout -k 10 "$step_timeout" "$@" >"$out/$name.txt" 2>&1
  local rc=$?
  tail -n 5 "$out/$name.txt"
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    echo "== $name: timed out after ${step_timeout}s"
    failed+=("$name (timeout)")
  elif [[ $rc -ne 0 ]]; then
    echo "== $name: exit $rc"
    failed+=("$name (exit $rc)")
  else
    echo "== $name: ok"
  fi
}
{
  ldd --version | head -n 1
  nvidia-smi
} >"$out/nvidia-smi.txt" 2>&1
head -n 1 "$out/nvidia-smi.txt"
run gpu_newton_schulz_test "$here/run.sh" bin/gpu_newton_schulz_test
run gpu_muon_update_test "$here/run.sh" bin/gpu_muon_update_test
run cuda_api_test "$here/run.sh" bin/cuda_api_test
run cuda_stream_test "$here/run.sh" bin/cuda_stream_test
run host_stream_test "$here/run.sh" bin/host_stream_test
run executor_streams_test "$here/run.sh" bin/executor_streams_test
run gpu_executor_test "$here/run.sh" bin/gpu_executor_test
run step_kernels_test "$here/run.sh" bin/step_kernels_test
run gpu_muon_test "$here/run.sh" bin/gpu_muon_test
run process_group_backend_test "$here/run.sh" bin/process_group_backend_test
run nccl_communicator_test "$here/run.sh" bin/nccl_communicator_test
run torch_muon_compare python3 "$here/torch_muon_compare.py" \
  --muonctl "$here/run.sh bin/muonctl" --steps 3
# muonrt (ctypes) on CUDA tensors next to this machine's PyTorch, through
# the self-contained library (its own Gloo, gRPC, ... beside torch's).
mkdir -p "$here/python/muonrt/lib"
tar -C "$here/python/muonrt/lib" -xJf "$here/muonrt-lib.tar.xz"
run muonrt_cuda_tensors "$here/run.sh" env -u MUONRT_LIBRARY \
  PYTHONPATH="$here/python" python3 -m pytest -q -p no:cacheprovider -rs \
  "$here/tests/python/test_cuda_step.py" "$here/tests/python/test_self_contained.py"
# The PyTorch 2.x suite (FSDP2 / HSDP / TP / EP layouts, DCP, the library
# beside torch's Gloo, the main job, real torchrun) on this machine's
# PyTorch, which has torchrun's libuv.
run torch2_suite "$here/run.sh" env -u MUONRT_LIBRARY \
  PYTHONPATH="$here/python" python3 -m pytest -q -p no:cacheprovider -rs \
  "$here/tests/python/torch2"
# 4 rank processes, one GPU, host-staged; bitwise vs the single-device GPU run.
spec=$out/fsdp_cuda.json
sed 's/"optimizer"/"execution": {"device": "cuda"}, "optimizer"/' \
  "$here/specs/fsdp.json" >"$spec"
run host_staged_4_ranks "$here/run.sh" bin/muonctl validate --spec "$spec" --steps 3
run ns_gpu_bench "$here/run.sh" bin/ns_gpu_bench
run torch_ns_bench python3 "$here/torch_ns_bench.py"
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "device_checks: ${#failed[@]} failed: ${failed[*]}"
  exit 1
fi
echo "device_checks: all passed"

#!/usr/bin/env bash
# Runs on a GPU machine from the repository root, after tools/pack_device.sh
# (from the bundle: bash .device/device_checks.sh): every GPU check of the
# project inside one time budget, most important first:
#   1. the GPU test binaries: Newton-Schulz vs the CPU float64 reference
#      (bf16/tf32/fp32), fused kernels, CUDA API checks; the device layer
#      (CUDA streams, events, memory; host streams and the stream
#      executor); Muon over CUDA parameters (bitwise the host-staged step
#      in fp32 mode, bf16 within bound); the NCCL communicator (world size
#      1, also on a device-layer stream; 2 ranks when 2 GPUs);
#   2. 4 host-staged ranks sharing the GPU (muonctl validate), bitwise vs
#      the single-device GPU run;
#   3. a single-device GPU step vs torch.optim.Muon (torch_muon_compare.py);
#   4. muonrt (ctypes) on CUDA tensors next to this machine's PyTorch
#      (tests/python/test_cuda_step.py) and the self-contained library;
#   5. the main job on the GPU (what tools/run_job.sh --device cuda runs):
#      Fashion-MNIST, one epoch in one process on cuda:0, muonrt.Muon next
#      to torch.optim.Muon (examples/fashion_mnist_torch/train.py --device
#      cuda, with the bundle's data/fashion-mnist);
#   6. the Llama-3-8B layer-set step, muonrt.Muon vs torch.optim.Muon:
#      time and device memory (gpu_step_bench.py --layers 8), and again
#      with fp32 Z and a Gram restart every 3 iterations, on the
#      sequential and on the async schedule;
#   7. Newton-Schulz TFLOP/s, ours (ns_gpu_bench, standard with and
#      without CUDA graphs, Gram, and symmetric products in 2x2 to 4x4
#      tiles) and
#      PyTorch's (torch_ns_bench.py), vs the bf16 GEMM rate;
#   8. Newton-Schulz accuracy against a float64 run of the same iteration,
#      ours vs torch's (ns_accuracy.py), and again with the bf16 Gram
#      iteration's Z formed in fp32 (MUON_NS_GRAM_FP32_Z=1, with its time),
#      restarting every 2 and every 3 iterations;
#   9. the PyTorch 2.x suite (tests/python/torch2; CPU rank processes, and
#      4 ranks of FSDP2 DTensors sharing the GPU: test_cuda_layouts.py),
#      started in the background with the time left, while
#  10. compute-sanitizer runs: memcheck on gpu_muon_test and the Gram
#      tests, racecheck and synccheck on cuda_stream_test (skipped with the
#      reason when the machine has no compute-sanitizer).
# Before them it records the machine (nvidia-smi, driver, CUDA, torch,
# Python, CPU) in versions.txt.
#
# Time: the whole run keeps within DEADLINE_S seconds (default 540) from
# its start, RESERVE_S (default 15) of them kept for the summary and the
# archive. Each step runs under `timeout` with its own limit (STEP_TIMEOUT_S,
# default 90, unless the step names another), cut to the time left; a step
# that would get less than its minimum (MIN_STEP_S, default 15, unless the
# step names another) is not started and is recorded as "skipped
# (deadline)". MEMCHECK_FILTER (default *) is the --gtest_filter of
# gpu_muon_test under memcheck. ONLY (a bash regex, default empty: all)
# runs the steps whose names match it and records the others as skipped,
# e.g. ONLY='_test$|gpu_step_bench' for a second, shorter run.
# STEP_BENCH_ARGS (default "--layers 8") are gpu_step_bench.py's flags,
# e.g. "--layers 32 --ns-method auto". A TERM, INT or HUP stops the running
# step and still writes the summary and the archive.
#
# Output ($OUT, default /tmp/out), few files since the machine returns at
# most 8: summary.txt (one line per step: name, ok / FAILED / TIMEOUT /
# skipped, seconds, the last line of its log), device_logs.tar.gz (logs/:
# versions.txt and one log per step), the JSON figures gpu_step_bench.json
# and ns_accuracy.json, and step_trace.json and step_trace_async.json
# (muonrt's last Llama step on the sequential and the async schedule as
# Chrome traces, from CUDA events). Exit status 1 when a step failed or
# timed out, else 0.
#
# Files written into the bundle's folder do not survive until the next run
# (the bundle is copied over again), so everything unpacked goes to /tmp:
# the bundle's run.sh unpacks the binaries into /tmp/muon-bundle, and this
# script makes /tmp/muon-py (python/, tests/python, examples/ copied from
# the bundle, muonrt-lib.tar.xz unpacked into python/muonrt: lib/ with the
# self-contained libmuonrt.so, bin/ with muonrun and muonctl).
#
# MUON_REQUIRE_GPU=1 turns the GPU tests' "no GPU" skips into failures (on
# this machine they mean a broken setup).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/out}
deadline_s=${DEADLINE_S:-540}
reserve_s=${RESERVE_S:-15}
step_timeout=${STEP_TIMEOUT_S:-90}
min_step_s=${MIN_STEP_S:-15}
memcheck_filter=${MEMCHECK_FILTER:-*}
only=${ONLY:-}
# gpu_step_bench.py's problem (the Llama-3-8B layer set) and muonrt's
# Newton-Schulz method there.
read -r -a step_bench_args <<<"${STEP_BENCH_ARGS:---layers 8}"
logs=$out/logs
# Where tools/device_run.sh (the bundle's run.sh) unpacks the binaries.
bundle_dir=/tmp/muon-bundle
py=/tmp/muon-py
mkdir -p "$logs"
rm -f "$out/summary.txt" "$out/device_logs.tar.gz"
export MUON_REQUIRE_GPU=1
started=$SECONDS

names=()
statuses=()
seconds=()
notes=()
current_pid=""
current_name=""
current_t0=0
finished=0

record() {  # name status seconds note
  names+=("$1")
  statuses+=("$2")
  seconds+=("$3")
  notes+=("$4")
  printf '== %s: %s (%ss) %s\n' "$1" "$2" "$3" "$4"
}

time_left() {
  echo $((deadline_s - reserve_s - (SECONDS - started)))
}

# The last non-empty line of a log, shortened for the summary.
last_line() {
  local line
  line=$(grep -v '^[[:space:]]*$' "$1" 2>/dev/null | tail -n 1 | tr -s ' \t' ' ')
  echo "${line:0:90}"
}

# run NAME [--timeout S] [--min S] -- COMMAND...
# Runs COMMAND under `timeout` (S seconds, default $STEP_TIMEOUT_S, cut to
# the time left) with its output in $logs/NAME.log, unless less than its
# minimum (default $MIN_STEP_S) is left.
# Whether step NAME runs: every step, or those matching the ONLY regex.
selected() {
  [[ -z $only || $1 =~ $only ]]
}

run() {
  local name=$1 limit=$step_timeout min=$min_step_s
  shift
  while [[ $# -gt 0 && $1 != -- ]]; do
    case $1 in
      --timeout) limit=$2; shift 2 ;;
      --min) min=$2; shift 2 ;;
      *) echo "device_checks: run $name: unknown option $1" >&2; return 1 ;;
    esac
  done
  shift
  if ! selected "$name"; then
    record "$name" "skipped (ONLY)" 0 "not matched by ONLY=$only"
    return 0
  fi
  local left
  left=$(time_left)
  if ((left < min)); then
    record "$name" "skipped (deadline)" 0 "${left}s left, needs >= ${min}s"
    return 0
  fi
  local cut=""
  if ((limit > left)); then
    limit=$left
    cut=" (limit cut to ${left}s by the deadline)"
  fi
  local log=$logs/$name.log t0=$SECONDS rc
  echo "== $name (limit ${limit}s): $*"
  echo "+ $* (limit ${limit}s)" >"$log"
  # In the background, so that a TERM to this script reaches `finish` at
  # once (and `finish` stops the step).
  timeout -k 10 "$limit" "$@" >>"$log" 2>&1 &
  current_pid=$!
  current_name=$name
  current_t0=$t0
  wait "$current_pid"
  rc=$?
  current_pid=""
  local took=$((SECONDS - t0))
  record_exit "$name" "$rc" "$took" "after ${limit}s$cut" "$log"
}

# record_exit NAME RC SECONDS TIMEOUT_NOTE LOG: records a finished step
# from `timeout`'s exit status (124/137: timed out) and its log.
record_exit() {
  local name=$1 rc=$2 took=$3 timeout_note=$4 log=$5
  tail -n 3 "$log" | sed 's/^/   | /'
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    record "$name" TIMEOUT "$took" "$timeout_note"
  elif [[ $rc -ne 0 ]]; then
    record "$name" FAILED "$took" "exit $rc: $(last_line "$log")"
  else
    record "$name" ok "$took" "$(last_line "$log")"
  fi
}

# Writes summary.txt, packs logs/ into device_logs.tar.gz and removes it.
finish() {
  local why=${1:-}
  ((finished)) && return
  finished=1
  if [[ -n ${bg_pid:-} ]]; then
    kill -TERM "$bg_pid" 2>/dev/null
    wait "$bg_pid" 2>/dev/null
    record torch2_suite "FAILED (stopped)" "$((SECONDS - bg_t0))" \
      "$why while it ran in the background"
    bg_pid=""
  fi
  if [[ -n $current_pid ]]; then
    kill -TERM "$current_pid" 2>/dev/null
    wait "$current_pid" 2>/dev/null
    record "$current_name" "FAILED (stopped)" "$((SECONDS - current_t0))" \
      "$why while it ran; the step's log holds its output so far"
  fi
  local failed=0 skipped=0 i
  {
    echo "device_checks summary, $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    grep -m 1 '^gpu:' "$logs/versions.txt" 2>/dev/null
    grep -m 1 '^torch:' "$logs/versions.txt" 2>/dev/null
    echo "total $((SECONDS - started))s of a ${deadline_s}s deadline" \
      "(step limit ${step_timeout}s)"
    printf '%-32s %-19s %5s  %s\n' step status secs note
    for i in "${!names[@]}"; do
      printf '%-32s %-19s %5s  %s\n' "${names[$i]}" "${statuses[$i]}" \
        "${seconds[$i]}" "${notes[$i]}"
      case ${statuses[$i]} in
        ok) ;;
        skipped*) skipped=$((skipped + 1)) ;;
        *) failed=$((failed + 1)) ;;
      esac
    done
    echo "device_checks: ${#names[@]} steps, $failed failed or timed out," \
      "$skipped skipped"
  } >"$out/summary.txt"
  echo
  cat "$out/summary.txt"
  cp "$out/summary.txt" "$logs/summary.txt"
  if tar -C "$out" -czf "$out/device_logs.tar.gz" logs; then
    rm -rf "$logs"
  else
    echo "device_checks: could not pack $logs; left as it is"
  fi
  echo "device_checks: results in $out:" \
    "$(find "$out" -maxdepth 1 -type f -printf '%f ')"
  if ((failed)); then
    exit 1
  fi
  exit 0
}
trap 'finish "stopped by a signal"' TERM INT HUP

# ---- the machine -------------------------------------------------------------
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  if command -v nvidia-smi >/dev/null; then
    echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap \
      --format=csv,noheader 2>&1 | head -n 1)"
  else
    echo "gpu: nvidia-smi not found"
  fi
  echo "torch: $(timeout 60 python3 -c 'import torch, sys; print(torch.__version__,
    "CUDA", torch.version.cuda, "cuda available", torch.cuda.is_available(),
    "Python", sys.version.split()[0])' 2>&1 | tail -n 1)"
  echo "cpu: $(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)" \
    "($(nproc) cores), memory $(free -g 2>/dev/null | awk '/^Mem:/ {print $2 " GiB"}')"
  echo "kernel: $(uname -srm)"
  echo "glibc: $(ldd --version 2>&1 | head -n 1)"
  if [[ -x /usr/local/cuda/bin/nvcc ]]; then
    echo "nvcc: $(/usr/local/cuda/bin/nvcc --version | tail -n 1)"
  fi
  echo
  nvidia-smi
  echo
  python3 -m pip list 2>/dev/null | grep -Ei '^(torch|numpy|pytest|nvidia-)'
} >"$logs/versions.txt" 2>&1
head -n 4 "$logs/versions.txt"

# ---- the Python tree in /tmp ---------------------------------------------------
# The muonrt package, its tests and the examples, with the self-contained
# library (and muonrun, muonctl) unpacked where the package finds it.
py_ready=""
rm -rf "$py"
mkdir -p "$py/tests"
if [[ ! -f $here/muonrt-lib.tar.xz ]]; then
  py_ready="muonrt-lib.tar.xz is not in the bundle"
elif ! cp -r "$here/python" "$py/python" ||
  ! cp -r "$here/tests/python" "$py/tests/python"; then
  py_ready="copying python/ and tests/python to $py failed"
else
  [[ -d $here/examples ]] && cp -r "$here/examples" "$py/examples"
  # The archive holds lib/ and bin/ (graft_libs.py --bin), or the library
  # folder's files alone (bundles packed before muonrun and muonctl).
  listing=$(tar -tJf "$here/muonrt-lib.tar.xz" 2>&1)
  if grep -Eq '^(\./)?lib/libmuonrt\.so$' <<<"$listing"; then
    dest=$py/python/muonrt
  else
    dest=$py/python/muonrt/lib
  fi
  rm -rf "$py/python/muonrt/lib" "$py/python/muonrt/bin"
  mkdir -p "$dest"
  if ! tar -C "$dest" -xJf "$here/muonrt-lib.tar.xz"; then
    py_ready="unpacking muonrt-lib.tar.xz into $dest failed"
  elif [[ ! -f $py/python/muonrt/lib/libmuonrt.so ]]; then
    py_ready="muonrt-lib.tar.xz has no libmuonrt.so"
  fi
fi
muonrun=$py/python/muonrt/bin/muonrun
[[ -x $muonrun ]] || muonrun=""
echo "python tree: $py (${py_ready:-ready}; muonrun ${muonrun:-absent})"
# Python with the bundle's libraries and this machine's CUDA (run.sh) and
# the package from /tmp (its own libmuonrt.so, not MUONRT_LIBRARY's).
pyrun=("$here/run.sh" env -u MUONRT_LIBRARY PYTHONPATH="$py/python"
       ${muonrun:+MUONRUN="$muonrun"} python3)
# run_py NAME [run options] -- [VAR=VALUE...] ARGS...: a Python step that
# needs muonrt, with those variables set.
run_py() {
  local name=$1
  shift
  if [[ -n $py_ready ]]; then
    record "$name" FAILED 0 "not run: $py_ready"
    return 0
  fi
  local opts=() envs=()
  while [[ $# -gt 0 && $1 != -- ]]; do opts+=("$1"); shift; done
  shift
  while [[ $# -gt 0 && $1 =~ ^[A-Z_][A-Z0-9_]*= ]]; do envs+=("$1"); shift; done
  run "$name" "${opts[@]}" -- env "${envs[@]}" "${pyrun[@]}" "$@"
}

# ---- 1. GPU test binaries --------------------------------------------------------
for t in gpu_newton_schulz_test gpu_muon_update_test cuda_api_test \
  cuda_stream_test host_stream_test executor_streams_test gpu_executor_test \
  step_kernels_test gpu_muon_test process_group_backend_test \
  staged_ranks_test nccl_communicator_test; do
  # The two with whole optimizer steps (about 85 in gpu_muon_test; four
  # rank threads per layout in staged_ranks_test, never yet run on a GPU)
  # get longer.
  case $t in
    gpu_muon_test | staged_ranks_test) limit=120 ;;
    *) limit=60 ;;
  esac
  run "$t" --timeout "$limit" -- "$here/run.sh" "bin/$t"
done

# ---- 2. 4 rank processes, one GPU, host-staged; bitwise vs one device ------------
spec=$logs/fsdp_cuda.json
sed 's/"optimizer"/"execution": {"device": "cuda"}, "optimizer"/' \
  "$here/specs/fsdp.json" >"$spec"
run host_staged_4_ranks -- "$here/run.sh" bin/muonctl validate --spec "$spec" \
  --steps 3

# ---- 3. single-device GPU step vs torch.optim.Muon -------------------------------
run torch_muon_compare -- python3 "$here/torch_muon_compare.py" \
  --muonctl "$here/run.sh bin/muonctl" --steps 3

# ---- 4. muonrt on CUDA tensors, the self-contained library ----------------------
run_py muonrt_cuda_tensors --timeout 120 -- -m pytest -q -p no:cacheprovider -rs \
  "$py/tests/python/test_cuda_step.py" "$py/tests/python/test_self_contained.py"

# ---- 5. the main job on the GPU: Fashion-MNIST, muonrt.Muon vs torch.optim.Muon --
# One epoch (60 steps of 1000 images each) per optimizer; the
# torch.optim.Muon run stops at a step boundary after 30 s of training.
# The trainer fails when muonrt.Muon's loss is not finite or its accuracy
# falls below torch.optim.Muon's by more than its bound.
if [[ -d $here/data/fashion-mnist ]] || ! selected main_job_cuda; then
  run_py main_job_cuda --timeout 90 --min 45 -- \
    "$py/examples/fashion_mnist_torch/train.py" --device cuda --epochs 1 \
    --torch-muon-budget-s 30 --data-dir "$here/data/fashion-mnist"
else
  record main_job_cuda "skipped (no data)" 0 \
    "the bundle has no data/fashion-mnist (pack_device.sh --without-data)"
fi

# ---- 6. Llama-3-8B layer-set step: muonrt.Muon vs torch.optim.Muon ---------------
run_py gpu_step_bench --timeout 150 --min 45 -- "$here/gpu_step_bench.py" \
  "${step_bench_args[@]}" --json "$out/gpu_step_bench.json" \
  --trace "$out/step_trace.json"
# The same with the bf16 Gram iteration's Z formed in fp32 and a restart
# every 3 iterations (12% fewer FLOPs at 4096x14336; as near float64 as
# the standard iteration in the CPU model): the candidate default for the
# 1.5x target. Its figures are its log's last lines.
run_py gpu_step_bench_fp32_z_r3 --timeout 150 --min 45 -- \
  MUON_NS_GRAM_FP32_Z=1 MUON_NS_GRAM_RESTART_EVERY=3 \
  "$here/gpu_step_bench.py" "${step_bench_args[@]}"
# And on the async schedule (64 MiB buckets, prefetch 1): the gathers and
# applies on the high-priority comm stream, overlapping the Newton-Schulz
# GEMMs of the compute stream (47 ms of the 32-layer step on an H200 ran
# after them on the sequential schedule). Its trace shows the overlap.
run_py gpu_step_bench_async_fp32_z_r3 --timeout 150 --min 45 -- \
  MUON_NS_GRAM_FP32_Z=1 MUON_NS_GRAM_RESTART_EVERY=3 \
  "$here/gpu_step_bench.py" "${step_bench_args[@]}" --bucket-size-mib 64 \
  --prefetch 1 --trace "$out/step_trace_async.json"

# ---- 7. Newton-Schulz throughput, ours and PyTorch's ------------------------------
# The Llama-3-8B shapes and 8192^2; standard (also replayed as CUDA
# graphs) and Gram (restart every 2).
ns_sizes=1024x1024,1024x4096,4096x4096,4096x14336,8192x8192
run ns_gpu_bench --timeout 60 -- "$here/run.sh" bin/ns_gpu_bench \
  --sizes "$ns_sizes" --nostaged
run ns_gpu_bench_gram --timeout 60 -- "$here/run.sh" bin/ns_gpu_bench \
  --sizes "$ns_sizes" --nostaged --nographs --method gram
run torch_ns_bench --timeout 60 -- python3 "$here/torch_ns_bench.py" \
  --sizes "$ns_sizes"
# Coarser tiles for the symmetric products (2 x 2: 3 GEMMs of 4, 3 x 3:
# 6 of 9, each large enough to fill the GPU), from m = 1024, against the
# default 8 x 8 from 4096; ns_method "auto", as the step runs it.
run ns_gpu_bench_tiles --timeout 75 -- bash -c '
  for tiles in 2 3 4; do
    echo "MUON_NS_SYMMETRIC_TILES=$tiles MUON_NS_SYMMETRIC_MIN_EDGE=1024"
    MUON_NS_SYMMETRIC_TILES=$tiles MUON_NS_SYMMETRIC_MIN_EDGE=1024 \
      "$0"/run.sh bin/ns_gpu_bench --sizes 4096x4096,4096x14336,8192x8192 \
      --nostaged --nographs --method auto --repeats 5 || exit 1
  done' "$here"

# ---- 8. Newton-Schulz accuracy vs float64 ----------------------------------------
run_py ns_accuracy -- "$here/ns_accuracy.py" --device cuda \
  --json "$out/ns_accuracy.json"
# The bf16 Gram iteration with Z formed in fp32 and rounded once: its
# distance (ours_gram) and its time at the Gram shape.
# Then both again restarting every 3 iterations instead of 2.
run_py ns_accuracy_gram_fp32_z -- MUON_NS_GRAM_FP32_Z=1 \
  "$here/ns_accuracy.py" --device cuda
run_py ns_accuracy_gram_fp32_z_r3 -- MUON_NS_GRAM_FP32_Z=1 \
  MUON_NS_GRAM_RESTART_EVERY=3 "$here/ns_accuracy.py" --device cuda
run ns_gpu_bench_gram_fp32_z --timeout 60 -- bash -c '
  for every in 2 3; do
    echo "MUON_NS_GRAM_FP32_Z=1, restart every $every"
    MUON_NS_GRAM_FP32_Z=1 "$0"/run.sh bin/ns_gpu_bench \
      --sizes 4096x14336,1024x4096 --nostaged --nographs --method gram \
      --gram_restart_every "$every" || exit 1
  done' "$here"

# ---- 9. the PyTorch 2.x suite, in the background ---------------------------------
# FSDP2 / HSDP / TP / EP layouts, DCP, the library beside torch's Gloo, the
# main job, real torchrun (this machine's PyTorch has torchrun's libuv).
# Its ranks are CPU processes on gloo, so it runs beside compute-sanitizer
# (step 10), with the time left; -v: a suite stopped by the deadline still
# shows which tests ran.
bg_pid=""
bg_t0=0
bg_limit=0
bg_log=$logs/torch2_suite.log
if ! selected torch2_suite; then
  record torch2_suite "skipped (ONLY)" 0 "not matched by ONLY=$only"
elif [[ -n $py_ready ]]; then
  record torch2_suite FAILED 0 "not run: $py_ready"
elif (($(time_left) < 60)); then
  record torch2_suite "skipped (deadline)" 0 "$(time_left)s left, needs >= 60s"
else
  bg_limit=$(time_left)
  echo "== torch2_suite (background, limit ${bg_limit}s)"
  echo "+ pytest tests/python/torch2 (limit ${bg_limit}s)" >"$bg_log"
  timeout -k 10 "$bg_limit" "${pyrun[@]}" -m pytest -v -p no:cacheprovider -rs \
    --durations=15 "$py/tests/python/torch2" >>"$bg_log" 2>&1 &
  bg_pid=$!
  bg_t0=$SECONDS
fi
# Waits for the background suite and records it (as run does).
finish_background() {
  [[ -z $bg_pid ]] && return
  local rc
  wait "$bg_pid"
  rc=$?
  bg_pid=""
  local took=$((SECONDS - bg_t0))
  record_exit torch2_suite "$rc" "$took" "after ${bg_limit}s" "$bg_log"
}

# ---- 10. compute-sanitizer ----------------------------------------------------------
sanitizer=$(command -v compute-sanitizer 2>/dev/null)
if [[ -z $sanitizer ]]; then
  for s in /usr/local/cuda/bin/compute-sanitizer \
    /usr/local/cuda/compute-sanitizer/compute-sanitizer \
    /usr/local/cuda-*/bin/compute-sanitizer; do
    [[ -x $s ]] && sanitizer=$s && break
  done
fi
if [[ -z $sanitizer ]] && ! selected memcheck_gpu_muon_test; then
  : # not asked for (ONLY)
elif [[ -z $sanitizer ]]; then
  for n in memcheck_gpu_muon_test racecheck_cuda_stream_test \
    synccheck_cuda_stream_test; do
    record "$n" "skipped (no tool)" 0 \
      "compute-sanitizer is not on PATH nor under /usr/local/cuda*"
  done
else
  # The bundled binaries by absolute path (run.sh maps only its first
  # argument); --error-exitcode makes a reported hazard a failure.
  # The GPU tests' stream backlog small (instrumented kernels are slow).
  MUON_TEST_BACKLOG_MIB=4 \
    run memcheck_gpu_muon_test --timeout 150 --min 30 -- "$here/run.sh" \
    "$sanitizer" --tool memcheck --error-exitcode 3 \
    "$bundle_dir/bin/gpu_muon_test" --gtest_filter="$memcheck_filter"
  run memcheck_gpu_newton_schulz_test --timeout 60 --min 30 -- "$here/run.sh" \
    "$sanitizer" --tool memcheck --error-exitcode 3 \
    "$bundle_dir/bin/gpu_newton_schulz_test" --gtest_filter='*Gram*'
  run racecheck_cuda_stream_test --timeout 60 -- "$here/run.sh" \
    "$sanitizer" --tool racecheck --error-exitcode 3 \
    "$bundle_dir/bin/cuda_stream_test"
  run synccheck_cuda_stream_test --timeout 60 -- "$here/run.sh" \
    "$sanitizer" --tool synccheck --error-exitcode 3 \
    "$bundle_dir/bin/cuda_stream_test"
fi

finish_background
finish ""

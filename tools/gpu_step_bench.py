#!/usr/bin/env python3
"""One optimizer step over the Llama-3-8B layer set on one GPU: muonrt.Muon
(libmuonrt through ctypes, CUDA tensors, one process, world size 1) next to
torch.optim.Muon, in one process.

Per layer the seven weight matrices of Llama-3-8B: q_proj and o_proj
4096x4096, k_proj and v_proj 1024x4096, gate_proj and up_proj 14336x4096,
down_proj 4096x14336 (218.1M parameters a layer). Gradients are random
(seeded), given once; there is no model forward or backward. Both
optimizers get the same hyperparameters (printed), one after the other on
the same parameters, the first one freed (close, del, gc, empty_cache)
before the second is created.

For each optimizer:
  - first step: wall time of creation + first step (synchronized), which
    includes each side's one-time work (muonrt plans, allocates its device
    buffers and loads its kernels; torch allocates its momentum buffers);
  - steady steps: median and best of --iters steps, each between
    torch.cuda.synchronize() calls;
  - device memory: the drop of torch.cuda.mem_get_info()'s free bytes from
    before creation to after the first step (torch's cache emptied before
    each reading). This is the comparable figure: muonrt allocates through
    its own CUDA calls, which torch's allocator does not see. For torch's
    optimizer torch.cuda.memory_allocated()'s growth (its momentum
    buffers) and the peak allocated during a step are printed too; for
    muonrt the library's own buffer_bytes counter (last_step_stats).
A bf16 matmul runs before any measurement so that torch's cuBLAS handle and
workspace (the trainer's anyway) are not counted against torch's optimizer;
muonrt's own cuBLAS handle and kernels are counted against muonrt.

Usage:
  python3 tools/gpu_step_bench.py [--layers 8] [--dtype bf16|fp32]
      [--iters 5] [--order torch-first|ours-first] [--json PATH]
      [--ns-method standard|gram|auto] [--bucket-size-mib M] [--prefetch N]
      [--no-check-finite]
Exit status 2 (with the reason) when there is no CUDA GPU, when muonrt
cannot be imported or loaded, or when it refuses CUDA tensors; 1 when a
measured optimizer fails otherwise (e.g. out of memory); 0 otherwise.
"""
import argparse
import gc
import inspect
import json
import platform
import statistics
import subprocess
import sys
import time

GIB = float(1 << 30)
# Where the problem lives (a host smoke test of this script's logic may
# point it elsewhere; the measurements themselves are CUDA's).
DEVICE = "cuda"

# (name, rows, cols) of one Llama-3-8B decoder layer's matrices.
LLAMA3_8B_LAYER = (
    ("self_attn.q_proj", 4096, 4096),
    ("self_attn.k_proj", 1024, 4096),
    ("self_attn.v_proj", 1024, 4096),
    ("self_attn.o_proj", 4096, 4096),
    ("mlp.gate_proj", 14336, 4096),
    ("mlp.up_proj", 14336, 4096),
    ("mlp.down_proj", 4096, 14336),
)


class Refused(Exception):
    """muonrt cannot run here (not importable, no library, CUDA tensors
    refused): the benchmark exits 2 with this message."""


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8,
                    help="decoder layers (default 8: about 1.75B "
                         "parameters; 32 is the whole model)")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16",
                    help="parameter and gradient dtype (default bf16)")
    ap.add_argument("--iters", type=int, default=5,
                    help="steady steps timed after the first (default 5)")
    ap.add_argument("--order", choices=("torch-first", "ours-first"),
                    default="torch-first")
    ap.add_argument("--only", choices=("both", "torch", "ours"),
                    default="both")
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.95)
    ap.add_argument("--no-nesterov", dest="nesterov", action="store_false")
    ap.add_argument("--ns-steps", type=int, default=5)
    ap.add_argument("--adjust-lr-fn", default="original",
                    choices=("original", "match_rms_adamw"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trace", metavar="PATH",
                    help="write muonrt's last step as a Chrome trace "
                         "(chrome://tracing, Perfetto): one slice per "
                         "operation and bucket, at its CUDA-event device "
                         "times, one row per stream")
    ap.add_argument("--bucket-size-mib", type=float, default=0.0,
                    help="muonrt's bucket_size_bytes in MiB (0: one matrix "
                         "per bucket): the same-shape matrices of a bucket "
                         "run as one strided-batched Newton-Schulz")
    ap.add_argument("--prefetch", type=int, default=-1,
                    help="muonrt's async schedule with this prefetch_count "
                         "(-1: the sequential schedule)")
    ap.add_argument("--ns-method", choices=("standard", "gram", "auto"),
                    default="standard",
                    help="muonrt's Newton-Schulz method (torch.optim.Muon "
                         "has only the standard one): auto runs Gram "
                         "Newton-Schulz on k, v, gate, up and down")
    ap.add_argument("--no-check-finite", dest="check_finite",
                    action="store_false",
                    help="muonrt's check_finite=False: no scan of the "
                         "gradients for NaN/Inf before the step (and no "
                         "host wait for it), as torch.optim.Muon; the "
                         "default keeps muonrt's default (on)")
    ap.add_argument("--json", metavar="PATH",
                    help="also write the figures as JSON to PATH")
    args = ap.parse_args(argv)
    if args.layers < 1 or args.iters < 1:
        ap.error("--layers and --iters must be >= 1")
    return args


def nvidia_smi_field(field):
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            timeout=20).stdout
        return out.strip().splitlines()[0].strip() if out.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(torch):
    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": props.name,
        "gpu_memory_gib": round(props.total_memory / GIB, 1),
        "compute_capability": f"{props.major}.{props.minor}",
        "driver": nvidia_smi_field("driver_version"),
        "cuda_torch": torch.version.cuda,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def sync_free_bytes(torch):
    """Free device bytes after synchronizing, collecting Python garbage and
    emptying torch's cache; also torch.cuda.memory_allocated()."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    return free, torch.cuda.memory_allocated()


def make_problem(torch, args):
    """The parameters (named, on cuda:0) with their random gradients set."""
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    gen = torch.Generator(device=DEVICE).manual_seed(args.seed)
    params = []
    for layer in range(args.layers):
        for name, rows, cols in LLAMA3_8B_LAYER:
            p = torch.empty(rows, cols, device=DEVICE, dtype=dtype)
            p.normal_(0.0, 0.02, generator=gen)
            p = torch.nn.Parameter(p)
            g = torch.empty(rows, cols, device=DEVICE, dtype=dtype)
            g.normal_(0.0, 1.0, generator=gen)
            p.grad = g
            params.append((f"layers.{layer}.{name}", p))
    torch.cuda.synchronize()
    return params


def reset_params(torch, params, seed):
    """Fresh parameter values (in place: same storage) before an
    optimizer's run, so that both start from the same point."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed + 1)
    with torch.no_grad():
        for _, p in params:
            p.normal_(0.0, 0.02, generator=gen)
    torch.cuda.synchronize()


def hyperparameters(args):
    return {
        "lr": args.lr,
        "weight_decay": args.weight_decay,
        "momentum": args.momentum,
        "nesterov": args.nesterov,
        "ns_coefficients": (3.4445, -4.7750, 2.0315),
        "eps": 1e-7,
        "ns_steps": args.ns_steps,
        "adjust_lr_fn": args.adjust_lr_fn,
    }


def torch_factory(torch, hp):
    """(make(params) for torch.optim.Muon, the keywords it was given, the
    ones its signature lacks), or None without torch.optim.Muon."""
    cls = getattr(torch.optim, "Muon", None)
    if cls is None:
        return None
    accepted = inspect.signature(cls.__init__).parameters
    kw = {k: v for k, v in hp.items() if k in accepted}
    dropped = sorted(set(hp) - set(kw))

    def make(params):
        return cls([p for _, p in params], **kw)
    return make, kw, dropped


def runtime_options(args):
    """muonrt.Muon's runtime keywords from the flags."""
    runtime = {"ns_method": args.ns_method,
               "bucket_size_bytes": int(args.bucket_size_mib * (1 << 20))}
    if args.prefetch >= 0:
        runtime.update(async_gpu_parallelism=True,
                       prefetch_count=args.prefetch)
    if not args.check_finite:
        runtime["check_finite"] = False
    return runtime


def ours_factory(hp, runtime):
    try:
        import muonrt
    except ImportError as e:
        raise Refused(f"cannot import muonrt ({e}); put the bundle's python/ "
                      f"on PYTHONPATH") from None
    try:
        path = muonrt.library_path()
    except (OSError, RuntimeError) as e:
        raise Refused(f"libmuonrt.so does not load: {e}") from None

    def make(params):
        return muonrt.Muon(list(params), **runtime, **hp)
    return make, path


def measure(torch, label, make, params, iters, is_torch):
    """Creation + first step, then `iters` steady steps, and the device
    memory the optimizer holds (see the module docstring)."""
    free0, alloc0 = sync_free_bytes(torch)
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    try:
        opt = make(params)
    except NotImplementedError as e:  # UNIMPLEMENTED: CUDA views refused
        if is_torch:
            raise
        raise Refused(f"{label} refuses CUDA tensors: {e}") from None
    except ValueError as e:  # a build or package without CUDA parameters
        if not is_torch and "cuda" in str(e).lower():
            raise Refused(f"{label} refuses CUDA tensors: {e}") from None
        raise
    created_s = time.perf_counter() - t0
    opt.step()
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    free1, alloc1 = sync_free_bytes(torch)
    times = []
    for _ in range(iters):
        torch.cuda.synchronize()
        t = time.perf_counter()
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    peak = torch.cuda.max_memory_allocated()
    r = {
        "label": label,
        "create_s": created_s,
        "first_step_s": first_s,
        "step_ms_median": statistics.median(times) * 1e3,
        "step_ms_best": min(times) * 1e3,
        "step_ms_all": [t * 1e3 for t in times],
        "device_bytes": free0 - free1,
        "allocated_bytes": alloc1 - alloc0,
        "peak_allocated_over_start_bytes": peak - alloc0,
    }
    if not is_torch:
        try:
            stats = opt.last_step_stats()
            r["library_buffer_bytes"] = int(stats.get("buffer_bytes", 0))
            r["library_step_time_s"] = float(stats.get("step_time_s", 0.0))
            report = opt.last_step_report()
            r["last_step_ops"] = report.get("ops", [])
            # The library's own counts (Muon::memory(); proto JSON spells
            # int64 as strings).
            for key in ("momentum_bytes", "state_bytes", "snapshot_bytes",
                        "scratch_bytes", "peak_bytes"):
                r["library_" + key] = int(report.get(key, 0))
        except Exception as e:  # noqa: BLE001 (informational only)
            r["library_stats_error"] = str(e)
        opt.close()
    del opt
    free2, _ = sync_free_bytes(torch)
    r["released_bytes"] = free2 - free1
    return r


def run_one(torch, label, make, params, args, is_torch):
    """measure() with out-of-memory and other errors turned into a result
    with an "error"; Refused for muonrt refusing CUDA tensors."""
    print(f"[{label}] creating and stepping ...", flush=True)
    try:
        r = measure(torch, label, make, params, args.iters, is_torch)
    except Refused:
        raise
    except Exception as e:  # noqa: BLE001 (reported, the other side runs)
        msg = f"{type(e).__name__}: {e}"
        print(f"[{label}] FAILED: {msg}", flush=True)
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return {"label": label, "error": msg}
    print(f"[{label}] first step {r['first_step_s']:.2f} s (creation "
          f"{r['create_s']:.2f} s), steady median {r['step_ms_median']:.1f} "
          f"ms, best {r['step_ms_best']:.1f} ms, device "
          f"{r['device_bytes'] / GIB:.2f} GiB", flush=True)
    return r


def print_table(results, n_params, env):
    print()
    print(f"GPU {env['gpu']} ({env['gpu_memory_gib']} GiB, sm "
          f"{env['compute_capability']}) | driver {env['driver']} | CUDA "
          f"(torch) {env['cuda_torch']} | torch {env['torch']} | Python "
          f"{env['python']}")
    hdr = (f"{'optimizer':<18} {'first s':>8} {'median ms':>10} "
           f"{'best ms':>9} {'ratio':>7} {'dev GiB':>8} {'B/param':>8} "
           f"{'alloc GiB':>10} {'peak GiB':>9}")
    print(hdr)
    print("-" * len(hdr))
    torch_r = results.get("torch")
    ours_r = results.get("ours")
    for key in ("torch", "ours"):
        r = results.get(key)
        if r is None:
            continue
        if "error" in r:
            print(f"{r['label']:<18} FAILED: {r['error']}")
            continue
        ratio = ""
        if (torch_r and ours_r and "error" not in torch_r
                and "error" not in ours_r):
            ratio = "1.00" if key == "torch" else \
                f"{torch_r['step_ms_median'] / ours_r['step_ms_median']:.2f}"
        print(f"{r['label']:<18} {r['first_step_s']:>8.2f} "
              f"{r['step_ms_median']:>10.1f} {r['step_ms_best']:>9.1f} "
              f"{ratio:>7} {r['device_bytes'] / GIB:>8.2f} "
              f"{r['device_bytes'] / n_params:>8.2f} "
              f"{r['allocated_bytes'] / GIB:>10.2f} "
              f"{r['peak_allocated_over_start_bytes'] / GIB:>9.2f}")
    print("ratio = torch median ms / ours median ms (> 1: ours faster); dev "
          "GiB = drop of cudaMemGetInfo free bytes from before creation to "
          "after the first step; alloc/peak GiB = torch allocator only "
          "(muonrt's own allocations are invisible to it)")
    if ours_r and "library_buffer_bytes" in ours_r:
        print(f"muonrt buffer_bytes (last_step_stats): "
              f"{ours_r['library_buffer_bytes'] / GIB:.2f} GiB")
    if ours_r and "library_peak_bytes" in ours_r:
        print("muonrt memory() counts: " + ", ".join(
            f"{k} {ours_r['library_' + k] / GIB:.2f} GiB"
            for k in ("momentum_bytes", "state_bytes", "snapshot_bytes",
                      "scratch_bytes", "peak_bytes")))


def print_setup(args, hp, n_params, theirs, ours):
    print(f"Llama-3-8B layer set: {args.layers} layers x "
          f"{len(LLAMA3_8B_LAYER)} matrices, {n_params / 1e6:.1f}M "
          f"parameters, {args.dtype} parameters and gradients, "
          f"{args.iters} steady steps each, order {args.order}, muonrt "
          f"{runtime_options(args)}", flush=True)
    print(f"hyperparameters: {hp}")
    if theirs is not None:
        _, kw, dropped = theirs
        print(f"  torch.optim.Muon given: {sorted(kw)}"
              + (f"; not in its signature: {dropped}" if dropped else "")
              + "; its own defaults for the rest (use_addmm=False where "
                "present)")
    if ours is not None:
        print(f"  muonrt.Muon given all of them; library {ours[1]}")
    print("  both keep momentum buffers in the parameters' dtype and run "
          "Newton-Schulz in bf16 with fp32 accumulation on CUDA", flush=True)


def run_all(torch, args, params, theirs, ours):
    """({"torch": result, "ours": result}, muonrt's refusal or None), in
    --order, each from the same parameter values."""
    order = ["torch", "ours"] if args.order == "torch-first" else \
        ["ours", "torch"]
    results = {}
    refused = None
    for key in order:
        if key == "torch" and theirs is not None:
            reset_params(torch, params, args.seed)
            results["torch"] = run_one(torch, "torch.optim.Muon", theirs[0],
                                       params, args, is_torch=True)
        elif key == "ours" and ours is not None:
            reset_params(torch, params, args.seed)
            try:
                results["ours"] = run_one(torch, "muonrt.Muon", ours[0],
                                          params, args, is_torch=False)
            except Refused as e:
                refused = str(e)
                results["ours"] = {"label": "muonrt.Muon",
                                   "error": f"refused: {e}"}
    return results, refused


def write_trace(path, ops):
    """Chrome trace of one step's operations (Trace Event Format: complete
    events "X", microseconds from the first operation's start)."""
    if not ops:
        print("gpu_step_bench: no muonrt operations to trace",
              file=sys.stderr)
        return
    t0 = min(op["start_s"] for op in ops)
    events = []
    for op in ops:
        kind = op.get("op", "OP_KIND_UNSPECIFIED").replace("OP_KIND_", "")
        stream = op.get("stream", "STREAM_KIND_MAIN").replace(
            "STREAM_KIND_", "").lower()
        events.append({
            "name": f"{kind.lower()}[{op.get('bucket', 0)}]",
            "cat": kind.lower(), "ph": "X", "pid": 0, "tid": stream,
            "ts": (op["start_s"] - t0) * 1e6,
            "dur": (op["end_s"] - op["start_s"]) * 1e6,
            "args": {k: op[k] for k in ("bytes", "flops") if k in op}})
    with open(path, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    busy = {}
    for e in events:
        busy[e["cat"]] = busy.get(e["cat"], 0.0) + e["dur"] / 1e3
    span = max(op["end_s"] for op in ops) - t0
    print(f"trace: {len(events)} operations over {span * 1e3:.1f} ms; "
          + ", ".join(f"{k} {v:.1f} ms" for k, v in sorted(busy.items()))
          + f"; wrote {path}")


def write_json(path, args, hp, n_params, env, results):
    for r in results.values():
        if "device_bytes" in r:
            r["device_bytes_per_param"] = r["device_bytes"] / n_params
    doc = {
        "environment": env,
        "layers": args.layers,
        "muonrt_runtime": runtime_options(args),
        "dtype": args.dtype,
        "parameters": n_params,
        "iters": args.iters,
        "order": args.order,
        "hyperparameters": dict(hp, ns_coefficients=list(
            hp["ns_coefficients"])),
        "results": results,
    }
    if "torch" in results and "ours" in results and not any(
            "error" in r for r in results.values()):
        doc["torch_over_ours_median"] = (
            results["torch"]["step_ms_median"] /
            results["ours"]["step_ms_median"])
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    print(f"wrote {path}")


def main(argv=None):
    args = parse_args(argv)
    try:
        import torch
    except ImportError as e:
        print(f"gpu_step_bench: PyTorch is not installed: {e}",
              file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gpu_step_bench: no CUDA GPU visible to PyTorch "
              "(torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    env = environment(torch)
    hp = hyperparameters(args)
    ours = None
    if args.only in ("both", "ours"):
        try:
            ours = ours_factory(hp, runtime_options(args))
        except Refused as e:
            print(f"gpu_step_bench: {e}", file=sys.stderr)
            return 2
    theirs = None
    if args.only in ("both", "torch"):
        theirs = torch_factory(torch, hp)
        if theirs is None:
            print(f"gpu_step_bench: torch {torch.__version__} has no "
                  f"torch.optim.Muon (PyTorch >= 2.9): timing muonrt only",
                  flush=True)
    n_params = args.layers * sum(r * c for _, r, c in LLAMA3_8B_LAYER)
    print_setup(args, hp, n_params, theirs, ours)

    t = time.perf_counter()
    params = make_problem(torch, args)
    # torch's cuBLAS handle and workspace, before any measurement.
    a = torch.ones(256, 256, device=DEVICE, dtype=torch.bfloat16)
    (a @ a).sum().item()
    del a
    print(f"problem made in {time.perf_counter() - t:.1f} s; free "
          f"{torch.cuda.mem_get_info()[0] / GIB:.1f} GiB", flush=True)

    results, refused = run_all(torch, args, params, theirs, ours)
    print_table(results, n_params, env)
    if args.trace:
        write_trace(args.trace,
                    results.get("ours", {}).get("last_step_ops", []))
    if args.json:
        write_json(args.json, args, hp, n_params, env, results)
    if refused:
        print(f"gpu_step_bench: {refused}", file=sys.stderr)
        return 2
    return 1 if any("error" in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())

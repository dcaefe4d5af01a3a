#!/usr/bin/env python3
"""Benchmark: muonrt.Muon's step started during backward (overlap_backward)
against the same step after backward, on a transformer-like stack of
bias-free linear layers, one rank per process under muonrun.

    muonrun --nproc-per-node 4 --master-addr 127.0.0.1 --master-port P \\
        /usr/bin/python3 tools/overlap_bench.py [--layers 6 --width 256]

Every rank holds the whole model and the same data (the DDP layout, placements
Replicate(): replicas agree, each matrix orthogonalized once in the world)
and runs one optimizer (overlap_backward=True, the async schedule: comm and
compute threads, one bucket gathered ahead), alternating per iteration
(a) backward then step (the hooks held back with `accumulating`), timing
each, and (b) the step started during backward: the gradient hooks mark
parameters ready and buckets (last layer first) are exchanged and
orthogonalized while backward goes on. (Results are bitwise the same
either way: tests/python/test_overlap.py.) Rank 0 prints the
medians: backward alone, step alone, their sum, and backward + step with
overlap, with the core type and library versions; with --trace FILE it
also writes `muonctl trace` of the last steps next to the overlap run's
backward start and end times.
"""
import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import muonrt  # noqa: E402


def model_of(layers, width, seed):
    """Per block: a fused qkv projection, an output projection, an MLP up
    and down (4x), tanh between; parameters in forward order."""
    torch.manual_seed(seed)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, 3 * width, bias=False), torch.nn.Tanh(),
                 torch.nn.Linear(3 * width, width, bias=False), torch.nn.Tanh(),
                 torch.nn.Linear(width, 4 * width, bias=False), torch.nn.Tanh(),
                 torch.nn.Linear(4 * width, width, bias=False), torch.nn.Tanh()]
    return torch.nn.Sequential(*mods)


def optimizer(model, pg, overlap, bucket_bytes):
    """muonrt.Muon over `model` on the DDP layout of `pg`."""
    names = [n for n, _ in model.named_parameters()]
    return muonrt.Muon(list(model.named_parameters()), lr=0.01,
                       process_group=pg,
                       mesh=muonrt.Mesh(["dp"], [pg.world_size]),
                       placements={n: ["Replicate()"] for n in names},
                       overlap_backward=overlap,
                       bucket_size_bytes=bucket_bytes,
                       async_gpu_parallelism=True, prefetch_count=1)


def iteration(model, opt, x, pg, overlap):
    """One backward + step; returns (backward s, step s, total s, backward
    start and end in seconds since the epoch). Without `overlap` the
    gradient hooks do not mark (`accumulating`): step() marks every
    parameter after backward, the plain backward-then-step."""
    opt.zero_grad(set_to_none=True)
    loss = model(x).square().mean()
    opt.accumulating = not overlap
    pg.barrier()  # every rank starts backward together
    t0 = time.perf_counter()
    w0 = time.time()
    loss.backward()
    t1 = time.perf_counter()
    w1 = time.time()
    opt.accumulating = False
    opt.step()
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, t2 - t0, w0, w1


def report_trace(path, last):
    """Prints, for rank 0's last step in the trace (the overlap run's last
    iteration), when its gathers and Newton-Schulz ran relative to that
    iteration's backward (ms after backward start; backward's end)."""
    import json
    with open(path) as f:
        trace = json.load(f)
    t0 = trace.get("otherData", {}).get("t0_unix_s")
    ops = [e for e in trace["traceEvents"]
           if e.get("ph") == "X" and e.get("pid") == 0 and
           e.get("cat") == "muon"]
    if t0 is None or not ops:
        print("overlap_bench: the trace has no ops or no time origin")
        return
    last_step = max(e["args"]["step"] for e in ops)
    begin = last[3]
    rows = []
    for e in ops:
        if e["args"]["step"] != last_step:
            continue
        start = t0 + e["ts"] / 1e6
        rows.append((start - begin, e["name"], e["args"]["bucket"]))
    # Both optimizers report to the job's coordinator: keep the operations
    # of this iteration (from backward's start to the step's end).
    rows = sorted(r for r in rows if 0 <= r[0] <= last[2])
    inside = [r for r in rows if r[0] < last[4] - begin]
    print(f"overlap_bench: rank 0 step {last_step}: backward ends at "
          f"+{1e3 * (last[4] - begin):.1f} ms; {len(inside)} of {len(rows)} "
          f"operations started inside it: " +
          ", ".join(f"{n}[{b}] +{1e3 * t:.1f}" for t, n, b in inside[:12]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--iters", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--bucket-bytes", type=int, default=1 << 20)
    ap.add_argument("--trace", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    pg = muonrt.init_process_group(timeout=300)
    x = torch.randn(args.tokens, args.width,
                    generator=torch.Generator().manual_seed(7))
    # One optimizer (one job, one plan) for both modes, alternating.
    model = model_of(args.layers, args.width, 1)
    opt = optimizer(model, pg, True, args.bucket_bytes)
    rows = {"plain": [], "overlap": []}
    for it in range(args.warmup + args.iters):
        a = iteration(model, opt, x, pg, False)
        b = iteration(model, opt, x, pg, True)
        if it >= args.warmup:
            rows["plain"].append(a)
            rows["overlap"].append(b)
    plain_model = model
    med = {k: [statistics.median(r[i] for r in v) for i in range(3)]
           for k, v in rows.items()}
    if pg.rank == 0:
        params = sum(p.numel() for p in plain_model.parameters())
        print(f"overlap_bench: {pg.world_size} ranks, {args.layers} blocks of "
              f"width {args.width} ({params / 1e6:.2f} M parameters, "
              f"{len(list(plain_model.parameters()))} matrices), "
              f"{args.tokens} tokens, buckets of {args.bucket_bytes} B, "
              f"{args.iters} interleaved iterations (median)")
        print(f"overlap_bench: cpu {platform.processor() or platform.machine()}"
              f" x {os.cpu_count()}, torch {torch.__version__}, muonrt ABI "
              f"{muonrt.abi_version()}")
        pb, ps, pt = (1e3 * v for v in med["plain"])
        ob, _, ot = (1e3 * v for v in med["overlap"])
        print(f"overlap_bench: backward alone {pb:.1f} ms, step alone "
              f"{ps:.1f} ms, sum {pb + ps:.1f} ms (measured {pt:.1f} ms); "
              f"with overlap backward {ob:.1f} ms, backward start to step "
              f"end {ot:.1f} ms = {ot / pt:.3f} x the sum")
        last = rows["overlap"][-1]
        print(f"overlap_bench: last overlap iteration: backward "
              f"{last[3]:.6f} -> {last[4]:.6f} (epoch s), step end "
              f"+{1e3 * last[2]:.1f} ms after backward start")
    pg.barrier()
    if args.trace and pg.rank == 0:
        muonctl = os.path.join(HERE, "..", "python", "muonrt", "bin",
                               "muonctl")
        if not os.path.exists(muonctl):
            muonctl = os.path.join(HERE, "..", "bazel-bin", "tools", "muonctl")
        r = subprocess.run([muonctl, "trace", "--coordinator",
                            pg.coordinator_address, "--out", args.trace,
                            "--last_steps", "2"],
                           capture_output=True, text=True, timeout=60)
        print(f"overlap_bench: muonctl trace -> {args.trace} (exit "
              f"{r.returncode}) {r.stderr.strip()[:200]}")
        if r.returncode == 0:
            report_trace(args.trace, rows["overlap"][-1])
    pg.barrier()
    muonrt.destroy_process_group()


if __name__ == "__main__":
    main()

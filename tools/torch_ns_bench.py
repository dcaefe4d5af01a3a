#!/usr/bin/env python3
"""PyTorch's own Newton-Schulz on a CUDA GPU, next to torch.matmul's bf16 rate.

The peer of tools/ns_gpu_bench (DESIGN.md section 10): times
torch.optim._muon._zeropower_via_newtonschulz (torch/optim/_muon.py, PyTorch
>= 2.9; the function torch.optim.Muon calls) on the same shapes, in its own
arithmetic (it casts the input to bfloat16 and runs bf16 matmuls with fp32
accumulation), with CUDA events after warm-ups, and prints a table in the
same units: best / median ms, NS TFLOP/s from k*(4*m*m*n + 2*m^3), the
Gram-shape (m x n x m) and square (--gemm_size^3) bf16 torch.matmul rates
measured in the same run, and NS / peak.

Where the installed function takes `use_addmm` (newer PyTorch), both variants
are timed: addmm=True folds b*A and a*X into the GEMMs as our cuBLAS path
does; addmm=False is torch.optim.Muon's default.

Usage: python3 tools/torch_ns_bench.py [--sizes 1024x1024,4096x4096,...]
         [--repeats 10] [--steps 5] [--gemm_size 8192]
Exit status 2 when PyTorch, its Muon or a GPU is missing.
"""

import argparse
import inspect
import statistics
import sys


def parse_sizes(text):
    shapes = []
    for item in text.split(","):
        if not item:
            continue
        rows, _, cols = item.partition("x")
        shapes.append((int(rows), int(cols)))
    return shapes


def time_cuda(torch, fn, repeats, warmup=2):
    """Best and median milliseconds of fn() on the current stream."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return min(times), statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024x1024,4096x4096,4096x11008,8192x8192")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--gemm_size", type=int, default=8192)
    args = parser.parse_args()

    try:
        import torch
    except ImportError as e:
        print(f"torch_ns_bench: PyTorch is not installed: {e}", file=sys.stderr)
        return 2
    try:
        from torch.optim._muon import _zeropower_via_newtonschulz
        from torch.optim._muon import DEFAULT_A, DEFAULT_B, DEFAULT_C, EPS
    except ImportError as e:
        print(
            f"torch_ns_bench: torch {torch.__version__} has no "
            f"torch.optim._muon._zeropower_via_newtonschulz (PyTorch >= 2.9 "
            f"needed): {e}",
            file=sys.stderr,
        )
        return 2
    if not torch.cuda.is_available():
        print("torch_ns_bench: no CUDA GPU visible to PyTorch", file=sys.stderr)
        return 2

    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    coefficients = (DEFAULT_A, DEFAULT_B, DEFAULT_C)
    params = inspect.signature(_zeropower_via_newtonschulz).parameters
    variants = [("addmm", {"use_addmm": True}), ("plain", {"use_addmm": False})] \
        if "use_addmm" in params else [("default", {})]
    print(
        f"GPU: {props.name} (sm_{props.major}{props.minor}, "
        f"{props.multi_processor_count} SMs, {props.total_memory >> 20} MiB) | "
        f"torch {torch.__version__} | CUDA {torch.version.cuda}"
    )
    print(
        f"NS: torch.optim._muon._zeropower_via_newtonschulz, bf16, quintic "
        f"{coefficients}, {args.steps} steps, 2 warm-ups + {args.repeats} timed "
        f"runs (CUDA events); variants: {', '.join(v for v, _ in variants)}"
    )

    def matmul_rate(m, n, k):
        gen = torch.Generator(device=device).manual_seed(11)
        a = (torch.rand(m, k, device=device, generator=gen) * 2 - 1).bfloat16()
        b = (torch.rand(k, n, device=device, generator=gen) * 2 - 1).bfloat16()
        best, _ = time_cuda(torch, lambda: torch.matmul(a, b), args.repeats)
        return 2.0 * m * n * k / (best * 1e-3) / 1e12, best

    g = args.gemm_size
    peak, peak_ms = matmul_rate(g, g, g)
    print(f"dense GEMM yardstick: torch.matmul bf16 {g}x{g}x{g}: best "
          f"{peak_ms:.3f} ms, {peak:.1f} TFLOP/s\n")
    print(f"{'size':<11} {'m':>5} {'n':>5} {'variant':>8} {'NS best':>9} "
          f"{'NS med':>9} {'NS TF/s':>9} {'gram TF/s':>9} {'NS/peak':>8}")
    for rows, cols in parse_sizes(args.sizes):
        m, n = min(rows, cols), max(rows, cols)
        gen = torch.Generator(device=device).manual_seed(1)
        grad = torch.rand(rows, cols, device=device, generator=gen) * 2 - 1
        gram_rate, _ = matmul_rate(m, m, n)
        flops = args.steps * (4.0 * m * m * n + 2.0 * m ** 3)
        for name, extra in variants:
            best, median = time_cuda(
                torch,
                lambda: _zeropower_via_newtonschulz(
                    grad, coefficients, args.steps, EPS, **extra),
                args.repeats)
            rate = flops / (best * 1e-3) / 1e12
            print(f"{rows}x{cols:<{10 - len(str(rows))}} {m:>5} {n:>5} "
                  f"{name:>8} {best:>7.2f}ms {median:>7.2f}ms {rate:>9.1f} "
                  f"{gram_rate:>9.1f} {rate / peak:>8.2f}", flush=True)
        del grad
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""PyTorch's own Newton-Schulz on a CUDA GPU, next to torch.matmul's bf16 rate.

The peer of tools/ns_gpu_bench: times
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

CPU mode (--cpu): PyTorch's Newton-Schulz in float32 on the CPU,
the yardstick of our kernels::NewtonSchulz. Debian's torch 1.13 has no
torch.optim._muon, so `zeropower` below is PyTorch 2.9's
`_zeropower_via_newtonschulz` (torch/optim/_muon.py) line for line with
`grad.bfloat16()` replaced by `grad.float()`: X X^T by `@`, then two
torch.addmm calls folding b*A and a*X (3 GEMMs per step, FLOPs
k*(4*m*m*n + 2*m^3)). torch.set_num_threads(--threads); its matmuls run on
the same OpenBLAS (Debian's libblas.so.3 -> openblas-pthread), so
OPENBLAS_NUM_THREADS and OPENBLAS_CORETYPE apply to both sides.
  python3 tools/torch_ns_bench.py --cpu [--sizes ...] [--repeats 5]
      times each size itself (1 warm-up) and prints best / median ms.
  python3 tools/torch_ns_bench.py --cpu --serve
      the protocol tools/ns_bench --torch drives, so that PyTorch's runs
      interleave with ours in one benchmark: for each stdin line "RxC" it
      runs zeropower (fp32) once on a uniform [-1, 1) matrix of that shape
      (created once per shape, seed 1) and answers "ms <milliseconds>".
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


def time_cuda(torch, fn, repeats, calls, warmup=2):
    """Best and median milliseconds of one fn() on the current stream.

    Each timed run records `calls` calls back to back between its events and
    counts the elapsed time / calls: the throughput of back-to-back calls, as
    tools/ns_gpu_bench --calls measures ours. Where enqueuing a call takes
    longer than its GPU work (a 1024x1024 Newton-Schulz, ~50 us) this is the
    host's enqueue rate, which is what a step without CUDA graphs pays too.
    """
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / calls)
    return min(times), statistics.median(times)


# PyTorch 2.9's default quintic (torch/optim/_muon.py DEFAULT_A/B/C, EPS).
QUINTIC = (3.4445, -4.7750, 2.0315)
EPS = 1e-7


def zeropower(torch, grad, ns_coefficients, ns_steps, eps, dtype=None,
              use_addmm=True):
    """torch.optim._muon._zeropower_via_newtonschulz (PyTorch 2.9+,
    torch/optim/_muon.py) line for line, in `dtype` (default float32; torch
    runs bfloat16), with either of its variants: use_addmm (torch.addmm,
    the form PyTorch 2.9 had) or the plain products (torch.optim.Muon's
    default since). tools/ns_accuracy.py runs it in float64 as the
    reference and in bf16 where torch lacks the function."""
    a, b, c = ns_coefficients
    ortho_grad = grad.to(torch.float32 if dtype is None else dtype)
    if grad.size(0) > grad.size(1):
        ortho_grad = ortho_grad.T
    ortho_grad = ortho_grad / ortho_grad.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram_matrix = ortho_grad @ ortho_grad.T
        if use_addmm:
            gram_update = torch.addmm(
                gram_matrix, gram_matrix, gram_matrix, beta=b, alpha=c)
            ortho_grad = torch.addmm(ortho_grad, gram_update, ortho_grad,
                                     beta=a)
        else:
            gram_update = b * gram_matrix + c * gram_matrix @ gram_matrix
            ortho_grad = a * ortho_grad + gram_update @ ortho_grad
    if grad.size(0) > grad.size(1):
        ortho_grad = ortho_grad.T
    return ortho_grad


def cpu_main(args):
    """--cpu: PyTorch's fp32 Newton-Schulz on the CPU (see the docstring)."""
    import os
    import time
    try:
        import torch
    except ImportError as e:
        print(f"torch_ns_bench: PyTorch is not installed: {e}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    inputs = {}

    def matrix(rows, cols):
        if (rows, cols) not in inputs:
            gen = torch.Generator().manual_seed(1)
            inputs[(rows, cols)] = torch.rand(rows, cols, generator=gen) * 2 - 1
        return inputs[(rows, cols)]

    def run_ms(rows, cols):
        grad = matrix(rows, cols)
        start = time.perf_counter()
        zeropower(torch, grad, QUINTIC, args.steps, EPS)
        return (time.perf_counter() - start) * 1e3

    if args.serve:
        for line in sys.stdin:
            line = line.strip()
            if not line:
                continue
            rows, _, cols = line.partition("x")
            print(f"ms {run_ms(int(rows), int(cols)):.3f}", flush=True)
        return 0
    print(f"torch {torch.__version__} CPU | threads {torch.get_num_threads()} | "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')} | "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', '(unset)')}")
    print(f"NS: PyTorch 2.9 _zeropower_via_newtonschulz in fp32 (addmm), "
          f"{args.steps} steps, 1 warm-up + {args.repeats} timed runs")
    print(f"{'size':<11} {'NS best':>10} {'NS median':>10} {'GF/s':>7}")
    for rows, cols in parse_sizes(args.sizes):
        m, n = min(rows, cols), max(rows, cols)
        run_ms(rows, cols)
        times = [run_ms(rows, cols) for _ in range(args.repeats)]
        best = min(times)
        flops = args.steps * (4.0 * m * m * n + 2.0 * m ** 3)
        print(f"{rows}x{cols:<{10 - len(str(rows))}} {best:>8.1f}ms "
              f"{statistics.median(times):>8.1f}ms {flops / best / 1e6:>7.1f}",
              flush=True)
    return 0


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024x1024,4096x4096,4096x11008,8192x8192")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--calls", type=int, default=20,
                        help="GPU: calls back to back per timed run")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--gemm_size", type=int, default=8192)
    parser.add_argument("--cpu", action="store_true",
                        help="fp32 on the CPU instead of bf16 on a CUDA GPU")
    parser.add_argument("--serve", action="store_true",
                        help="with --cpu: answer 'RxC' lines on stdin")
    parser.add_argument("--threads", type=int, default=2,
                        help="with --cpu: torch.set_num_threads")
    args = parser.parse_args()
    if args.cpu:
        if args.sizes == parser.get_default("sizes"):
            args.sizes = "1024x1024,2048x2048,1024x4096,4096x1024"
        if args.repeats == parser.get_default("repeats"):
            args.repeats = 5
    return args


def import_torch_ns():
    """(torch, _zeropower_via_newtonschulz, (a, b, c), eps), or None after
    printing why (no PyTorch, a PyTorch without it, no CUDA GPU)."""
    try:
        import torch
    except ImportError as e:
        print(f"torch_ns_bench: PyTorch is not installed: {e}", file=sys.stderr)
        return None
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
        return None
    if not torch.cuda.is_available():
        print("torch_ns_bench: no CUDA GPU visible to PyTorch", file=sys.stderr)
        return None
    return (torch, _zeropower_via_newtonschulz,
            (DEFAULT_A, DEFAULT_B, DEFAULT_C), EPS)


def gpu_main(args):
    imported = import_torch_ns()
    if imported is None:
        return 2
    torch, zeropower, coefficients, eps = imported
    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    params = inspect.signature(zeropower).parameters
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
        best, _ = time_cuda(torch, lambda: torch.matmul(a, b), args.repeats,
                            args.calls)
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
                lambda: zeropower(grad, coefficients, args.steps, eps, **extra),
                args.repeats, args.calls)
            rate = flops / (best * 1e-3) / 1e12
            print(f"{rows}x{cols:<{10 - len(str(rows))}} {m:>5} {n:>5} "
                  f"{name:>8} {best:>7.2f}ms {median:>7.2f}ms {rate:>9.1f} "
                  f"{gram_rate:>9.1f} {rate / peak:>8.2f}", flush=True)
        del grad
        torch.cuda.empty_cache()
    return 0


def main():
    args = parse_args()
    return cpu_main(args) if args.cpu else gpu_main(args)


if __name__ == "__main__":
    sys.exit(main())

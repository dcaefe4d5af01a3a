#!/usr/bin/env python3
"""Single-device GPU step of this runtime vs PyTorch's torch.optim.Muon.

Run on a GPU machine with PyTorch >= 2.9 (see docs/benchmarks.md):

    python3 tools/torch_muon_compare.py --muonctl "run.sh bin/muonctl" --steps 3

It writes a job spec (one rank, execution.device = "cuda"), seeded initial
parameters and gradients as .npy files, runs `muonctl validate` on them
(which also dumps the single-device result), runs the same steps with
torch.optim.Muon on CUDA (its Newton-Schulz in bfloat16, as upstream), and
prints per parameter the difference of the two updates (ours - init vs
torch's - init), relative to torch's update: in Frobenius norm and as max
elements. Exit status 1 when one exceeds the bf16 bounds of the GPU tests
(GpuErrorBound in tests/kernels/ns_test_util.h: --fro_tolerance 4e-2 of the
Frobenius norm, --max_tolerance 1e-1 of the max element). torch rounds U and
its norm to bf16 and sums in another order, so a single Newton-Schulz call
already differs by 2-3e-2 in its max element (a CPU emulation): the
Frobenius ratio is the stable check, the max one catches a localised fault.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile

import numpy as np
import torch


SHAPES = {"w_square": (256, 256), "w_tall": (384, 128), "w_wide": (96, 320),
          "w_uneven": (100, 70)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--muonctl", required=True, help="command that runs muonctl")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--fro_tolerance", type=float, default=4e-2)
    ap.add_argument("--max_tolerance", type=float, default=1e-1)
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="muon-vs-torch-")
    rng = np.random.default_rng(0)
    init = {n: (rng.standard_normal(s) * 0.02).astype(np.float32) for n, s in SHAPES.items()}
    grads = [{n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}
             for _ in range(args.steps)]
    os.makedirs(f"{work}/init")
    for n, a in init.items():
        np.save(f"{work}/init/{n}.npy", a)
    for k, g in enumerate(grads):
        os.makedirs(f"{work}/grads/{k}")
        for n, a in g.items():
            np.save(f"{work}/grads/{k}/{n}.npy", a)
    spec = {
        "job_id": "torch-compare",
        "mesh": {"dims": [{"name": "dp_shard", "size": 1}]},
        "params": [{"name": n, "shape": list(s), "placements": ["Replicate()"]}
                   for n, s in SHAPES.items()],
        "optimizer": {"lr": args.lr},
        "execution": {"device": "cuda", "gpu_precision": args.precision},
    }
    with open(f"{work}/spec.json", "w") as f:
        json.dump(spec, f)
    cmd = shlex.split(args.muonctl) + [
        "validate", f"--spec={work}/spec.json", f"--steps={args.steps}",
        f"--init={work}/init", f"--grads={work}/grads", f"--dump={work}/out"]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)

    params = [torch.nn.Parameter(torch.from_numpy(init[n]).cuda()) for n in SHAPES]
    opt = torch.optim.Muon(params, lr=args.lr)
    for k in range(args.steps):
        for p, n in zip(params, SHAPES):
            p.grad = torch.from_numpy(grads[k][n]).cuda()
        opt.step()
    worst_fro, worst_max = 0.0, 0.0
    print(f"{'parameter':12} {'shape':12} {'fro rel':>9} {'max rel':>9} "
          f"{'max|ours-torch|':>16} {'max|update|':>12}")
    for p, n in zip(params, SHAPES):
        ours = np.load(f"{work}/out/single/{n}.npy").astype(np.float64)
        theirs = p.detach().double().cpu().numpy()
        diff = ours - theirs
        update = theirs - init[n].astype(np.float64)
        fro = float(np.linalg.norm(diff) / max(np.linalg.norm(update), 1e-30))
        mx = float(np.abs(diff).max() / max(np.abs(update).max(), 1e-30))
        worst_fro, worst_max = max(worst_fro, fro), max(worst_max, mx)
        print(f"{n:12} {str(SHAPES[n]):12} {fro:9.2e} {mx:9.2e} "
              f"{np.abs(diff).max():16.3e} {np.abs(update).max():12.3e}")
    print(f"torch-compare: torch {torch.__version__}, {torch.cuda.get_device_name()}, "
          f"precision {args.precision}, {args.steps} steps: worst Frobenius "
          f"{worst_fro:.3e} (bound {args.fro_tolerance}), worst max "
          f"{worst_max:.3e} (bound {args.max_tolerance})")
    ok = worst_fro <= args.fro_tolerance and worst_max <= args.max_tolerance
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

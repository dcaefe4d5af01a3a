#!/usr/bin/env python3
"""Single-device GPU step of this runtime vs PyTorch's torch.optim.Muon.

Run on a GPU machine with PyTorch >= 2.9 (see docs/benchmarks.md):

    python3 tools/torch_muon_compare.py --muonctl "run.sh bin/muonctl" --steps 3

It writes a job spec (one rank, execution.device = "cuda"), seeded initial
parameters and gradients as .npy files, runs `muonctl validate` on them
(which also dumps the single-device result), runs the same steps with
torch.optim.Muon on CUDA (its Newton-Schulz in bfloat16, as upstream), and
prints the max abs difference per parameter and relative to the update size.
Exit status 1 when a parameter differs by more than --tolerance (relative to
the largest update), which defaults to a bf16-level 2e-2.
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
    ap.add_argument("--tolerance", type=float, default=2e-2)
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
    worst = 0.0
    print(f"{'parameter':12} {'shape':12} {'max|ours-torch|':>16} {'max|update|':>12} {'relative':>9}")
    for p, n in zip(params, SHAPES):
        ours = np.load(f"{work}/out/single/{n}.npy")
        theirs = p.detach().float().cpu().numpy()
        diff = float(np.abs(ours - theirs).max())
        update = float(np.abs(theirs - init[n]).max())
        rel = diff / max(update, 1e-30)
        worst = max(worst, rel)
        print(f"{n:12} {str(SHAPES[n]):12} {diff:16.3e} {update:12.3e} {rel:9.2e}")
    print(f"torch-compare: torch {torch.__version__}, {torch.cuda.get_device_name()}, "
          f"precision {args.precision}, max relative difference {worst:.3e} "
          f"(tolerance {args.tolerance})")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())

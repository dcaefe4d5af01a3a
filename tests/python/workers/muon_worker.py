#!/usr/bin/python3
"""A rank of a multi-process muonrt.Muon run (tests/python/test_distributed.py).

Under muonrun (or any launcher that sets torchrun's environment) each rank
builds the same full parameters and gradients from a seed, keeps its shard
of each (DTensor's torch.chunk rule for the layout's placements), steps
muonrt.Muon over the shards, and writes its local parameters, momentum
buffers, stats and assignments to OUT/rank_<r>.pt. `--layout single` runs
the same steps in one process over the full tensors (the reference).

    muonrun --nproc-per-node 4 --master-port P muon_worker.py \
        --layout fsdp --steps 6 --out DIR [--save-at 3 --ckpt DIR]
    muon_worker.py --layout fsdp --steps 6 --out DIR \
        --resume PARAMS_AT_3.pt --ckpt DIR --start 3     (under muonrun)
"""
import argparse
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "python"))
import muonrt  # noqa: E402

import fake_dtensor  # noqa: E402

SHAPES = {"w_tall": (24, 8), "w_wide": (6, 20), "w_square": (16, 16),
          "w_uneven": (10, 7)}
# Pipeline stage of each parameter in the "pp" layout (sub_mesh "pp=<s>").
STAGES = {"w_tall": 0, "w_wide": 0, "w_square": 1, "w_uneven": 1}
OPTIONS = dict(lr=0.02, weight_decay=0.1, momentum=0.9)


def layout(name, world):
    """(mesh names, mesh sizes, {param: placements}) of a layout."""
    if name == "single":
        return None
    if name == "fsdp":  # FSDP: every parameter Shard(0) over dp_shard
        return (["dp_shard"], [world],
                {n: ["Shard(0)"] for n in SHAPES})
    if name == "mixed":  # Shard(0), Shard(1) and Replicate() side by side
        return (["dp_shard"], [world],
                {"w_tall": ["Shard(0)"], "w_wide": ["Shard(1)"],
                 "w_square": ["Replicate()"], "w_uneven": ["Shard(0)"]})
    if name == "hsdp_tp":  # 2-D mesh: rows over dp_shard, columns over tp
        assert world % 2 == 0
        return (["dp_shard", "tp"], [world // 2, 2],
                {n: ["Shard(0)", "Shard(1)"] for n in SHAPES})
    if name == "pp":  # pipeline stages: each rank holds its stage's params
        return (["pp"], [world], {n: ["Replicate()"] for n in SHAPES})
    if name == "ddp":  # no mesh or placements given: the defaults (DDP)
        return (["dp"], [world], {n: ["Replicate()"] for n in SHAPES})
    if name == "dtensor":  # as "mixed", but DTensor-like parameters
        return (["dp_shard"], [world],
                {"w_tall": ["Shard(0)"], "w_wide": ["Shard(1)"],
                 "w_square": ["Replicate()"], "w_uneven": ["Shard(0)"]})
    if name == "hsdp":  # replicate x shard
        assert world % 2 == 0
        return (["dp_replicate", "dp_shard"], [2, world // 2],
                {n: ["Replicate()", "Shard(0)"] for n in SHAPES})
    raise ValueError(name)


def coords_of(rank, sizes):
    coords = []
    for s in reversed(sizes):
        coords.append(rank % s)
        rank //= s
    return list(reversed(coords))


def local_shard(full, sizes, placements, rank):
    """This rank's shard of `full` (DTensor: torch.chunk per mesh dim, nested
    left to right; ranks past the last chunk hold an empty shard)."""
    t = full
    for size, placement, c in zip(sizes, placements, coords_of(rank, sizes)):
        if placement.startswith("Shard"):
            d = int(placement[len("Shard("):-1])
            chunks = torch.chunk(t, size, dim=d)
            t = chunks[c] if c < len(chunks) else t.narrow(d, 0, 0)
    return t.contiguous().clone()


def problem(steps, seed=1234):
    g = torch.Generator().manual_seed(seed)
    init = {n: torch.randn(s, generator=g) for n, s in SHAPES.items()}
    grads = [{n: torch.randn(s, generator=g) for n, s in SHAPES.items()}
             for _ in range(steps)]
    return init, grads


def refuse_step(opt, params, rank):
    """Rank 1 gives one gradient that is not contiguous: its step raises before
    calling the library, the others' fail at once naming it, nothing
    changes anywhere, and the step goes on once the gradient is fixed.
    Returns (exception type, message, seconds the failed step took)."""
    name = next(iter(params))
    good = params[name].grad
    if rank == 1:
        params[name].grad = good.t().contiguous().t()  # same size, strided
    start = time.monotonic()
    try:
        opt.step()
        raise AssertionError(f"rank {rank}: the refused step went through")
    except Exception as e:  # noqa: BLE001 (reported to the test)
        refused = (type(e).__name__, str(e), time.monotonic() - start)
    params[name].grad = good
    return refused


def bad_create(layout_name, out, pg):
    """Rank 1 names a parameter the model lacks in placements= (a check of
    muonrt.Muon's own, before the library): every rank's construction
    fails, the others' at once naming rank 1. Writes (exception type,
    message, seconds the construction took) to OUT/rank_<r>.pt."""
    names, sizes, placements = layout(layout_name, pg.world_size)
    params = {n: torch.nn.Parameter(local_shard(t, sizes, placements[n],
                                                pg.rank))
              for n, t in problem(1)[0].items()}
    placements = dict(placements)
    if pg.rank == 1:
        placements["no.such.weight"] = ["Shard(0)"]
    start = time.monotonic()
    try:
        muonrt.Muon(list(params.items()), **OPTIONS,
                    mesh=muonrt.Mesh(names, sizes), placements=placements,
                    global_shapes=SHAPES, process_group=pg)
        raise AssertionError(f"rank {pg.rank}: the optimizer was created")
    except Exception as e:  # noqa: BLE001 (reported to the test)
        failed = (type(e).__name__, str(e), time.monotonic() - start)
    torch.save({"failed": failed},
               os.path.join(out, f"rank_{pg.rank}.pt"))


def close_during_step(layout_name, out, pg):
    """Rank 0 destroys the process group from another thread (1 s in)
    while its step waits for rank 1's (which starts 4 s late): the destroy waits for
    the step in flight (it used to free the optimizer under it), the step
    completes, and the next call raises RuntimeError. Writes (step's end,
    destroy's end, the next call's exception type and message) to
    OUT/rank_0.pt; times in seconds from time.monotonic()."""
    import threading
    names, sizes, placements = layout(layout_name, pg.world_size)
    init, grads = problem(1)
    params = {n: torch.nn.Parameter(local_shard(t, sizes, placements[n],
                                                pg.rank))
              for n, t in init.items()}
    for n, p in params.items():
        p.grad = local_shard(grads[0][n], sizes, placements[n], pg.rank)
    opt = muonrt.Muon(list(params.items()), **OPTIONS,
                      mesh=muonrt.Mesh(names, sizes), placements=placements,
                      global_shapes=SHAPES, process_group=pg)
    pg.barrier()
    if pg.rank != 0:
        time.sleep(4.0)
        opt.step()
        return
    ended = {}

    def destroy():
        time.sleep(1.0)  # rank 0 is in its step by now
        muonrt.destroy_process_group()
        ended["destroy"] = time.monotonic()

    watchdog = threading.Thread(target=destroy)
    watchdog.start()
    opt.step()
    ended["step"] = time.monotonic()
    watchdog.join(timeout=60)
    try:
        opt.step()
        after = ("none", "the closed optimizer stepped")
    except Exception as e:  # noqa: BLE001 (reported to the test)
        after = (type(e).__name__, str(e))
    torch.save({"step_end": ended["step"],
                "destroy_end": ended.get("destroy"), "after": after},
               os.path.join(out, "rank_0.pt"))


def run(layout_name, steps, out, save_at=None, ckpt=None, resume=None,
        start=0, pg=None, exchange_dtype=None, normuon=False,
        overlap=False, refuse_at=None):
    rank = pg.rank if pg else 0
    world = pg.world_size if pg else 1
    init, grads = problem(steps)
    if resume:
        init = torch.load(resume)
    lay = layout(layout_name, world)
    if lay is None:
        local = {n: t.clone() for n, t in init.items()}
        kw = {}
    else:
        names, sizes, placements = lay
        local = {n: local_shard(init[n], sizes, placements[n], rank)
                 for n in SHAPES}
        kw = dict(mesh=muonrt.Mesh(names, sizes), placements=placements,
                  global_shapes=SHAPES, process_group=pg)
        if layout_name == "pp":
            local = {n: t for n, t in local.items() if STAGES[n] == rank}
            kw["sub_mesh"] = {n: {"pp": STAGES[n]} for n in local}
            kw["placements"] = {n: placements[n] for n in local}
            kw["global_shapes"] = {n: SHAPES[n] for n in local}
        if layout_name == "ddp":
            kw = {}  # the default group, Mesh(["dp"], [world]), Replicate()
    dtensor = layout_name == "dtensor"
    if dtensor:
        # Mesh, placements (torch 2.x's spelling) and global shapes come
        # from the parameters; the optimizer reads and writes the locals.
        mesh = fake_dtensor.DeviceMesh(lay[0], lay[1])

        def dplacements(n):
            return [fake_dtensor.Shard(int(pl[6:-1])) if pl.startswith("Shard")
                    else fake_dtensor.Replicate() for pl in lay[2][n]]
        params = {n: fake_dtensor.dtensor_parameter(t, SHAPES[n], mesh,
                                                    dplacements(n))
                  for n, t in local.items()}
        kw = dict(process_group=pg)
    else:
        params = {n: torch.nn.Parameter(t) for n, t in local.items()}
    if exchange_dtype:
        kw["exchange_dtype"] = exchange_dtype
    if normuon:
        kw["normuon"] = True
    if overlap:  # marked by hand below: the gradients are set, not computed
        kw.update(overlap_backward=True, bucket_size_bytes=256)
    opt = muonrt.Muon(list(params.items()), **OPTIONS, **kw)
    if resume:
        opt.load_checkpoint(ckpt)
        assert opt.step_count == start, (opt.step_count, start)
    for k in range(start, steps):
        for n, p in params.items():
            g = grads[k][n]
            if dtensor:
                p.grad = fake_dtensor.dtensor_grad(
                    local_shard(g, lay[1], lay[2][n], rank), SHAPES[n],
                    p.device_mesh, p.placements)
            else:
                p.grad = (local_shard(g, lay[1], lay[2][n], rank) if lay
                          else g.clone())
        if overlap:  # last parameter first, as backward makes them ready
            for n in reversed(list(params)):
                opt.mark_ready(n)
        if k == refuse_at:
            refused = refuse_step(opt, params, rank)
        opt.step()
        if save_at is not None and k + 1 == save_at:
            opt.save_checkpoint(ckpt)
            if lay is None:
                torch.save({n: p.detach().clone() for n, p in params.items()},
                           os.path.join(out, f"params_at_{save_at}.pt"))
    result = {
        "rank": rank, "world": world, "layout": layout_name,
        "refused": refused if refuse_at is not None else None,
        "params": {n: (p._local_tensor if dtensor else p).detach().clone()
                   for n, p in params.items()},
        "momentum": {n: opt.momentum_buffer(n) for n in params},
        "variance": {n: opt.variance_neuron(n) for n in params},
        "state_keys": {n: sorted(opt.state_dict()["state"][i])
                       for i, n in enumerate(params)},
        "stats": opt.last_step_stats(),
        "assignments": opt.assignments(),
        "step_count": opt.step_count,
    }
    name = "single.pt" if lay is None else f"rank_{rank}.pt"
    torch.save(result, os.path.join(out, name))
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layout", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", required=True)
    ap.add_argument("--save-at", type=int)
    ap.add_argument("--ckpt")
    ap.add_argument("--resume")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--exchange-dtype")
    ap.add_argument("--normuon", action="store_true")
    ap.add_argument("--overlap", action="store_true")
    ap.add_argument("--refuse-at", type=int)
    ap.add_argument("--bad-create", action="store_true")
    ap.add_argument("--close-during-step", action="store_true")
    args = ap.parse_args()
    pg = None
    if args.layout != "single":
        pg = muonrt.init_process_group(timeout=60)
    if args.bad_create:
        bad_create(args.layout, args.out, pg)
        muonrt.destroy_process_group()
        return
    if args.close_during_step:
        close_during_step(args.layout, args.out, pg)
        muonrt.destroy_process_group()
        return
    run(args.layout, args.steps, args.out, args.save_at, args.ckpt,
        args.resume, args.start, pg, args.exchange_dtype, args.normuon,
        args.overlap, args.refuse_at)
    if pg is not None:
        pg.barrier()
        muonrt.destroy_process_group()


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Fashion-MNIST trained by a PyTorch model whose matrices muonrt.Muon steps.

The main job (README's first command). Without --worker this is the
launcher; it runs, in order and timed per epoch:
  1. distributed: N rank processes of this script (--worker), started by
     `muonrun --nproc-per-node N` or, with --launcher spawn (where muonrun
     cannot run, e.g. in the PyTorch 2.x chroot), by this launcher with
     torchrun's env:// variables. With PyTorch >= 2.6 and --layout fsdp
     the model is sharded by FSDP2 (`fully_shard` per Linear and on the
     root, on a DeviceMesh "dp_shard" of N): forward/backward on each
     rank's micro-batch, FSDP2's reduce-scatter of the gradients, and
     muonrt.Muon stepping the DTensor parameters (mesh, placements and
     global shapes read from them). The gradient sums are gloo's
     reduce-scatter's, in its own order, so the weights match the single
     process within float32 rounding of the sums, not bitwise. On older
     PyTorch (Debian 12's 1.13), the ranks' gradients are summed with
     torch.distributed (all_gather, then a sum in rank order: bitwise the
     single process) and muonrt.Muon steps FSDP-style hand-made shards
     (each rank's rows, Shard(0) over a dp_shard mesh; all-gathered back
     after the step), or DDP (--layout ddp: replicated parameters, the
     owner of each matrix orthogonalizes it and sends it to every
     replica);
  2. single: the same trainer in one process, accumulating the N
     micro-batches in rank order, stepped by muonrt.Muon;
  3. torch_muon: the same single-process trainer stepped by a plain PyTorch
     Muon step (torch.optim.Muon where PyTorch has it, else the same
     algorithm written in PyTorch ops below), for the time per epoch.
It ends with one line:
  fashion-mnist: distributed_acc=... single_acc=... torch_muon_acc=...
  max_abs_param_diff=... max_rel_loss_diff=... ranks=N layout=...
  s_per_epoch distributed=... single=... torch_muon=... wall_s=...
and exits non-zero when the distributed and single runs disagree by more
than 1e-5 relative on the loss curve.

With --device cuda it runs 2 and 3 only, in this process on cuda:0 (model,
data, muonrt.Muon's step and torch.optim.Muon's on the GPU; several ranks
with CUDA parameters are not supported yet), one micro-batch per step,
and ends with:
  fashion-mnist: distributed_acc=skipped single_acc=... torch_muon_acc=...
  torch_muon_steps=... max_rel_loss_diff_vs_torch_muon=... ranks=1
  device=cuda:0 torch=... single_ms_per_step=... torch_muon_ms_per_step=...
  s_per_epoch single=... torch_muon=... wall_s=...
exiting non-zero when muonrt.Muon's loss is not finite or its test
accuracy falls more than CUDA_ACC_BOUND below torch.optim.Muon's.
"""

import argparse
import gzip
import json
import math
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

# One BLAS thread in every process (set before torch and libmuonrt load
# OpenBLAS): the bits of a GEMM depend on the thread count, and the rank
# processes and the single-process run must compute the same bits.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))
import muonrt  # noqa: E402

DATA_DIR = "/usr/share/datasets/fashion-mnist"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=4, help="rank processes")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cpu: the distributed run, one process and "
                        "torch.optim.Muon on the CPU; cuda: one process on "
                        "cuda:0, muonrt.Muon and torch.optim.Muon on CUDA "
                        "tensors (no distributed run: --nproc and --layout "
                        "are not used)")
    p.add_argument("--layout", choices=["fsdp", "ddp"], default="fsdp")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.95)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overlap-backward", action="store_true",
                   help="muonrt.Muon(overlap_backward=True): the step starts "
                        "during backward (gradient hooks)")
    p.add_argument("--normuon", action="store_true",
                   help="NorMuon (arXiv 2510.05491): muonrt.Muon(normuon=True); "
                        "the torch.optim.Muon reference stays plain Muon")
    p.add_argument("--train-limit", type=int, default=0,
                   help="use the first N training images (0 = all)")
    p.add_argument("--data-dir", default=DATA_DIR)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--skip-torch-muon", action="store_true",
                   help="do not run the plain-PyTorch Muon comparison")
    p.add_argument("--torch-muon-budget-s", type=float, default=120.0,
                   help="stop the torch.optim.Muon comparison after this "
                        "many seconds of training (at a step boundary; its "
                        "accuracy is then that of the steps done, and the "
                        "output says how many). On CPUs without fast bf16 "
                        "kernels its bf16 Newton-Schulz takes minutes per "
                        "epoch. 0: no bound")
    p.add_argument("--torch-muon-full", action="store_true",
                   help="run the torch.optim.Muon comparison to the end "
                        "(same as --torch-muon-budget-s 0)")
    p.add_argument("--launcher", choices=["auto", "muonrun", "spawn"],
                   default="auto",
                   help="how the ranks start: muonrun, or spawned with "
                        "torchrun's env:// variables (auto: muonrun when it "
                        "runs here)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    # Set by the launcher when muonrun prefixes each rank's lines itself.
    p.add_argument("--no-rank-tag", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ---- Data ------------------------------------------------------------------

def read_idx(path):
    """An IDX file (optionally gzipped) as a numpy array."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4:
        raise ValueError(f"{path}: not an IDX file")
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08 or not 1 <= ndim <= 3:
        raise ValueError(f"{path}: unsupported IDX header")
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    count = int(np.prod(dims))
    body = data[4 + 4 * ndim:]
    if len(body) != count:
        raise ValueError(f"{path}: {len(body)} bytes of data, expected {count}")
    return np.frombuffer(body, dtype=np.uint8).reshape(dims)


def load_data(args):
    def load(prefix):
        images = read_idx(os.path.join(args.data_dir, f"{prefix}-images-idx3-ubyte.gz"))
        labels = read_idx(os.path.join(args.data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
        x = torch.from_numpy(images.reshape(len(images), -1).astype(np.float32) / 255.0)
        return x, torch.from_numpy(labels.astype(np.int64))
    train_x, train_y = load("train")
    test_x, test_y = load("t10k")
    if args.train_limit > 0:
        train_x, train_y = train_x[:args.train_limit], train_y[:args.train_limit]
    return train_x, train_y, test_x, test_y


# ---- Model -----------------------------------------------------------------

def torch_device(args):
    """The device of the model, the data and the optimizer state."""
    return torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")


def synchronize(device):
    """Waits for the work queued on `device` (CUDA kernels run
    asynchronously), so that the host clock times it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_model(args):
    """A bias-free MLP 784-hidden-hidden-10; every matrix is Muon's.
    Initialized on the CPU, then moved: the same weights on either device."""
    torch.manual_seed(args.seed)
    return torch.nn.Sequential(
        torch.nn.Linear(784, args.hidden, bias=False), torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, args.hidden, bias=False), torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, 10, bias=False)).to(torch_device(args))


def micro_batch_grads(model, x, y, batch):
    """Forward/backward of one micro-batch; loss summed and divided by the
    full batch size, so micro-batch gradients add up to the batch's.
    Returns (loss, [grad per parameter])."""
    for p in model.parameters():
        p.grad = None
    loss = F.cross_entropy(model(x), y, reduction="sum") / batch
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]


@torch.no_grad()
def accuracy(model, x, y):
    return (model(x).argmax(dim=1) == y).float().mean().item()


# ---- A plain PyTorch Muon step (the peer the runtime is timed against) -----

def zeropower_via_newtonschulz(g, a=3.4445, b=-4.7750, c=2.0315, steps=5, eps=1e-7):
    x = g.float()
    transposed = x.size(0) > x.size(1)
    if transposed:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        m = x @ x.T
        x = a * x + (b * m + c * m @ m) @ x
    return x.T if transposed else x


class TorchMuon(torch.optim.Optimizer):
    """torch.optim.Muon's step written in PyTorch ops (PyTorch 1.13 has no
    torch.optim.Muon): momentum lerp, Nesterov, Newton-Schulz, decoupled
    weight decay, AdjustLR "original"."""

    def __init__(self, params, lr, weight_decay, momentum):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay,
                                      momentum=momentum))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - group["momentum"])
                update = p.grad.lerp(buf, group["momentum"])
                o = zeropower_via_newtonschulz(update)
                adjusted = group["lr"] * math.sqrt(max(1.0, p.size(0) / p.size(1)))
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(o, alpha=-adjusted)


def torch_muon(params, args):
    if hasattr(torch.optim, "Muon"):
        return torch.optim.Muon(params, lr=args.lr, weight_decay=args.weight_decay,
                                momentum=args.momentum)
    return TorchMuon(params, args.lr, args.weight_decay, args.momentum)


# ---- Training ----------------------------------------------------------------

def epoch_order(n, epoch, seed):
    g = torch.Generator().manual_seed(seed * 1000 + epoch)
    return torch.randperm(n, generator=g)


def rank_order_sum(t, world, dist):
    """Every rank's `t` summed in rank order (all_gather, then rank 0's +
    rank 1's + ...): the order the single-process run accumulates in."""
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t)
    total = parts[0].clone()
    for q in range(1, world):
        total.add_(parts[q])
    return total


def make_optimizer(args, model, world, rank, dist, muon_kind):
    """The optimizer of `model` and, for the fsdp layout, this rank's row
    shards [(name, shard parameter, first row, rows)] (else None)."""
    params = list(model.parameters())
    names = [n for n, _ in model.named_parameters()]
    if muon_kind == "torch":
        return torch_muon(params, args), None
    if dist is not None and args.layout == "fsdp":
        # Each rank's optimizer sees views of its rows (torch.chunk over
        # dim 0): the momentum state is sharded, the weights live in `p`.
        shards = []
        for name, p in zip(names, params):
            rows = torch.chunk(torch.arange(p.shape[0]), world)
            r = rows[rank] if rank < len(rows) else torch.arange(0)
            begin = int(r[0]) if len(r) else p.shape[0]
            shard = torch.nn.Parameter(p.data[begin:begin + len(r)])
            shards.append((name, shard, begin, len(r)))
        opt = muonrt.Muon([(n, s) for n, s, _, _ in shards], lr=args.lr,
                          weight_decay=args.weight_decay, momentum=args.momentum,
                          normuon=args.normuon,
                          mesh=muonrt.Mesh(["dp_shard"], [world]),
                          placements=["Shard(0)"],
                          global_shapes={n: tuple(p.shape) for n, p in zip(names, params)})
        return opt, shards
    kwargs = {}
    if dist is not None:
        kwargs = dict(mesh=muonrt.Mesh(["dp_replicate"], [world]),
                      placements=["Replicate()"])
    opt = muonrt.Muon(list(zip(names, params)), lr=args.lr,
                      weight_decay=args.weight_decay, momentum=args.momentum,
                      normuon=args.normuon, **kwargs)
    return opt, None


def step_grads(model, data, idx, world, rank, dist, batch):
    """The summed loss and gradients of one step's batch `idx`: one process
    accumulates the `world` micro-batches in order; a rank computes its own
    and sums the ranks' in rank order."""
    train_x, train_y = data[0], data[1]
    micro = batch // world
    if dist is not None:
        part = idx[rank * micro:(rank + 1) * micro]
        loss, mine = micro_batch_grads(model, train_x[part], train_y[part], batch)
        return (rank_order_sum(loss, world, dist),
                [rank_order_sum(g, world, dist) for g in mine])
    total, summed = 0.0, None
    for k in range(world):
        part = idx[k * micro:(k + 1) * micro]
        loss, grads = micro_batch_grads(model, train_x[part], train_y[part], batch)
        total = loss if k == 0 else total + loss
        summed = [g.clone() for g in grads] if k == 0 else \
            [a.add_(g) for a, g in zip(summed, grads)]
    return total, summed


def train(args, data, world, rank=0, dist=None, muon_kind="muonrt", log=True,
          budget_s=0.0):
    """Trains with `world` micro-batches per step. dist None: one process
    (accumulates the micro-batches itself); else this rank of `world`.
    budget_s > 0 stops after the first step boundary past that many
    seconds of training. Returns losses, accuracy, final weights, seconds
    per epoch (extrapolated from the steps done when stopped early), each
    step's milliseconds (from its batch to its updated weights), steps done
    and steps planned."""
    device = data[0].device
    model = make_model(args)
    params = list(model.parameters())
    batch = args.batch_size
    steps_per_epoch = len(data[0]) // batch
    tag = "[single] " if dist is None else f"[rank {rank}] "
    if dist is not None and args.no_rank_tag:
        tag = ""  # muonrun already prefixes "[rank N]"
    if muon_kind == "torch":
        tag = "[torch_muon] "
    opt, shards = make_optimizer(args, model, world, rank, dist, muon_kind)
    losses, epoch_s, step_ms = [], [], []
    trained_s = 0.0
    acc = None
    for epoch in range(args.epochs):
        order = epoch_order(len(data[0]), epoch, args.seed).to(device)
        t0 = time.perf_counter()
        for s in range(steps_per_epoch):
            if budget_s > 0 and trained_s + time.perf_counter() - t0 > budget_s:
                break
            step_t0 = time.perf_counter()
            total, grads = step_grads(model, data, order[s * batch:(s + 1) * batch],
                                      world, rank, dist, batch)
            losses.append(float(total))
            if shards is not None:
                for (_, shard, begin, n), g in zip(shards, grads):
                    shard.grad = g[begin:begin + n]
            else:
                for p, g in zip(params, grads):
                    p.grad = g
            opt.step()
            if shards is not None:
                unshard(params, shards, world, dist)
            synchronize(device)
            step_ms.append(1000 * (time.perf_counter() - step_t0))
            step = epoch * steps_per_epoch + s + 1
            if log and (step == 1 or step % args.log_every == 0):
                print(f"{tag}epoch {epoch + 1} step {s + 1}/{steps_per_epoch} "
                      f"loss {losses[-1]:.5f} ({time.perf_counter() - t0:.1f} s)", flush=True)
        elapsed = time.perf_counter() - t0
        trained_s += elapsed
        steps = len(losses) - epoch * steps_per_epoch
        stopped = steps < steps_per_epoch
        if steps == 0:
            break  # the budget ran out at the epoch boundary
        # An epoch cut short: its time extrapolated from the steps done.
        epoch_s.append(elapsed * steps_per_epoch / steps)
        acc = accuracy(model, data[2], data[3])
        if log:
            print(epoch_line(tag, epoch, losses[-steps:], acc, epoch_s[-1],
                             step_ms[-steps:], steps if stopped else 0), flush=True)
        if stopped:
            break
    if acc is None:  # stopped before its first step
        acc = accuracy(model, data[2], data[3])
    return dict(losses=losses, accuracy=acc, epoch_s=epoch_s or [0.0],
                step_ms=step_ms, weights=[p.detach().clone() for p in params],
                steps=len(losses), planned=args.epochs * steps_per_epoch)


def epoch_line(tag, epoch, losses, acc, epoch_s, step_ms, stopped_after):
    """What an epoch printed: its mean training loss, the test accuracy,
    seconds per epoch and the median step (the first steps of a run
    include one-time setup: CUDA kernels, muonrt's plan)."""
    after = f", after {stopped_after} steps" if stopped_after else ""
    return (f"{tag}epoch {epoch + 1} train loss {sum(losses) / len(losses):.5f} "
            f"test accuracy {acc:.4f} ({epoch_s:.2f} s/epoch, "
            f"{statistics.median(step_ms):.1f} ms/step median{after})")


def has_fsdp2():
    """PyTorch >= 2.6 with FSDP2 (fully_shard) and DeviceMesh."""
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
        from torch.distributed.device_mesh import init_device_mesh  # noqa: F401
    except Exception:  # noqa: BLE001 (torch 1.13's fsdp fails to import
        return False   # on Python 3.11 with a ValueError)
    return True


def rank_order_reduce_scatter():
    """A reduce-scatter for FSDP2 (`set_custom_reduce_scatter`, PyTorch
    2.8+) that sums the ranks' gradients in rank order, as the single
    process accumulates its micro-batches: an all_gather of every rank's
    [world * shard] input, then rank 0's + rank 1's + ... for this rank's
    shard. None where FSDP2 has no such hook (gloo's own order is used)."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter
    except ImportError:
        return None
    import torch.distributed as tdist

    class RankOrderReduceScatter(ReduceScatter):
        def allocate(self, size, *, dtype, device):
            return torch.empty(*size, dtype=dtype, device=device)

        def __call__(self, output_tensor, input_tensor, group, op,
                     async_op=False):
            world = tdist.get_world_size(group)
            parts = [torch.empty_like(input_tensor) for _ in range(world)]
            tdist.all_gather(parts, input_tensor, group=group)
            total = parts[0].clone()
            for q in range(1, world):
                total.add_(parts[q])
            mine = total.view(world, -1)[tdist.get_rank(group)]
            if op not in (tdist.ReduceOp.SUM, "sum"):
                raise ValueError(f"rank-order reduce-scatter: op {op}")
            output_tensor.view(-1).copy_(mine)
            return None

    return RankOrderReduceScatter()


def train_fsdp2(args, data, world, rank, dist, log=True):
    """The distributed run on FSDP2: `fully_shard` on a DeviceMesh, real
    forward/backward and reduce-scatter, muonrt.Muon over the DTensors."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    train_x, train_y, test_x, test_y = data
    # muonrun prefixes every line with "[rank N]" itself.
    tag = "" if args.no_rank_tag else f"[rank {rank}] "
    model = make_model(args)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
    sharded = [layer for layer in model if isinstance(layer, torch.nn.Linear)]
    for layer in sharded:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    # Gradients summed (not averaged) over the ranks, in rank order when
    # FSDP2 takes a custom reduce-scatter (bitwise the single process).
    comm = rank_order_reduce_scatter()
    rank_order = comm is not None and hasattr(model, "set_custom_reduce_scatter")
    for m in sharded + [model]:
        m.set_gradient_divide_factor(1.0)
        if rank_order:
            m.set_force_sum_reduction_for_comms(True)
            m.set_custom_reduce_scatter(comm)
    opt = muonrt.Muon(list(model.named_parameters()), lr=args.lr,
                      weight_decay=args.weight_decay, momentum=args.momentum,
                      normuon=args.normuon,
                      overlap_backward=args.overlap_backward,
                      bucket_size_bytes=(1 << 20) if args.overlap_backward
                      else 0)
    if log:
        for n, p in model.named_parameters():
            print(f"{tag}{n}: DTensor {tuple(p.shape)} "
                  f"{p.placements} on mesh {mesh.mesh_dim_names}, local "
                  f"{tuple(p.to_local().shape)}", flush=True)
    batch = args.batch_size
    micro = batch // world
    steps_per_epoch = len(train_x) // batch
    losses, epoch_s = [], []
    for epoch in range(args.epochs):
        order = epoch_order(len(train_x), epoch, args.seed)
        t0 = time.perf_counter()
        for s in range(steps_per_epoch):
            idx = order[s * batch:(s + 1) * batch]
            part = idx[rank * micro:(rank + 1) * micro]
            loss = F.cross_entropy(model(train_x[part]), train_y[part],
                                   reduction="sum") / batch
            loss.backward()
            step = epoch * steps_per_epoch + s + 1
            if args.overlap_backward and step == 1 and log:
                # FSDP2 runs the post-accumulate-grad hooks after each
                # layer's reduce-scatter: the optimizer started in backward.
                print(f"{tag}overlap_backward: {len(opt._ready)} of "
                      f"{len(list(model.parameters()))} parameters marked ready during "
                      f"backward", flush=True)
            losses.append(float(rank_order_sum(loss.detach(), world, dist)))
            opt.step()
            opt.zero_grad(set_to_none=True)
            if log and (step == 1 or step % args.log_every == 0):
                print(f"{tag}epoch {epoch + 1} step {s + 1}/"
                      f"{steps_per_epoch} loss {losses[-1]:.5f} "
                      f"({time.perf_counter() - t0:.1f} s)", flush=True)
        epoch_s.append(time.perf_counter() - t0)
        acc = accuracy(model, test_x, test_y)  # FSDP2 forward: every rank
        if log:
            print(f"{tag}epoch {epoch + 1} test accuracy {acc:.4f} "
                  f"({epoch_s[-1]:.1f} s/epoch)", flush=True)
    weights = [p.full_tensor().detach().clone() for p in model.parameters()]
    return dict(losses=losses, accuracy=acc, epoch_s=epoch_s,
                weights=weights, fsdp2=True, rank_order=rank_order)


@torch.no_grad()
def unshard(params, shards, world, dist):
    """FSDP's all-gather: every rank's updated rows back into the full
    weights (torch.chunk rows, padded to equal sizes for all_gather)."""
    for p, (_, _, begin, n) in zip(params, shards):
        chunk = -(-p.shape[0] // world)
        mine = torch.zeros(chunk, p.shape[1])
        mine[:n] = p.data[begin:begin + n]
        parts = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(parts, mine)
        row = 0
        for q in range(world):
            take = min(chunk, p.shape[0] - row)
            if take > 0:
                p.data[row:row + take] = parts[q][:take]
            row += max(take, 0)


def worker_main(args):
    if args.device != "cpu":
        raise SystemExit(f"fashion-mnist: --worker --device {args.device}: rank "
                         f"processes run on the CPU (several ranks with CUDA "
                         f"parameters are not supported yet); --device cuda "
                         f"runs one process, without --worker")
    import torch.distributed as tdist
    torch.set_num_threads(1)
    tdist.init_process_group("gloo", init_method="env://")
    pg = muonrt.init_process_group()
    data = load_data(args)
    if args.layout == "fsdp" and has_fsdp2():
        result = train_fsdp2(args, data, pg.world_size, pg.rank, tdist,
                             log=pg.rank == 0)
    else:
        result = train(args, data, pg.world_size, pg.rank, tdist,
                       log=pg.rank == 0)
    if pg.rank == 0:
        torch.save(result, os.path.join(args.out, "distributed.pt"))
    pg.barrier()
    tdist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def muonrun_candidates():
    """MUONRUN, else the self-contained muonrun of the package
    (python/muonrt/bin, tools/graft_libs.py), else bazel-bin's."""
    if os.environ.get("MUONRUN"):
        return [os.environ["MUONRUN"]]
    return [os.path.join(REPO, "python", "muonrt", "bin", "muonrun"),
            os.path.join(REPO, "bazel-bin", "tools", "muonrun")]


def muonrun_runs():
    """True when a muonrun exists and starts here (bazel-bin's does not
    inside the PyTorch 2.x chroot, which lacks the build's libraries; the
    package's self-contained one does)."""
    for path in muonrun_candidates():
        try:
            if subprocess.run([path, "--help"], capture_output=True,
                              timeout=30).returncode == 0:
                os.environ["MUONRUN"] = path
                return True
        except (OSError, subprocess.TimeoutExpired):
            continue
    return False


def spawn_ranks(n, worker):
    """Starts `worker` as ranks 0..n-1 with torchrun's env:// variables
    (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT; muonrt's coordinator listens on MASTER_PORT + 1); waits
    for all (at most an hour), killing the others when one fails. Returns
    the first non-zero exit status, or 0."""
    port = free_port_pair()
    procs = []
    for rank in range(n):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(n),
                   LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(n),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   USE_LIBUV="0")
        procs.append(subprocess.Popen(worker, env=env))
    deadline = time.time() + 3600
    rc = 0
    while procs and time.time() < deadline:
        for p in list(procs):
            code = p.poll()
            if code is None:
                continue
            procs.remove(p)
            if code != 0 and rc == 0:
                rc = code
                for q in procs:
                    q.kill()
        time.sleep(0.2)
    for p in procs:  # past the deadline
        p.kill()
        rc = rc or 124
    return rc


def free_port_pair():
    """A free port p with p + 1 free too (torch's store on p, muonrt's
    embedded coordinator on p + 1)."""
    for _ in range(50):
        p = free_port()
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", p + 1))
            return p
        except OSError:
            continue
    raise SystemExit("fashion-mnist: no two consecutive free ports")


def muonrun_path():
    path = next((p for p in muonrun_candidates() if os.path.exists(p)),
                muonrun_candidates()[-1])
    if not os.path.exists(path):
        raise SystemExit(f"fashion-mnist: {path} not found (bazel build //tools:muonrun)")
    return path


# A sanity bound for --device cuda: muonrt.Muon's test accuracy may fall at
# most this far below torch.optim.Muon's. Both run the same algorithm from
# the same weights on the same batches; their bf16 Newton-Schulz rounds
# differently, so the loss curves drift apart but land close (on the CPU,
# this trainer's Muon with bf16-rounded Newton-Schulz products ended one
# epoch 1e-4 in accuracy from its fp32 run).
CUDA_ACC_BOUND = 0.02


def check_launcher_args(args):
    if args.torch_muon_budget_s < 0:
        raise SystemExit(f"fashion-mnist: --torch-muon-budget-s must be >= 0 "
                         f"(0: no bound), got {args.torch_muon_budget_s:g}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("fashion-mnist: --device cuda: no CUDA device "
                         "(torch.cuda.is_available() is False)")


def run_distributed(args):
    """The distributed run (muonrun or spawned rank processes of this
    script); returns rank 0's result."""
    launcher = args.launcher
    if launcher == "auto":
        launcher = "muonrun" if muonrun_runs() else "spawn"
    print(f"fashion-mnist: torch {torch.__version__}, Python "
          f"{sys.version.split()[0]}; distributed run: "
          f"{'FSDP2 fully_shard' if args.layout == 'fsdp' and has_fsdp2() else args.layout}, "
          f"ranks started by {launcher}", flush=True)
    with tempfile.TemporaryDirectory(prefix="fashion-mnist-torch-") as out:
        worker = [sys.executable, os.path.abspath(__file__), "--worker",
                  "--out", out]
        worker += [a for a in sys.argv[1:] if a not in ("--worker",)]
        if launcher == "muonrun":
            cmd = [muonrun_path(), "--nproc-per-node", str(args.nproc),
                   "--master-addr", "127.0.0.1", "--master-port",
                   str(free_port())] + worker
            # muonrun prefixes every line with "[rank N]" itself.
            cmd.append("--no-rank-tag")
            rc = subprocess.call(cmd, timeout=3600)
        else:
            rc = spawn_ranks(args.nproc, worker)
        if rc != 0:
            raise SystemExit(f"fashion-mnist: the distributed run failed ({launcher} exit {rc})")
        return torch.load(os.path.join(out, "distributed.pt"))


def run_torch_muon(args, data, world):
    """The plain PyTorch Muon run within its time budget, or None when
    skipped."""
    if args.skip_torch_muon:
        return None
    budget = 0.0 if args.torch_muon_full else args.torch_muon_budget_s
    ref = train(args, data, world, muon_kind="torch", budget_s=budget)
    if ref["steps"] < ref["planned"]:
        print(f"fashion-mnist: torch.optim.Muon stopped after {ref['steps']} of "
              f"{ref['planned']} steps ({budget:g} s budget; --torch-muon-full "
              f"runs it to the end): its accuracy is that of those steps and "
              f"its s_per_epoch extrapolated", flush=True)
    return ref


def mean(values):
    return sum(values) / len(values)


def torch_muon_fields(ref):
    """torch_muon's accuracy, steps and seconds per epoch as printed."""
    if ref is None:
        return "skipped", "skipped", "skipped"
    return (f"{ref['accuracy']:.4f}", f"{ref['steps']}/{ref['planned']}",
            f"{mean(ref['epoch_s']):.2f}")


def cpu_job(args, data, start):
    """The distributed run, one process and torch_muon on the CPU; fails
    when the distributed and single-process loss curves disagree."""
    dist = run_distributed(args)
    single = train(args, data, args.nproc)
    ref = run_torch_muon(args, data, args.nproc)
    max_diff = max(float((a - b).abs().max()) for a, b in zip(dist["weights"], single["weights"]))
    max_rel = max(abs(a - b) / max(1e-12, abs(a)) for a, b in zip(single["losses"], dist["losses"]))
    torch_acc, torch_steps, torch_s = torch_muon_fields(ref)
    print(f"fashion-mnist: distributed_acc={dist['accuracy']:.4f} single_acc={single['accuracy']:.4f} "
          f"torch_muon_acc={torch_acc} torch_muon_steps={torch_steps} max_abs_param_diff={max_diff:g} "
          f"max_rel_loss_diff={max_rel:g} ranks={args.nproc} "
          f"layout={'fsdp2' if dist.get('fsdp2') else args.layout} torch={torch.__version__} "
          f"s_per_epoch distributed={mean(dist['epoch_s']):.2f} single={mean(single['epoch_s']):.2f} "
          f"torch_muon={torch_s} wall_s={time.perf_counter() - start:.1f}", flush=True)
    # Rank-order gradient sums: the same bits as one process (1e-5 leaves
    # room for nothing but printing); gloo's reduce-scatter order instead
    # (FSDP2 without set_custom_reduce_scatter): rounding differences that
    # training amplifies, bounded loosely.
    bound = 1e-5 if dist.get("rank_order", True) else 1e-3
    if len(dist["losses"]) != len(single["losses"]) or max_rel > bound:
        raise SystemExit("fashion-mnist: the distributed and single-process loss curves disagree")


def cuda_job(args, data, start):
    """One process on cuda:0: muonrt.Muon, then torch_muon, on CUDA
    tensors, one micro-batch per step; fails when muonrt.Muon's loss is
    not finite or its accuracy falls more than CUDA_ACC_BOUND below
    torch.optim.Muon's (when that ran all its steps)."""
    reference = "torch.optim.Muon" if hasattr(torch.optim, "Muon") else \
        "a PyTorch-ops Muon (this PyTorch has no torch.optim.Muon)"
    print(f"fashion-mnist: torch {torch.__version__}, Python {sys.version.split()[0]}, "
          f"{torch.cuda.get_device_name(0)}; one process on cuda:0, muonrt.Muon next "
          f"to {reference}; no distributed run (several ranks with CUDA parameters "
          f"are not supported yet; --nproc {args.nproc} and --layout not used)", flush=True)
    single = train(args, data, 1)
    ref = run_torch_muon(args, data, 1)
    torch_acc, torch_steps, torch_s = torch_muon_fields(ref)
    common = list(zip(single["losses"], ref["losses"])) if ref else []
    max_rel = f"{max(abs(a - b) / max(1e-12, abs(b)) for a, b in common):g}" if common else "skipped"
    torch_ms = f"{statistics.median(ref['step_ms']):.2f}" if common else "skipped"
    print(f"fashion-mnist: distributed_acc=skipped single_acc={single['accuracy']:.4f} "
          f"torch_muon_acc={torch_acc} torch_muon_steps={torch_steps} "
          f"max_rel_loss_diff_vs_torch_muon={max_rel} ranks=1 device=cuda:0 "
          f"torch={torch.__version__} single_ms_per_step={statistics.median(single['step_ms']):.2f} "
          f"torch_muon_ms_per_step={torch_ms} s_per_epoch single={mean(single['epoch_s']):.2f} "
          f"torch_muon={torch_s} wall_s={time.perf_counter() - start:.1f}", flush=True)
    check_cuda_result(single, ref)


def check_cuda_result(single, ref):
    """Exits when muonrt.Muon's loss is not finite, or when its accuracy
    falls more than CUDA_ACC_BOUND below torch_muon's full run."""
    bad = next((i for i, v in enumerate(single["losses"]) if not math.isfinite(v)), None)
    if bad is not None:
        raise SystemExit(f"fashion-mnist: --device cuda: muonrt.Muon's loss is "
                         f"{single['losses'][bad]} at step {bad + 1}")
    if not ref or ref["steps"] < ref["planned"]:
        print("fashion-mnist: --device cuda: the accuracy check against "
              "torch.optim.Muon is skipped (it was skipped or stopped early; "
              "--torch-muon-full runs it to the end)", flush=True)
        return
    if single["accuracy"] < ref["accuracy"] - CUDA_ACC_BOUND:
        raise SystemExit(f"fashion-mnist: --device cuda: muonrt.Muon's test accuracy "
                         f"{single['accuracy']:.4f} is more than {CUDA_ACC_BOUND} below "
                         f"torch.optim.Muon's {ref['accuracy']:.4f}")


def launcher_main(args):
    check_launcher_args(args)
    start = time.perf_counter()
    torch.set_num_threads(1)
    data = tuple(t.to(torch_device(args)) for t in load_data(args))
    runs = f"distributed run: muonrun --nproc-per-node {args.nproc}, layout {args.layout}" \
        if args.device == "cpu" else "device cuda:0"
    print(f"fashion-mnist: {len(data[0])} train / {len(data[2])} test images, "
          f"MLP 784-{args.hidden}-{args.hidden}-10 (PyTorch), muonrt.Muon lr={args.lr}"
          f"{' normuon' if args.normuon else ''}, "
          f"{args.epochs} epochs, batch {args.batch_size}; {runs}", flush=True)
    if args.device == "cuda":
        cuda_job(args, data, start)
    else:
        cpu_job(args, data, start)


def main():
    args = parse_args()
    if args.worker:
        worker_main(args)
    else:
        launcher_main(args)


if __name__ == "__main__":
    main()

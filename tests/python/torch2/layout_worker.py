"""One rank of a real PyTorch 2.x layout stepped by muonrt.Muon
(tests/python/torch2/test_layouts.py starts 4 of them).

    layout_worker.py LAYOUT STEPS OUT_DIR [DEVICE]   (RANK, WORLD_SIZE,
                                           MASTER_ADDR, MASTER_PORT set)

Builds the model of LAYOUT, shards it with PyTorch's own APIs (fully_shard,
parallelize_module, distribute_tensor) on a DeviceMesh over gloo, gives
every parameter the gradient that `gradients()` defines for the whole
tensor (distributed with the parameter's own placements, as backward would
leave it), steps muonrt.Muon (which reads mesh, placements and global
shapes from the DTensors alone), and on rank 0 saves the full parameters
(full_tensor()) to OUT_DIR/result.pt. The same module's `reference()` runs
the same steps on whole tensors in one process.

DEVICE "cuda" (default "cpu"): every rank's parameters on cuda:0, the
ranks sharing that GPU over Gloo (muonrt stages each exchange through host
memory), Newton-Schulz in fp32 (gpu_precision="fp32") so that the result
is bitwise the single-device GPU run. The test lays out and gathers the
CUDA shards itself (local_box), since torch's Gloo backend scatters and
gathers host tensors only.
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))

LR = 0.02


class Net(torch.nn.Module):
    """Two linears without bias: [130, 48] (uneven rows over 4) and
    [48, 130]; plus [2, 16] (empty shards over 4)."""

    def __init__(self):
        super().__init__()
        self.l0 = torch.nn.Linear(48, 130, bias=False)
        self.l1 = torch.nn.Linear(130, 48, bias=False)
        self.tiny = torch.nn.Linear(16, 2, bias=False)


def initial():
    g = torch.Generator().manual_seed(0)
    return {"l0.weight": torch.randn(130, 48, generator=g) * 0.05,
            "l1.weight": torch.randn(48, 130, generator=g) * 0.05,
            "tiny.weight": torch.randn(2, 16, generator=g) * 0.05,
            "experts": torch.randn(4, 24, 16, generator=g) * 0.05}


def gradients(step):
    g = torch.Generator().manual_seed(1000 + step)
    return {n: torch.randn(t.shape, generator=g)
            for n, t in initial().items()}


def names(layout):
    if layout == "ep":
        return ["experts"]
    if layout in ("tp", "fsdp_tp"):
        return ["l0.weight", "l1.weight"]
    return ["l0.weight", "l1.weight", "tiny.weight"]


def build(layout, mesh, device="cpu"):
    """The layout's parameters as DTensors: name -> nn.Parameter."""
    from torch.distributed.tensor import Shard, distribute_tensor
    init = initial()
    if layout == "ep":
        if device == "cpu":
            t = distribute_tensor(init["experts"], mesh, [Shard(0)])
        else:
            t = from_box(init["experts"].to(device), mesh, [Shard(0)])
        return {"experts": torch.nn.Parameter(t)}
    net = Net().to(device)
    with torch.no_grad():
        for n, p in net.named_parameters():
            p.copy_(init[n])
    if layout in ("tp", "fsdp_tp"):
        del net.tiny
        from torch.distributed.tensor.parallel import (
            ColwiseParallel, RowwiseParallel, parallelize_module)
        tp_mesh = mesh["tp"] if layout == "fsdp_tp" else mesh
        styles = {"l0": ColwiseParallel(), "l1": RowwiseParallel()}
        if device != "cpu":
            for style in styles.values():
                style.src_data_rank = None  # each rank cuts its own shard
        parallelize_module(net, tp_mesh, styles)
    if layout in ("fsdp", "hsdp", "fsdp_tp"):
        from torch.distributed.fsdp import fully_shard
        dp_mesh = mesh["dp"] if layout == "fsdp_tp" else mesh
        for m in (net.l0, net.l1):
            fully_shard(m, mesh=dp_mesh)
        fully_shard(net, mesh=dp_mesh)
    return dict(net.named_parameters())


def local_box(shape, mesh, placements):
    """The slices of the global tensor this rank holds, as FSDP2 and
    parallelize_module lay them out: Shard(d) chunks (torch.chunk) in mesh
    order, then _StridedShard(d) chunks what the later mesh dims left
    (FSDP2 over TP). torch's distribute_tensor / full_tensor refuse uneven
    _StridedShard, so the test lays gradients out and gathers results
    itself with this."""
    coord = mesh.get_coordinate()
    box = [(0, n) for n in shape]
    strided = [i for i, p in enumerate(placements)
               if type(p).__name__ == "_StridedShard"]
    order = [i for i in range(len(placements)) if i not in strided] + strided
    for i in order:
        p = placements[i]
        if not hasattr(p, "dim") or type(p).__name__ == "Replicate":
            continue
        begin, end = box[p.dim]
        idx = torch.arange(begin, end)
        chunks = torch.chunk(idx, mesh.size(i))
        c = coord[i]
        if c < len(chunks) and len(chunks[c]):
            box[p.dim] = (int(chunks[c][0]), int(chunks[c][-1]) + 1)
        else:
            box[p.dim] = (end, end)
    return [slice(b, e) for b, e in box]


def strided(p):
    return any(type(q).__name__ == "_StridedShard" for q in p.placements)


def from_box(full, mesh, placements):
    """`full` as a DTensor on `mesh` with `placements`, each rank taking
    its local_box without any collective."""
    from torch.distributed.tensor import DTensor
    local = full[tuple(local_box(full.shape, mesh, placements))]
    return DTensor.from_local(local.contiguous(), mesh, placements,
                              run_check=False, shape=full.shape,
                              stride=full.stride())


def set_grad(p, full):
    from torch.distributed.tensor import distribute_tensor
    if strided(p) or p.device.type != "cpu":
        p.grad = from_box(full.to(p.device), p.device_mesh, p.placements)
        return
    p.grad = distribute_tensor(full, p.device_mesh, p.placements)


def gather_full(p):
    """p's global value on every rank, on the host (all_gather_object of
    each rank's box and local shard where full_tensor() refuses the
    layout or the shards are on a GPU)."""
    import torch.distributed as dist
    if not strided(p) and p.device.type == "cpu":
        return p.full_tensor().detach().clone()
    box = local_box(p.shape, p.device_mesh, p.placements)
    pieces = [None] * dist.get_world_size()
    dist.all_gather_object(pieces, (box, p.to_local().detach().cpu()))
    full = torch.empty(p.shape)
    for b, t in pieces:
        full[tuple(b)] = t
    return full


def make_mesh(layout, device="cpu"):
    from torch.distributed.device_mesh import init_device_mesh
    shapes = {"fsdp": ((4,), ("dp",)), "tp": ((4,), ("tp",)),
              "ep": ((4,), ("ep",)),
              "hsdp": ((2, 2), ("replicate", "shard")),
              "fsdp_tp": ((2, 2), ("dp", "tp"))}
    shape, dim_names = shapes[layout]
    return init_device_mesh(device, shape, mesh_dim_names=dim_names)


def optimizer_options(layout, device):
    return dict(lr=LR,
                expert_stacks=["experts"] if layout == "ep" else (),
                gpu_precision="fp32" if device != "cpu" else None)


def main():
    layout, steps, out_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    device = sys.argv[4] if len(sys.argv) > 4 else "cpu"
    import torch.distributed as dist
    import muonrt
    if device != "cpu":
        # Every rank on cuda:0. CUDA initialized first, so that DeviceMesh
        # keeps this device instead of taking LOCAL_RANK's.
        torch.cuda.set_device(0)
        torch.zeros(1, device=device)
    dist.init_process_group("gloo")
    pg = muonrt.init_process_group(backend="gloo", timeout=120)
    mesh = make_mesh(layout, device)
    params = build(layout, mesh, device)
    assert sorted(params) == sorted(names(layout)), sorted(params)
    init = initial()
    for n, p in params.items():
        print(f"rank {dist.get_rank()}: {n} {tuple(p.shape)} "
              f"{p.placements} local {tuple(p.to_local().shape)}",
              flush=True)
        # The box this test (and muonrt) assumes is what PyTorch holds: the
        # initial weights' slice.
        box = tuple(local_box(p.shape, p.device_mesh, p.placements))
        assert p.device.type == torch.device(device).type, (n, p.device)
        assert torch.equal(p.to_local().cpu(), init[n][box]), \
            f"{n}: PyTorch's local shard is not the box {box}"
    opt = muonrt.Muon(list(params.items()),
                      **optimizer_options(layout, device))
    for step in range(steps):
        full = gradients(step)
        for n, p in params.items():
            set_grad(p, full[n])
        opt.step()
    result = {n: gather_full(p) for n, p in params.items()}
    if dist.get_rank() == 0:
        torch.save(result, os.path.join(out_dir, "result.pt"))
    pg.destroy()
    dist.destroy_process_group()


# Threads of the one-process reference (the ranks run 1 or 3).
REFERENCE_THREADS = 2


def reference(layout, steps, optimizer="muonrt", device="cpu"):
    """The same steps on whole tensors in one process (on `device`, host
    results): muonrt.Muon (no process group), or torch.optim.Muon.
    muonrt's reference runs on REFERENCE_THREADS CPU threads, a count no
    rank uses (ranks.RANK_THREADS): the bits must not depend on it."""
    import muonrt
    muonrt.set_compute_threads(REFERENCE_THREADS)
    init = initial()
    params = {n: torch.nn.Parameter(init[n].clone().to(device))
              for n in names(layout)}
    if optimizer == "torch" and layout == "ep":
        # torch.optim.Muon takes 2-D parameters: one per expert slice.
        slices = [torch.nn.Parameter(init["experts"][k].clone())
                  for k in range(init["experts"].shape[0])]
        opt = torch.optim.Muon(slices, lr=LR)
        for step in range(steps):
            g = gradients(step)["experts"]
            for k, p in enumerate(slices):
                p.grad = g[k].clone()
            opt.step()
        return {"experts": torch.stack([p.detach() for p in slices])}
    if optimizer == "torch":
        opt = torch.optim.Muon(list(params.values()), lr=LR)
    else:
        opt = muonrt.Muon(list(params.items()),
                          **optimizer_options(layout, device))
    for step in range(steps):
        full = gradients(step)
        for n, p in params.items():
            p.grad = full[n].clone().to(device)
        opt.step()
    return {n: p.detach().cpu().clone() for n, p in params.items()}


if __name__ == "__main__":
    main()

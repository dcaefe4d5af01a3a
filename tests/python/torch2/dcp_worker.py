"""One rank of a torch.distributed.checkpoint (DCP) round trip of
muonrt.Muon (tests/python/torch2/test_dcp.py starts them).

    dcp_worker.py save LAYOUT CKPT_DIR OUT_DIR
        2 steps, get_optimizer_state_dict + get_model_state_dict, dcp.save,
        then a third step; rank 0 saves the full parameters to
        OUT_DIR/reference.pt.
    dcp_worker.py load LAYOUT CKPT_DIR OUT_DIR
        a fresh model and optimizer in LAYOUT (any world size), dcp.load
        into their state_dicts, set_model_state_dict +
        set_optimizer_state_dict (resharding the momentum DTensors), the
        third step; rank 0 saves the full parameters to OUT_DIR/resumed.pt.
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set.)
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import layout_worker  # noqa: E402

NAMES = ("l0.weight", "l1.weight")


def build(layout, mesh):
    """Net without its tiny layer, sharded as LAYOUT (fsdp, tp, or fsdp_tp:
    FSDP2 over TP on a (dp, tp) mesh)."""
    net = layout_worker.Net()
    del net.tiny
    init = layout_worker.initial()
    with torch.no_grad():
        for n, p in net.named_parameters():
            p.copy_(init[n])
    if layout in ("tp", "fsdp_tp"):
        from torch.distributed.tensor.parallel import (
            ColwiseParallel, RowwiseParallel, parallelize_module)
        parallelize_module(net, mesh["tp"] if layout == "fsdp_tp" else mesh,
                           {"l0": ColwiseParallel(), "l1": RowwiseParallel()})
    if layout in ("fsdp", "fsdp_tp"):
        from torch.distributed.fsdp import fully_shard
        dp = mesh["dp"] if layout == "fsdp_tp" else mesh
        for m in (net.l0, net.l1):
            fully_shard(m, mesh=dp)
        fully_shard(net, mesh=dp)
    return net


def step(net, opt, k):
    full = layout_worker.gradients(k)
    for n, p in net.named_parameters():
        layout_worker.set_grad(p, full[n])
    opt.step()


def main():
    mode, layout, ckpt, out = sys.argv[1:5]
    normuon = sys.argv[5:] == ["normuon"]  # NorMuon's row state too
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict, get_optimizer_state_dict, set_model_state_dict,
        set_optimizer_state_dict)
    from torch.distributed.device_mesh import init_device_mesh
    import muonrt
    dist.init_process_group("gloo")
    pg = muonrt.init_process_group(timeout=120)
    world = dist.get_world_size()
    if layout == "fsdp_tp":
        mesh = init_device_mesh("cpu", (world // 2, 2),
                                mesh_dim_names=("dp", "tp"))
    else:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=(
            "tp" if layout == "tp" else "dp",))
    net = build(layout, mesh)
    opt = muonrt.Muon(list(net.named_parameters()), lr=layout_worker.LR,
                      normuon=normuon)
    if mode == "save":
        step(net, opt, 0)
        step(net, opt, 1)
        dcp.save({"model": get_model_state_dict(net),
                  "optim": get_optimizer_state_dict(net, opt)},
                 checkpoint_id=ckpt)
        step(net, opt, 2)
        name = "reference.pt"
    else:
        sd = {"model": get_model_state_dict(net),
              "optim": get_optimizer_state_dict(net, opt)}
        dcp.load(sd, checkpoint_id=ckpt)
        set_model_state_dict(net, sd["model"])
        set_optimizer_state_dict(net, opt, sd["optim"])
        assert opt.step_count == 2, opt.step_count
        step(net, opt, 2)
        name = "resumed.pt"
    result = {n: layout_worker.gather_full(p)
              for n, p in net.named_parameters()}
    momentum = {n: layout_worker.gather_full(opt.state[p]["momentum_buffer"])
                for n, p in net.named_parameters()}
    if dist.get_rank() == 0:
        torch.save({"params": result, "momentum": momentum},
                   os.path.join(out, name))
    pg.destroy()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""A rank under real torchrun (tests/python/torch2/test_torchrun.py):
FSDP2 over the ranks torchrun started, muonrt.Muon over the DTensors for
two steps; rank 0 writes the full parameters to argv[1]/result.pt."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import layout_worker  # noqa: E402


def main():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    import muonrt
    dist.init_process_group("gloo")
    pg = muonrt.init_process_group(timeout=120)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),),
                            mesh_dim_names=("dp",))
    net = layout_worker.Net()
    init = layout_worker.initial()
    with torch.no_grad():
        for n, p in net.named_parameters():
            p.copy_(init[n])
    for m in (net.l0, net.l1, net.tiny):
        fully_shard(m, mesh=mesh)
    fully_shard(net, mesh=mesh)
    opt = muonrt.Muon(list(net.named_parameters()), lr=layout_worker.LR)
    for k in range(2):
        full = layout_worker.gradients(k)
        for n, p in net.named_parameters():
            layout_worker.set_grad(p, full[n])
        opt.step()
    result = {n: layout_worker.gather_full(p) for n, p in net.named_parameters()}
    if dist.get_rank() == 0:
        torch.save(result, os.path.join(sys.argv[1], "result.pt"))
    pg.destroy()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

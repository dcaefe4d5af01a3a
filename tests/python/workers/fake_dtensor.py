"""Stand-ins for torch 2.x's DTensor, DeviceMesh, Shard and Replicate,
with the attributes muonrt reads (duck typing): a parameter of the global
shape with ``placements``, ``device_mesh``, ``to_local()`` and
``_local_tensor`` (the shard the library reads and writes). Debian's torch
1.13 has no DTensor; these let the same code path run here.

Their reprs are torch 2.x's: Shard(dim=0), Replicate()."""
import torch


class Shard:
    def __init__(self, dim):
        self.dim = dim

    def __repr__(self):
        return f"Shard(dim={self.dim})"


class Replicate:
    def __repr__(self):
        return "Replicate()"


class Partial:
    def __repr__(self):
        return "Partial(sum)"


class DeviceMesh:
    def __init__(self, names, sizes):
        n = 1
        for s in sizes:
            n *= s
        self.mesh = torch.arange(n).reshape(*sizes)
        self.mesh_dim_names = tuple(names)


def _attach(t, local, mesh, placements):
    t._local_tensor = local
    t.device_mesh = mesh
    t.placements = tuple(placements)
    t.to_local = lambda: local
    return t


def dtensor_parameter(local, global_shape, mesh, placements):
    """A Parameter of `global_shape` whose data this rank holds in `local`
    (kept as is: the optimizer writes it in place)."""
    p = torch.nn.Parameter(torch.zeros(global_shape, dtype=local.dtype))
    return _attach(p, local, mesh, placements)


def dtensor_grad(local, global_shape, mesh, placements):
    return _attach(torch.zeros(global_shape, dtype=local.dtype), local, mesh,
                   placements)

"""DTensor parameters (torch 2.x), duck-typed: mesh, placements (torch's
Shard(dim=0) spelling) and global shapes are read from the parameter, the
local tensor is what the library reads and writes. Debian's torch 1.13 has
no DTensor, so these use workers/fake_dtensor.py's stand-ins with the same
attributes; where torch.distributed.tensor exists, its classes' reprs are
checked too."""
import os
import sys

import pytest
import torch

import muonrt
from muon_reference import ReferenceMuon

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "workers"))
import fake_dtensor as fd  # noqa: E402

pytestmark = pytest.mark.usefixtures("lib")


def test_placement_spellings():
    assert muonrt.normalize_placement("Shard(0)") == "Shard(0)"
    assert muonrt.normalize_placement("Shard(dim=1)") == "Shard(1)"
    assert muonrt.normalize_placement(fd.Shard(2)) == "Shard(2)"
    assert muonrt.normalize_placement(fd.Replicate()) == "Replicate()"
    assert muonrt.normalize_placement(muonrt.Shard(0)) == "Shard(0)"
    assert muonrt.normalize_placement(muonrt.Replicate()) == "Replicate()"
    assert muonrt.Shard(1) == fd.Shard(1) and muonrt.Replicate() == "Replicate()"
    assert muonrt.Shard(1) != "Partial()"
    with pytest.raises(ValueError, match="Partial"):
        muonrt.normalize_placement(fd.Partial())
    assert muonrt.normalize_placement("_StridedShard(dim=0, sf=2)") == \
        "_StridedShard(dim=0, sf=2)"
    with pytest.raises(ValueError, match="not supported"):
        muonrt.normalize_placement("Strided(0)")


def test_torch_placement_classes_if_present():
    try:
        from torch.distributed.tensor import Replicate, Shard
    except ImportError:
        try:
            from torch.distributed._tensor import Replicate, Shard
        except ImportError:
            pytest.skip("this torch has no DTensor placements")
    assert muonrt.normalize_placement(Shard(0)) == "Shard(0)"
    assert muonrt.normalize_placement(Replicate()) == "Replicate()"


def test_mesh_from_device_mesh():
    m = muonrt.Mesh.from_device_mesh(fd.DeviceMesh(["dp", "tp"], [2, 3]))
    assert m == muonrt.Mesh(["dp", "tp"], [2, 3]) and m.size() == 6
    assert m.size("tp") == 3 and m.ndim == 2


def test_single_process_dtensor_params_step_their_local_tensors():
    g = torch.Generator().manual_seed(0)
    shapes = {"a": (12, 6), "b": (5, 9)}
    mesh = fd.DeviceMesh(["dp_shard"], [1])
    init = {n: torch.randn(s, generator=g) for n, s in shapes.items()}
    grads = [{n: torch.randn(s, generator=g) for n, s in shapes.items()}
             for _ in range(3)]
    locals_ = {n: w.clone() for n, w in init.items()}
    params = {n: fd.dtensor_parameter(locals_[n], shapes[n], mesh,
                                      [fd.Shard(0)])
              for n in shapes}
    opt = muonrt.Muon(list(params.items()), lr=0.02)
    assert opt.mesh == muonrt.Mesh(["dp_shard"], [1])
    sd = opt.state_dict()
    assert sd["muonrt"]["placements"] == [["Shard(0)"], ["Shard(0)"]]
    ref_params = [w.clone() for w in init.values()]
    ref = ReferenceMuon(ref_params, lr=0.02)
    for k in range(3):
        for n, p in params.items():
            p.grad = fd.dtensor_grad(grads[k][n].clone(), shapes[n], mesh,
                                     [fd.Shard(0)])
        opt.step()
        ref.step([grads[k][n] for n in shapes])
    for (n, p), r in zip(params.items(), ref_params):
        assert torch.count_nonzero(p.detach()) == 0  # the outer is untouched
        diff = (locals_[n] - r).abs().max().item()
        assert diff <= 1e-5 * r.abs().max().item(), n


def test_dtensor_errors():
    m1 = fd.DeviceMesh(["dp_shard"], [1])
    m2 = fd.DeviceMesh(["tp"], [1])
    a = fd.dtensor_parameter(torch.randn(4, 4), (4, 4), m1, [fd.Shard(0)])
    b = fd.dtensor_parameter(torch.randn(4, 4), (4, 4), m2, [fd.Shard(0)])
    with pytest.raises(ValueError, match="different meshes"):
        muonrt.Muon([("a", a), ("b", b)])
    with pytest.raises(ValueError, match=r"mesh=Mesh\(\['x'\], \[1\]\) but DTensor"):
        muonrt.Muon([("a", a)], mesh=muonrt.Mesh(["x"], [1]))
    c = fd.dtensor_parameter(torch.randn(4, 4), (4, 4), m1, [fd.Partial()])
    with pytest.raises(ValueError, match=r"parameter 'c': .*Partial"):
        muonrt.Muon([("c", c)])
    opt = muonrt.Muon([("a", a)])
    a.grad = fd.dtensor_grad(torch.randn(4, 4), (4, 4), m1, [fd.Replicate()])
    with pytest.raises(RuntimeError, match=r"gradient of 'a' has placements \['Replicate\(\)'\]"):
        opt.step()
    big = fd.DeviceMesh(["dp_shard"], [2])
    d = fd.dtensor_parameter(torch.randn(2, 4), (4, 4), big, [fd.Shard(0)])
    with pytest.raises(ValueError, match="no process group"):
        muonrt.Muon([("d", d)])

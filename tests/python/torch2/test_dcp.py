"""Checkpoints the way PyTorch users take them: muonrt.Muon's state_dict
holds each momentum buffer as a DTensor with its parameter's mesh and
placements, so torch.distributed.checkpoint (get_optimizer_state_dict,
dcp.save, dcp.load, set_optimizer_state_dict) saves it on 4 FSDP2 ranks
and loads it into another world size or layout, and the resumed step is
bitwise the uninterrupted one (dcp_worker.py). And a torch.optim.Muon
state_dict loads into muonrt.Muon and back."""
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from ranks import run_ranks  # noqa: E402

import muonrt  # noqa: E402


def run(world, mode, layout, ckpt, out, extra=()):
    results = run_ranks(world, [os.path.join(HERE, "dcp_worker.py"), mode,
                                layout, str(ckpt), str(out), *extra],
                        job_id=f"dcp-{mode}-{layout}-{world}")
    for rank, (rc, text) in enumerate(results):
        assert rc == 0, f"{mode} {layout} rank {rank} exit {rc}:\n{text}"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("dcp")
    run(4, "save", "fsdp", d / "ckpt", d)
    return d


@pytest.mark.parametrize("world, layout", [(2, "fsdp"), (4, "tp"),
                                           (4, "fsdp_tp"), (4, "fsdp")])
def test_dcp_fsdp2_on_4_ranks_resumes_bitwise_in_other_layout(saved, world,
                                                              layout,
                                                              tmp_path):
    run(world, "load", layout, saved / "ckpt", tmp_path)
    ref = torch.load(saved / "reference.pt")
    got = torch.load(tmp_path / "resumed.pt")
    for n in ref["params"]:
        assert torch.equal(got["params"][n], ref["params"][n]), n
        assert torch.equal(got["momentum"][n], ref["momentum"][n]), n


@pytest.fixture(scope="module")
def saved_normuon(tmp_path_factory):
    d = tmp_path_factory.mktemp("dcp_normuon")
    run(4, "save", "fsdp", d / "ckpt", d, ["normuon"])
    return d


@pytest.mark.parametrize("world, layout", [(2, "fsdp"), (4, "tp")])
def test_dcp_normuon_row_state_resumes_bitwise_in_other_layout(
        saved_normuon, world, layout, tmp_path):
    """NorMuon's "variance_neuron" ([rows, 1] DTensors, a Shard of the
    columns made Replicate()) goes through torch.distributed.checkpoint
    with the momentum: the resumed step is the uninterrupted one's bits."""
    run(world, "load", layout, saved_normuon / "ckpt", tmp_path, ["normuon"])
    ref = torch.load(saved_normuon / "reference.pt")
    got = torch.load(tmp_path / "resumed.pt")
    for n in ref["params"]:
        assert torch.equal(got["params"][n], ref["params"][n]), n
        assert torch.equal(got["momentum"][n], ref["momentum"][n]), n


def test_torch_optim_muon_state_dict_into_muonrt_and_back():
    g = torch.Generator().manual_seed(3)
    init = torch.randn(24, 16, generator=g)
    grads = [torch.randn(24, 16, generator=g) for _ in range(3)]
    wt = torch.nn.Parameter(init.clone())
    theirs = torch.optim.Muon([wt], lr=0.02)
    for k in range(2):
        wt.grad = grads[k].clone()
        theirs.step()
    wm = torch.nn.Parameter(wt.detach().clone())
    ours = muonrt.Muon([("w", wm)], lr=0.02)
    ours.load_state_dict(theirs.state_dict())
    assert torch.equal(ours.momentum_buffer(0),
                       theirs.state[wt]["momentum_buffer"])
    # One more step each: the momentum (elementwise, ATen's lerp formula)
    # stays within 2 float32 roundings of its operands (torch's vectorized
    # CPU lerp may fuse the multiply-add, ours rounds each operation); then
    # ours goes back into a fresh torch.optim.Muon.
    prev = theirs.state[wt]["momentum_buffer"].clone()
    wt.grad = grads[2].clone()
    wm.grad = grads[2].clone()
    theirs.step()
    ours.step()
    a, b = ours.momentum_buffer(0), theirs.state[wt]["momentum_buffer"]
    bound = 2 * torch.finfo(torch.float32).eps * (prev.abs() + grads[2].abs())
    assert ((a - b).abs() <= bound).all(), (a - b).abs().max()
    w2 = torch.nn.Parameter(wm.detach().clone())
    back = torch.optim.Muon([w2], lr=0.02)
    back.load_state_dict(ours.state_dict())
    assert torch.equal(back.state[w2]["momentum_buffer"],
                       ours.momentum_buffer(0))


def test_state_dict_hooks_run_as_torch_optimizer_runs_them():
    """register_state_dict_pre_hook / _post_hook and
    register_load_state_dict_pre_hook / _post_hook (PyTorch 2.1+): each
    runs once, in torch.optim.Optimizer's order, and a load pre-hook's
    returned dict is what is loaded."""
    w = torch.nn.Parameter(torch.randn(8, 4, generator=torch.Generator()
                                       .manual_seed(5)))
    opt = muonrt.Muon([("w", w)], lr=0.02)
    w.grad = torch.ones(8, 4)
    opt.step()
    calls = []
    opt.register_state_dict_pre_hook(lambda o: calls.append("pre"))

    def tag(o, sd):
        calls.append("post")
        sd["param_groups"][0]["tag"] = "hooked"
        return sd

    opt.register_state_dict_post_hook(tag)
    sd = opt.state_dict()
    assert calls == ["pre", "post"]
    assert sd["param_groups"][0]["tag"] == "hooked"

    def halve_lr(o, sd):
        calls.append("load_pre")
        groups = [dict(g, lr=g["lr"] / 2) for g in sd["param_groups"]]
        return dict(sd, param_groups=groups)

    opt.register_load_state_dict_pre_hook(halve_lr)
    opt.register_load_state_dict_post_hook(lambda o: calls.append("load_post"))
    opt.load_state_dict(sd)
    assert calls == ["pre", "post", "load_pre", "load_post"]
    assert opt.param_groups[0]["lr"] == 0.01
    assert sd["param_groups"][0]["lr"] == 0.02  # the caller's dict untouched

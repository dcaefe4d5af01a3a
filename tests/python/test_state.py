"""state_dict / load_state_dict (torch.save / torch.load round trips) and
save_checkpoint / load_checkpoint: a resumed run equals the uninterrupted
one bitwise."""
import json

import pytest
import torch

import muonrt
from muon_reference import ReferenceMuon
from test_optimizer import make_problem, params_of

pytestmark = pytest.mark.usefixtures("lib")

STEPS = 6
SPLIT = 3


def run(opt, params, grads, steps):
    for k in steps:
        for n, p in params.items():
            p.grad = grads[k][n].clone()
        opt.step()


def groups_of(params):
    names = list(params)
    return [{"params": [(n, params[n]) for n in names[:2]], "lr": 0.03},
            {"params": [(n, params[n]) for n in names[2:]], "lr": 0.01,
             "weight_decay": 0.0}]


def test_state_dict_structure():
    init, grads = make_problem(seed=20, steps=2)
    params = params_of(init)
    opt = muonrt.Muon(groups_of(params), momentum=0.9)
    run(opt, params, grads, range(2))
    sd = opt.state_dict()
    assert set(sd) == {"state", "param_groups", "muonrt"}
    assert sorted(sd["state"]) == [0, 1, 2, 3]
    for i, n in enumerate(params):
        buf = sd["state"][i]["momentum_buffer"]
        assert buf.dtype == torch.float32 and tuple(buf.shape) == tuple(init[n].shape)
        assert torch.equal(buf, opt.momentum_buffer(n))
    assert [g["params"] for g in sd["param_groups"]] == [[0, 1], [2, 3]]
    assert sd["param_groups"][0]["param_names"] == list(params)[:2]
    assert sd["param_groups"][1]["lr"] == 0.01
    assert sd["param_groups"][0]["momentum"] == 0.9
    meta = sd["muonrt"]
    assert meta["step"] == 2 and meta["rank"] == 0 and meta["world_size"] == 1
    assert meta["names"] == list(params)
    assert meta["global_shapes"] == [list(s.shape) for s in init.values()]
    # A copy: stepping on does not change it.
    before = sd["state"][0]["momentum_buffer"].clone()
    run(opt, params, grads, range(1))
    assert torch.equal(sd["state"][0]["momentum_buffer"], before)


def test_state_dict_round_trip_through_torch_save_continues_bitwise(tmp_path):
    init, grads = make_problem(seed=21, steps=STEPS)
    # Uninterrupted.
    full = params_of(init)
    opt_full = muonrt.Muon(groups_of(full), momentum=0.9)
    run(opt_full, full, grads, range(STEPS))
    # Interrupted at SPLIT: state_dict -> torch.save -> torch.load -> a
    # fresh optimizer over copies of the parameters.
    first = params_of(init)
    opt_first = muonrt.Muon(groups_of(first), momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt_first, step_size=100)
    run(opt_first, first, grads, range(SPLIT))
    path = tmp_path / "opt.pt"
    torch.save({"optimizer": opt_first.state_dict(),
                "model": {n: p.detach().clone() for n, p in first.items()}},
               path)
    del opt_first, sched
    ckpt = torch.load(path)
    resumed = {n: torch.nn.Parameter(w.clone()) for n, w in ckpt["model"].items()}
    opt = muonrt.Muon(groups_of(resumed), momentum=0.9)
    opt.load_state_dict(ckpt["optimizer"])
    assert opt.step_count == SPLIT
    assert opt.param_groups[0]["lr"] == 0.03
    assert opt.param_groups[0]["initial_lr"] == 0.03  # the scheduler's key
    run(opt, resumed, grads, range(SPLIT, STEPS))
    assert opt.step_count == STEPS
    for n in full:
        assert torch.equal(resumed[n].detach(), full[n].detach()), n
        assert torch.equal(opt.momentum_buffer(n), opt_full.momentum_buffer(n)), n


def test_load_state_dict_restores_group_lr():
    init, grads = make_problem(seed=22, steps=1)
    a = params_of(init)
    opt_a = muonrt.Muon(list(a.items()), lr=0.05)
    opt_a.param_groups[0]["lr"] = 0.007
    sd = opt_a.state_dict()
    b = params_of(init)
    opt_b = muonrt.Muon(list(b.items()), lr=0.05)
    opt_b.load_state_dict(sd)
    assert opt_b.param_groups[0]["lr"] == 0.007
    run(opt_a, a, grads, range(1))
    run(opt_b, b, grads, range(1))
    for n in a:
        assert torch.equal(a[n].detach(), b[n].detach())


def test_load_state_dict_mismatches_raise_and_change_nothing():
    init, grads = make_problem(seed=23, steps=1)
    params = params_of(init)
    opt = muonrt.Muon(list(params.items()))
    run(opt, params, grads, range(1))
    sd = opt.state_dict()
    fresh = muonrt.Muon(list(params_of(init).items()))
    bad = dict(sd, state=dict(sd["state"]))
    bad["state"][1] = {"momentum_buffer": torch.zeros(3, 3)}
    with pytest.raises(ValueError, match=r"momentum_buffer of 'w_wide' has size \[3, 3\]"):
        fresh.load_state_dict(bad)
    assert fresh.step_count == 0
    assert torch.count_nonzero(fresh.momentum_buffer(0)) == 0
    renamed = dict(sd, param_groups=[dict(sd["param_groups"][0])])
    renamed["param_groups"][0]["param_names"] = ["x"] + list(params)[1:]
    with pytest.raises(ValueError, match=r"parameter 'x' where this optimizer has 'w_tall'"):
        fresh.load_state_dict(renamed)
    other = muonrt.Muon([("w_tall", torch.nn.Parameter(torch.zeros(48, 24)))])
    with pytest.raises(ValueError, match="doesn't match the size"):
        other.load_state_dict(sd)
    with pytest.raises(ValueError, match="different number of parameter groups"):
        fresh.load_state_dict({"state": {}, "param_groups": []})
    wrong_nesterov = dict(sd, param_groups=[dict(sd["param_groups"][0], nesterov=False)])
    with pytest.raises(ValueError, match="nesterov=False"):
        fresh.load_state_dict(wrong_nesterov)


def test_load_state_dict_refuses_what_it_would_drop_or_misread():
    """What load_state_dict would otherwise drop or misread silently is a
    ValueError naming it, and nothing changes: a NorMuon row state into a
    plain Muon, another optimizer's state key, an integer buffer, a
    "muonrt" entry of other parameters or lacking a field, a group naming
    fewer parameters."""
    init, grads = make_problem(seed=24, steps=1)
    params = params_of(init)
    normuon = muonrt.Muon(list(params.items()), normuon=True)
    run(normuon, params, grads, range(1))
    sd = normuon.state_dict()
    fresh = muonrt.Muon(list(params_of(init).items()))
    with pytest.raises(ValueError, match=r"the state of 'w_tall' holds "
                                         r"\['variance_neuron'\], which "
                                         r"this optimizer \(without a "
                                         r"variant such as normuon\)"):
        fresh.load_state_dict(sd)
    plain = muonrt.Muon(list(params.items()))
    sd = plain.state_dict()

    def edited(**entries):
        bad = dict(sd, state=dict(sd["state"]), muonrt=dict(sd["muonrt"]))
        for key, value in entries.items():
            if key == "state0":
                bad["state"][0] = value
            elif value is None:
                del bad["muonrt"][key]
            else:
                bad["muonrt"][key] = value
        return bad
    adam = {"momentum_buffer": sd["state"][0]["momentum_buffer"],
            "exp_avg": torch.zeros(1)}
    cases = [
        (edited(state0=adam), r"holds \['exp_avg'\]"),
        (edited(state0={"momentum_buffer": torch.zeros(
            sd["state"][0]["momentum_buffer"].shape, dtype=torch.int32)}),
         r"momentum_buffer of 'w_tall' has dtype torch.int32"),
        (edited(names=["a"] + sd["muonrt"]["names"][1:]),
         r"the state_dict's parameters are \['a'"),
        (edited(step=None), r"'muonrt' entry lacks \['step'\]"),
    ]
    short = dict(sd, param_groups=[dict(sd["param_groups"][0])])
    short["param_groups"][0]["param_names"] = \
        sd["param_groups"][0]["param_names"][:-1]
    cases.append((short, r"names \d+ parameters, this optimizer's \d+"))
    for bad, message in cases:
        with pytest.raises(ValueError, match=message):
            fresh.load_state_dict(bad)
        assert fresh.step_count == 0
        assert torch.count_nonzero(fresh.momentum_buffer(0)) == 0


def test_load_state_dict_copies_the_groups_as_torch_does():
    """A tensor lr loaded from another optimizer's state_dict is a copy: a
    scheduler's in-place change on one does not reach the other."""
    init, _ = make_problem(seed=25, steps=1)
    a = muonrt.Muon(list(params_of(init).items()), lr=torch.tensor(0.02))
    b = muonrt.Muon(list(params_of(init).items()), lr=torch.tensor(0.02))
    b.load_state_dict(a.state_dict())
    a.param_groups[0]["lr"].fill_(0.5)
    assert float(b.param_groups[0]["lr"]) == pytest.approx(0.02)


def test_loads_a_torch_optim_muon_style_state_dict():
    """A state_dict in torch.optim.Muon's structure (no "muonrt" entry, state
    only for stepped parameters, bf16 buffers allowed) loads by position."""
    init, grads = make_problem(seed=24, steps=2)
    names = list(init)
    ref_params = [w.clone() for w in init.values()]
    ref = ReferenceMuon(ref_params, lr=0.02)
    ref.step([grads[0][n] for n in names])
    torch_sd = {"state": {i: {"momentum_buffer": ref.buffers[i].clone()}
                          for i in range(3)},  # the 4th never stepped
                "param_groups": [{"lr": 0.02, "weight_decay": 0.1,
                                  "momentum": 0.95, "nesterov": True,
                                  "ns_coefficients": (3.4445, -4.775, 2.0315),
                                  "eps": 1e-7, "ns_steps": 5,
                                  "adjust_lr_fn": None,
                                  "params": [0, 1, 2, 3]}]}
    params = {n: torch.nn.Parameter(w.clone()) for n, w in zip(names, ref_params)}
    opt = muonrt.Muon(list(params.items()), lr=0.02)
    opt.load_state_dict(torch_sd)
    assert opt.step_count == 0
    for i, n in enumerate(names[:3]):
        assert torch.equal(opt.momentum_buffer(n), ref.buffers[i])
    assert torch.count_nonzero(opt.momentum_buffer(names[3])) == 0


def test_save_and_load_checkpoint_continue_bitwise(tmp_path):
    init, grads = make_problem(seed=25, steps=STEPS)
    full = params_of(init)
    opt_full = muonrt.Muon(list(full.items()), lr=0.02)
    run(opt_full, full, grads, range(STEPS))

    first = params_of(init)
    opt_first = muonrt.Muon(list(first.items()), lr=0.02)
    run(opt_first, first, grads, range(SPLIT))
    ckpt = tmp_path / "ckpt"
    opt_first.save_checkpoint(ckpt)
    assert (ckpt / "rank_0.safetensors").is_file()
    meta = json.loads((ckpt / "metadata.json").read_text())
    assert meta  # the library's format (checkpoint/checkpoint.h)
    snapshot = {n: p.detach().clone() for n, p in first.items()}

    resumed = {n: torch.nn.Parameter(w) for n, w in snapshot.items()}
    opt = muonrt.Muon(list(resumed.items()), lr=0.02)
    opt.load_checkpoint(ckpt)
    assert opt.step_count == SPLIT
    run(opt, resumed, grads, range(SPLIT, STEPS))
    for n in full:
        assert torch.equal(resumed[n].detach(), full[n].detach()), n


def test_load_checkpoint_errors(tmp_path):
    init, grads = make_problem(seed=26, steps=1)
    params = params_of(init)
    opt = muonrt.Muon(list(params.items()))
    run(opt, params, grads, range(1))
    with pytest.raises(FileNotFoundError) as e:
        opt.load_checkpoint(tmp_path / "missing")
    assert "missing" in str(e.value)
    opt.save_checkpoint(tmp_path / "ck")
    # A checkpoint without one of this optimizer's parameters.
    other = muonrt.Muon(list(params_of(init).items())
                        + [("extra", torch.nn.Parameter(torch.zeros(3, 3)))])
    with pytest.raises(KeyError) as e:
        other.load_checkpoint(tmp_path / "ck")
    assert isinstance(e.value, muonrt.NotFoundError)
    assert "extra" in str(e.value)
    assert other.step_count == 0
    # Another global shape.
    shaped = muonrt.Muon([("w_tall", torch.nn.Parameter(torch.zeros(24, 48)))])
    with pytest.raises(ValueError, match="w_tall"):
        shaped.load_checkpoint(tmp_path / "ck")
    # A truncated file.
    f = tmp_path / "ck" / "rank_0.safetensors"
    f.write_bytes(f.read_bytes()[:-16])
    fresh = muonrt.Muon(list(params_of(init).items()))
    with pytest.raises(RuntimeError) as e:
        fresh.load_checkpoint(tmp_path / "ck")
    assert e.value.code_name == "DATA_LOSS"
    assert fresh.step_count == 0


def test_single_process_state_dict_mesh_matches_the_library_checkpoint(
        tmp_path):
    """One process: the state_dict's mesh is the library's single-device
    mesh, the one its checkpoints record (muonctl checkpoint inspect)."""
    import json
    w = torch.nn.Parameter(torch.randn(6, 4))
    opt = muonrt.Muon([("w", w)], lr=0.02)
    w.grad = torch.ones(6, 4)
    opt.step()
    mesh = opt.state_dict()["muonrt"]["mesh"]
    assert mesh == {"names": ["dp_shard"], "sizes": [1]}
    opt.save_checkpoint(tmp_path)
    meta = json.load(open(tmp_path / "metadata.json"))
    text = json.dumps(meta)
    assert "dp_shard" in text, text

"""muonrt.Muon single-process numerics vs an independent PyTorch
formulation of torch.optim.Muon (muon_reference.py), zero copy, param
groups and lr schedulers."""
import math

import pytest
import torch

import muonrt
from muon_reference import ReferenceMuon

pytestmark = pytest.mark.usefixtures("lib")

SHAPES = {"w_tall": (48, 24), "w_wide": (20, 36), "w_square": (32, 32),
          "w_uneven": (17, 5)}
STEPS = 4
TOL = 1e-5  # relative to the largest parameter entry


def make_problem(seed=0, dtype=torch.float32, steps=STEPS, shapes=SHAPES):
    g = torch.Generator().manual_seed(seed)
    init = {n: torch.randn(s, generator=g).to(dtype) for n, s in shapes.items()}
    grads = [{n: torch.randn(s, generator=g).to(dtype)
              for n, s in shapes.items()} for _ in range(steps)]
    return init, grads


def params_of(init):
    return {n: torch.nn.Parameter(w.clone()) for n, w in init.items()}


def assert_close(ours, ref, init=None, tol=TOL, what=""):
    ours, ref = ours.double(), ref.double()
    diff = (ours - ref).abs().max().item()
    scale = ref.abs().max().item()
    assert diff <= tol * scale, f"{what}: max|diff| {diff} > {tol} * {scale}"
    if init is not None:
        # The update itself, not only the parameter, agrees (up to a few
        # float32 ulps of the parameter from rounding W - lr' * O).
        upd = (ref - init.double()).abs().max().item()
        assert upd > 0
        ulps = 4 * torch.finfo(torch.float32).eps * scale
        assert diff <= 1e-4 * upd + ulps, \
            f"{what}: {diff} vs update size {upd}"


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("adjust_lr_fn",
                         [None, "original", "match_rms_adamw", "spectral_norm"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_step_matches_reference(nesterov, adjust_lr_fn, weight_decay):
    init, grads = make_problem()
    params = params_of(init)
    lr = 0.02 if adjust_lr_fn != "match_rms_adamw" else 0.002
    kw = dict(lr=lr, weight_decay=weight_decay, momentum=0.9,
              nesterov=nesterov, adjust_lr_fn=adjust_lr_fn)
    opt = muonrt.Muon(list(params.items()), **kw)
    ref_params = [w.clone() for w in init.values()]
    ref = ReferenceMuon(ref_params, **kw)
    for k in range(STEPS):
        for n, p in params.items():
            p.grad = grads[k][n].clone()
        opt.step()
        ref.step([grads[k][n] for n in params])
        for (n, p), r in zip(params.items(), ref_params):
            assert_close(p.detach(), r, init[n], what=f"{n} step {k}")
    for i, n in enumerate(params):
        assert_close(opt.momentum_buffer(n), ref.buffers[i], what=f"{n} buf")
    assert opt.step_count == STEPS


def test_pickle_or_deepcopy_is_refused_pointing_to_state_dict():
    """The optimizer holds the library's buffers and its place in the job:
    a copy would share them. pickle and copy.deepcopy raise TypeError
    naming state_dict(), where torch's would copy the state."""
    import copy
    import pickle
    w = torch.nn.Parameter(torch.randn(4, 4))
    opt = muonrt.Muon([("w", w)])
    with pytest.raises(TypeError, match=r"state_dict\(\)"):
        copy.deepcopy(opt)
    with pytest.raises(TypeError, match=r"cannot be pickled"):
        pickle.dumps(opt)
    w.grad = torch.ones(4, 4)
    opt.step()  # unchanged by the refused copies
    assert opt.step_count == 1
    opt.close()


@pytest.mark.parametrize("overlap", [False, True])
def test_zero_grad_set_to_none_frees_the_gradients_after_a_step(overlap):
    """After step() the optimizer holds no reference to the gradients it
    read (the library only their addresses): zero_grad(set_to_none=True)
    frees them as with torch's optimizers, not at the next step (an extra
    set of gradients held through the next backward). The next step
    binds the new gradients and matches one never interrupted."""
    import copy
    import gc
    import weakref
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8, bias=False),
                                torch.nn.Linear(8, 4, bias=False))
    twin = copy.deepcopy(model)
    x = torch.randn(4, 8)
    opt = muonrt.Muon(list(model.named_parameters()), lr=0.02,
                      overlap_backward=overlap)
    ref_opt = muonrt.Muon(list(twin.named_parameters()), lr=0.02)
    for step in range(2):
        for m, o in ((model, opt), (twin, ref_opt)):
            o.zero_grad(set_to_none=True)
            m(x).sum().backward()
            o.step()
        grads = [weakref.ref(p.grad) for p in model.parameters()]
        opt.zero_grad(set_to_none=True)
        gc.collect()
        assert all(g() is None for g in grads), f"step {step + 1}"
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)
    opt.close()
    ref_opt.close()


def test_step_count_survives_a_state_dict_rebuilt_from_live_group_keys():
    """torch.distributed.checkpoint's flattened optimizer state
    (flatten_optimizer_state_dict=True, torchtitan's) rebuilds each group
    from the keys the live optimizer's groups have. The step count rides
    in every live group as "muonrt_step", so such a round trip keeps it
    (it reset to 0: the key existed only in state_dict())."""
    w = torch.nn.Parameter(torch.randn(4, 4))
    opt = muonrt.Muon([("w", w)])
    for _ in range(3):
        w.grad = torch.randn(4, 4)
        opt.step()
    assert [g["muonrt_step"] for g in opt.param_groups] == [3]
    saved = opt.state_dict()
    w2 = torch.nn.Parameter(w.detach().clone())
    fresh = muonrt.Muon([("w", w2)])
    assert fresh.param_groups[0]["muonrt_step"] == 0
    live_keys = set(fresh.param_groups[0]) - {"params"}
    rebuilt = {"state": saved["state"],
               "param_groups": [dict({k: g[k] for k in live_keys},
                                     params=g["params"])
                                for g in saved["param_groups"]]}
    fresh.load_state_dict(rebuilt)
    assert fresh.step_count == 3
    assert fresh.param_groups[0]["muonrt_step"] == 3
    opt.close()
    fresh.close()


def test_defaults_are_torch_defaults():
    opt = muonrt.Muon([("w", torch.nn.Parameter(torch.zeros(4, 4)))])
    g = opt.param_groups[0]
    assert g["lr"] == 1e-3 and g["weight_decay"] == 0.1
    assert g["momentum"] == 0.95 and g["nesterov"] is True
    assert tuple(g["ns_coefficients"]) == (3.4445, -4.7750, 2.0315)
    assert g["eps"] == 1e-7 and g["ns_steps"] == 5
    assert g["adjust_lr_fn"] is None
    assert g["param_names"] == ["w"]


def check_against_reference(seed, ref_kw=None, **muon_kw):
    """STEPS steps of muonrt.Muon(**muon_kw) and of the float64 reference
    (ReferenceMuon(**ref_kw), default: the same arguments) on one problem;
    every parameter agrees (assert_close)."""
    init, grads = make_problem(seed=seed)
    params = params_of(init)
    opt = muonrt.Muon(list(params.items()), **muon_kw)
    ref_params = [w.clone() for w in init.values()]
    ref = ReferenceMuon(ref_params, **(muon_kw if ref_kw is None else ref_kw))
    for k in range(STEPS):
        for n, p in params.items():
            p.grad = grads[k][n].clone()
        opt.step()
        ref.step([grads[k][n] for n in params])
    for (n, p), r in zip(params.items(), ref_params):
        assert_close(p.detach(), r, init[n], what=n)


def test_default_options_step_matches_reference():
    check_against_reference(seed=3)


def test_gpu_precision_leaves_cpu_parameters_in_fp32_bitwise():
    # CPU parameters run Newton-Schulz in fp32 whatever gpu_precision says.
    g = torch.Generator().manual_seed(11)
    init = torch.randn(24, 16, generator=g)
    grad = torch.randn(24, 16, generator=g)
    out = {}
    for precision in (None, "bf16", "fp32"):
        p = torch.nn.Parameter(init.clone())
        opt = muonrt.Muon([("w", p)], lr=0.02, gpu_precision=precision)
        p.grad = grad.clone()
        opt.step()
        out[precision] = p.detach().clone()
    assert not torch.equal(out[None], init)
    assert torch.equal(out[None], out["bf16"])
    assert torch.equal(out[None], out["fp32"])


def test_custom_ns_coefficients_steps_eps():
    check_against_reference(seed=4, lr=0.01, ns_coefficients=(3.0, -3.2, 1.2),
                            ns_steps=3, eps=1e-6)


def test_bfloat16_parameters_match_reference_within_bf16_rounding():
    init, grads = make_problem(seed=5, dtype=torch.bfloat16)
    params = params_of(init)
    opt = muonrt.Muon(list(params.items()), lr=0.02)
    ref_params = [w.clone() for w in init.values()]
    ref = ReferenceMuon(ref_params, lr=0.02)
    for k in range(STEPS):
        for n, p in params.items():
            p.grad = grads[k][n].clone()
        opt.step()
        ref.step([grads[k][n] for n in params])
    for (n, p), r in zip(params.items(), ref_params):
        assert p.dtype == torch.bfloat16
        # A rounding flip is one bf16 ulp (2^-8 relative) per step.
        diff = (p.detach().float() - r.float()).abs()
        assert (diff <= r.float().abs() * 2 ** -7 * STEPS + 1e-6).all(), n
        # ... and rare: nearly every element is bitwise the reference's.
        assert (diff == 0).float().mean().item() > 0.95, n


def test_zero_copy_in_place_and_grad_read_through_pointer():
    init, grads = make_problem(seed=6, steps=3)
    params = params_of(init)
    ptrs = {n: p.data_ptr() for n, p in params.items()}
    views = {n: p.detach().view(-1) for n, p in params.items()}
    opt = muonrt.Muon(list(params.items()), lr=0.02)
    ref_params = [w.clone() for w in init.values()]
    ref = ReferenceMuon(ref_params, lr=0.02)
    grad_tensors = {n: grads[0][n].clone() for n in params}
    for n, p in params.items():
        p.grad = grad_tensors[n]
    opt.step()
    ref.step([grads[0][n] for n in params])
    # Same tensors, same grads: now change the grad in place (same object,
    # same pointer): the next step must see the new values.
    for n in params:
        grad_tensors[n].copy_(grads[1][n])
    opt.step()
    ref.step([grads[1][n] for n in params])
    # zero_grad(set_to_none=True) then new grad tensors: re-bound.
    opt.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in params.values())
    for n, p in params.items():
        p.grad = grads[2][n].clone()
    opt.step()
    ref.step([grads[2][n] for n in params])
    for (n, p), r in zip(params.items(), ref_params):
        assert p.data_ptr() == ptrs[n], f"{n} moved"
        assert torch.equal(views[n], p.detach().view(-1)), f"{n} not in place"
        assert_close(p.detach(), r, init[n], what=n)


def test_zero_grad_in_place_keeps_pointer_and_zero_grad_step_is_decay_only():
    init, _ = make_problem(seed=7, steps=1)
    params = params_of(init)
    opt = muonrt.Muon(list(params.items()), lr=0.02, weight_decay=0.5)
    for p in params.values():
        p.grad = torch.zeros_like(p)
    opt.step()
    for n, p in params.items():
        # U = 0: Newton-Schulz of zero is zero (eps floor), only decay.
        assert_close(p.detach(), init[n] * (1 - 0.02 * 0.5), what=n)


def test_param_groups_have_their_own_lr_and_weight_decay():
    init, grads = make_problem(seed=8)
    params = params_of(init)
    names = list(params)
    groups = [
        {"params": [(n, params[n]) for n in names[:2]]},
        {"params": [params[n] for n in names[2:]], "param_names": names[2:],
         "lr": 0.05, "weight_decay": 0.0},
    ]
    opt = muonrt.Muon(groups, lr=0.01, weight_decay=0.2)
    assert [g["param_names"] for g in opt.param_groups] == [names[:2],
                                                            names[2:]]
    assert opt.param_names == names
    ref_params = [w.clone() for w in init.values()]
    ref = ReferenceMuon(ref_params)
    lrs = [0.01, 0.01, 0.05, 0.05]
    wds = [0.2, 0.2, 0.0, 0.0]
    for k in range(STEPS):
        for n, p in params.items():
            p.grad = grads[k][n].clone()
        opt.step()
        ref.step([grads[k][n] for n in names], lrs, wds)
    for (n, p), r in zip(params.items(), ref_params):
        assert_close(p.detach(), r, init[n], what=n)


def test_group_hyperparameters_changed_between_steps_apply():
    init, grads = make_problem(seed=9)
    params = params_of(init)
    opt = muonrt.Muon(list(params.items()), lr=0.01, weight_decay=0.1)
    ref_params = [w.clone() for w in init.values()]
    ref = ReferenceMuon(ref_params)
    for k in range(STEPS):
        lr, wd = 0.01 * (k + 1), 0.1 / (k + 1)
        opt.param_groups[0]["lr"] = lr
        opt.param_groups[0]["weight_decay"] = wd
        for n, p in params.items():
            p.grad = grads[k][n].clone()
        opt.step()
        ref.step([grads[k][n] for n in params], [lr] * 4, [wd] * 4)
    for (n, p), r in zip(params.items(), ref_params):
        assert_close(p.detach(), r, init[n], what=n)


def test_step_lr_scheduler_changes_the_effective_lr():
    steps = 6
    init, grads = make_problem(seed=10, steps=steps)
    params = params_of(init)
    opt = muonrt.Muon(list(params.items()), lr=0.04)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    ref_params = [w.clone() for w in init.values()]
    ref = ReferenceMuon(ref_params)
    for k in range(steps):
        lr = 0.04 * 0.5 ** (k // 2)
        assert math.isclose(opt.param_groups[0]["lr"], lr)
        for n, p in params.items():
            p.grad = grads[k][n].clone()
        opt.step()
        sched.step()
        ref.step([grads[k][n] for n in params], [lr] * 4, [0.1] * 4)
    for (n, p), r in zip(params.items(), ref_params):
        assert_close(p.detach(), r, init[n], what=n)
    # A constant-lr run differs: the schedule did change the update.
    const = params_of(init)
    opt2 = muonrt.Muon(list(const.items()), lr=0.04)
    for k in range(steps):
        for n, p in const.items():
            p.grad = grads[k][n].clone()
        opt2.step()
    assert not torch.equal(const["w_tall"].detach(), params["w_tall"].detach())


def test_one_cycle_lr_cycles_lr_and_momentum_per_group_as_torch_reads_them():
    """OneCycleLR (cycle_momentum=True by default) sets each group's lr and
    momentum before every step; torch.optim.Muon reads both there, and so
    does this optimizer. Two groups of their own lr, on one schedule."""
    steps = 5
    init, grads = make_problem(seed=11, steps=steps)
    params = params_of(init)
    names = list(params)
    groups = [{"params": [(n, params[n]) for n in names[:2]]},
              {"params": [(n, params[n]) for n in names[2:]], "lr": 0.01}]
    opt = muonrt.Muon(groups, lr=0.02)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=[0.04, 0.02], total_steps=steps, base_momentum=0.8,
        max_momentum=0.95)
    ref_params = [w.clone() for w in init.values()]
    ref = ReferenceMuon(ref_params)
    seen = set()
    for k in range(steps):
        per_param = [(g["lr"], g["momentum"]) for g in opt.param_groups
                     for _ in g["params"]]
        seen.update(m for _, m in per_param)
        for n, p in params.items():
            p.grad = grads[k][n].clone()
        opt.step()
        sched.step()
        ref.step([grads[k][n] for n in names], [lr for lr, _ in per_param],
                 [0.1] * 4, [m for _, m in per_param])
    assert len(seen) >= 3  # the schedule did move momentum
    for (n, p), r in zip(params.items(), ref_params):
        assert_close(p.detach(), r, init[n], what=n)
    for i, n in enumerate(names):
        assert_close(opt.momentum_buffer(n), ref.buffers[i], what=f"{n} buf")


def test_closure_is_called_and_its_loss_returned():
    w = torch.nn.Parameter(torch.randn(8, 4))
    opt = muonrt.Muon([("w", w)], lr=0.01)
    x = torch.randn(16, 8)

    def closure():
        opt.zero_grad()
        loss = (x @ w).pow(2).mean()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert isinstance(loss, torch.Tensor) and loss.item() > 0
    assert opt.step_count == 1


def test_training_a_small_model_decreases_loss():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32, bias=False),
                                torch.nn.Tanh(),
                                torch.nn.Linear(32, 4, bias=False))
    opt = muonrt.Muon(model.named_parameters(), lr=0.02)
    x = torch.randn(64, 16)
    y = torch.randn(64, 4)
    losses = []
    for _ in range(20):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_unnamed_params_get_positional_names():
    a = torch.nn.Parameter(torch.randn(4, 3))
    b = torch.nn.Parameter(torch.randn(3, 5))
    opt = muonrt.Muon([a, b])
    assert opt.param_names == ["param_0", "param_1"]
    opt2 = muonrt.Muon([{"params": [a]}, {"params": [b], "lr": 0.1}])
    assert opt2.param_names == ["param_0", "param_1"]


def test_plan_assignments_and_stats():
    init, grads = make_problem(seed=11, steps=1)
    params = params_of(init)
    opt = muonrt.Muon(list(params.items()))
    plan = opt.plan()
    assert plan["world_size"] == 1
    assert [m["param"] for m in plan["matrices"]] == list(params)
    assert opt.assignments() == {0: [0, 1, 2, 3]}
    for n, p in params.items():
        p.grad = grads[0][n]
    opt.step()
    st = opt.last_step_stats()
    assert st["step"] == 1
    assert st["matrices_orthogonalized"] == 4
    assert st["ns_flops"] > 0 and st["bytes_sent"] == 0
    assert opt.rank == 0 and opt.world_size == 1
    assert opt.process_group is None


def test_expert_stack_slices_are_separate_matrices():
    """A 3-D [experts, rows, cols] parameter named in expert_stacks: each
    slice is stepped as its own matrix (its own shape for AdjustLR)."""
    g = torch.Generator().manual_seed(12)
    stack0 = torch.randn(3, 12, 5, generator=g)
    grads = [torch.randn(3, 12, 5, generator=g) for _ in range(3)]
    stack = torch.nn.Parameter(stack0.clone())
    opt = muonrt.Muon([("experts.w1", stack)], lr=0.02,
                      expert_stacks=["experts.w1"])
    ref_params = [stack0[e].clone() for e in range(3)]
    ref = ReferenceMuon(ref_params, lr=0.02)
    for k in range(3):
        stack.grad = grads[k].clone()
        opt.step()
        ref.step([grads[k][e] for e in range(3)])
    assert len(opt.plan()["matrices"]) == 3
    for e in range(3):
        assert_close(stack.detach()[e], ref_params[e], stack0[e], what=f"expert {e}")
    with pytest.raises(ValueError, match="must be 3-D"):
        muonrt.Muon([("w", torch.zeros(3, 3))], expert_stacks=["w"])
    with pytest.raises(ValueError, match="unknown parameters"):
        muonrt.Muon([("w", torch.zeros(3, 3))], expert_stacks=["v"])


def test_gram_newton_schulz_method_steps_close_to_reference():
    # ns_method="gram": iterate on the m x m Gram matrix; its error against
    # float64 is ~2e-6 relative (docs/benchmarks.md), within the tolerance of
    # the standard method's check.
    check_against_reference(seed=5, ref_kw={}, ns_method="gram")


def test_auto_newton_schulz_method_steps_close_to_reference():
    # ns_method="auto": Gram for matrices whose long side exceeds twice the
    # short one, the standard method for the others.
    check_against_reference(seed=7, ref_kw={}, ns_method="auto")


def test_unknown_ns_method_is_refused_naming_it():
    init, _ = make_problem(seed=6)
    with pytest.raises(ValueError, match="ns_method"):
        muonrt.Muon(list(params_of(init).items()), ns_method="bogus")



@pytest.mark.parametrize("nesterov, beta2, adjust_lr_fn", [
    (True, 0.95, None), (False, 0.5, "match_rms_adamw"),
    (True, 0.95, "spectral_norm")])
def test_normuon_step_matches_float64_reference(nesterov, beta2,
                                                adjust_lr_fn):
    """normuon=True against the float64 reference (NorMuon from arXiv
    2510.05491 and microsoft/dion's normuon.py): every parameter within
    assert_close's bounds after every step, the row state within 1e-4 of
    its largest entry."""
    init, grads = make_problem(seed=8)
    params = params_of(init)
    lr = 0.02 if adjust_lr_fn != "match_rms_adamw" else 0.002
    kw = dict(lr=lr, weight_decay=0.1, momentum=0.9, nesterov=nesterov,
              adjust_lr_fn=adjust_lr_fn, normuon=True, normuon_beta2=beta2)
    opt = muonrt.Muon(list(params.items()), **kw)
    ref_params = [w.clone().double() for w in init.values()]
    ref = ReferenceMuon(ref_params, dtype=torch.float64, **kw)
    for k in range(STEPS):
        for n, p in params.items():
            p.grad = grads[k][n].clone()
        opt.step()
        ref.step([grads[k][n] for n in params])
        for (n, p), r in zip(params.items(), ref_params):
            assert_close(p.detach(), r, init[n], what=f"{n} step {k}")
    for i, n in enumerate(params):
        v = opt.variance_neuron(n)
        assert v.shape == (SHAPES[n][0], 1)
        assert_close(v, ref.variances[i], tol=1e-4, what=f"{n} variance")


def test_normuon_state_dict_carries_row_state():
    """state_dict()["state"][i]["variance_neuron"] ([rows, 1]) restores with
    load_state_dict: a copy of the optimizer continues bitwise; with the
    row state zeroed it does not."""
    init, grads = make_problem(seed=9)
    params = params_of(init)
    opt = muonrt.Muon(list(params.items()), lr=0.02, normuon=True)
    for k in range(2):
        for n, p in params.items():
            p.grad = grads[k][n].clone()
        opt.step()
    sd = opt.state_dict()
    assert sd["state"][0]["variance_neuron"].shape == (48, 1)
    results = []
    for zero in (False, True):
        copy = {n: torch.nn.Parameter(p.detach().clone())
                for n, p in params.items()}
        opt2 = muonrt.Muon(list(copy.items()), lr=0.02, normuon=True)
        sd2 = {"state": {i: dict(st) for i, st in sd["state"].items()},
               "param_groups": sd["param_groups"], "muonrt": sd["muonrt"]}
        if zero:
            for st in sd2["state"].values():
                st["variance_neuron"] = torch.zeros_like(
                    st["variance_neuron"])
        opt2.load_state_dict(sd2)
        for n, p in copy.items():
            p.grad = grads[2][n].clone()
        opt2.step()
        results.append({n: p.detach().clone() for n, p in copy.items()})
    for n, p in params.items():
        p.grad = grads[2][n].clone()
    opt.step()
    for n, p in params.items():
        assert torch.equal(results[0][n], p.detach()), n
    assert any(not torch.equal(results[1][n], p.detach())
               for n, p in params.items())


@pytest.mark.parametrize("normuon", [False, True])
def test_row_blocks_match_float64_reference_of_the_blocks(normuon):
    """row_splits (a fused q | k | v) and num_heads (per-head): each block
    is orthogonalized as its own matrix with its own AdjustLR shape (and
    NorMuon's rescale), against the float64 reference run on the blocks as
    separate tensors."""
    shapes = {"wqkv": (48, 24), "wo": (24, 24)}
    splits = {"wqkv": [24, 12, 12], "wo": [6, 6, 6, 6]}
    init, grads = make_problem(seed=11, shapes=shapes)
    params = params_of(init)
    kw = dict(lr=0.02, weight_decay=0.1, momentum=0.9,
              adjust_lr_fn="spectral_norm", normuon=normuon)
    opt = muonrt.Muon(list(params.items()), row_splits={"wqkv": [24, 12, 12]},
                      num_heads={"wo": 4}, **kw)
    blocks = {n: list(init[n].split(splits[n])) for n in shapes}
    ref_params = [b.clone().double() for n in shapes for b in blocks[n]]
    ref = ReferenceMuon(ref_params, dtype=torch.float64, **kw)
    for k in range(STEPS):
        for n, p in params.items():
            p.grad = grads[k][n].clone()
        opt.step()
        ref.step([g for n in shapes for g in grads[k][n].split(splits[n])])
    i = 0
    for n, p in params.items():
        got = p.detach().split(splits[n])
        for b, init_b in enumerate(blocks[n]):
            assert_close(got[b], ref_params[i], init_b, what=f"{n} block {b}")
            i += 1
    assert opt.last_step_stats()["matrices_orthogonalized"] == 7


def test_row_blocks_bad_splits_are_refused():
    w = torch.nn.Parameter(torch.randn(12, 4))
    with pytest.raises(ValueError, match="sum to 10 rows but the parameter "
                                         "has 12"):
        muonrt.Muon([("w", w)], row_splits={"w": [5, 5]})
    with pytest.raises(ValueError, match="num_heads 5 does not divide"):
        muonrt.Muon([("w", w)], num_heads={"w": 5})
    with pytest.raises(ValueError, match="unknown parameters"):
        muonrt.Muon([("w", w)], num_heads={"v": 2})

"""overlap_backward from Python: the gradient hooks mark each parameter
ready during backward and the step finishes the rest, with the same bits
as the same training without overlap (one process here; 2 and 4 ranks in
test_distributed.py); gradient accumulation marks only in the last
micro-batch."""
import gc
import weakref

import pytest
import torch

import muonrt

pytestmark = pytest.mark.usefixtures("lib")


def train(overlap, steps=3, micro_batches=1, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32, bias=False),
                                torch.nn.Tanh(),
                                torch.nn.Linear(32, 24, bias=False),
                                torch.nn.Tanh(),
                                torch.nn.Linear(24, 8, bias=False))
    opt = muonrt.Muon(list(model.named_parameters()), lr=0.02,
                      overlap_backward=overlap, bucket_size_bytes=256)
    g = torch.Generator().manual_seed(seed + 1)
    marked = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        for mb in range(micro_batches):
            opt.accumulating = mb < micro_batches - 1
            x = torch.randn(4, 16, generator=g)
            model(x).square().mean().backward()
            marked.append(len(opt._ready))
        opt.step()
    return [p.detach().clone() for p in model.parameters()], marked


@pytest.mark.parametrize("micro_batches", [1, 3])
def test_overlap_backward_same_bits_and_hooks_mark_every_parameter(
        micro_batches):
    want, _ = train(False, micro_batches=micro_batches)
    got, marked = train(True, micro_batches=micro_batches)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    # After the last micro-batch's backward every parameter was marked by
    # its hook; during the earlier ones (accumulating) none was.
    per_step = [marked[k:k + micro_batches]
                for k in range(0, len(marked), micro_batches)]
    for step in per_step:
        assert step[-1] == 3, marked
        assert all(m == 0 for m in step[:-1]), marked


def test_mark_ready_without_overlap_is_refused():
    w = torch.nn.Parameter(torch.randn(4, 4))
    opt = muonrt.Muon([("w", w)])
    w.grad = torch.randn(4, 4)
    with pytest.raises(RuntimeError, match="overlap_backward"):
        opt.mark_ready("w")


def test_overlapped_step_refuses_lr_changed_after_marks_and_missing_grads():
    """After the hooks began the step: an lr changed before step() is
    refused (buckets may already be applied with the old one), and a
    parameter without a gradient fails the step without a stale pointer;
    the optimizer steps normally afterwards."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8, bias=False),
                                torch.nn.Linear(8, 4, bias=False))
    opt = muonrt.Muon(list(model.named_parameters()), lr=0.02,
                      overlap_backward=True, bucket_size_bytes=64)
    x = torch.randn(4, 8)
    model(x).sum().backward()
    opt.param_groups[0]["lr"] = 0.01
    with pytest.raises(RuntimeError, match="changed to .* after mark_ready"):
        opt.step()
    opt.zero_grad(set_to_none=True)
    model(x).sum().backward()
    opt.step()  # the new lr, pushed at this step's first mark
    assert opt.step_count == 2
    # Only the last layer's gradient: the first's is missing.
    opt.zero_grad(set_to_none=True)
    model[1].weight.grad = torch.randn(4, 8)
    opt.mark_ready(1)
    with pytest.raises(RuntimeError, match="no gradient"):
        opt.step()
    opt.zero_grad(set_to_none=True)
    model(x).sum().backward()
    opt.step()


def test_state_during_a_step_begun_by_hooks_is_refused_then_works(tmp_path):
    """Between backward (whose hooks began the step) and step(), the
    library's threads write the momentum: state_dict, load_state_dict and
    save_checkpoint are refused (FailedPreconditionError), and the step
    then ends with the same bits as without the refused calls."""
    def run(refuse):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8, bias=False),
                                    torch.nn.Linear(8, 4, bias=False))
        opt = muonrt.Muon(list(model.named_parameters()), lr=0.02,
                          overlap_backward=True, bucket_size_bytes=64)
        initial = opt.state_dict()
        model(torch.randn(4, 8)).sum().backward()
        if refuse:
            for call in (opt.state_dict,
                         lambda: opt.load_state_dict(initial),
                         lambda: opt.save_checkpoint(str(tmp_path / "c"))):
                with pytest.raises(muonrt.FailedPreconditionError,
                                   match="a step begun by"):
                    call()
        opt.step()
        assert opt.step_count == 1
        return opt.state_dict(), [p.detach().clone()
                                  for p in model.parameters()]
    (sd, want), (sd2, got) = run(False), run(True)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    for i in sd["state"]:
        assert torch.equal(sd["state"][i]["momentum_buffer"],
                           sd2["state"][i]["momentum_buffer"])


def _two_layers():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8, bias=False),
                               torch.nn.Linear(8, 4, bias=False))


def test_closed_or_replaced_optimizer_leaves_no_hooks_behind():
    """close() removes the gradient hooks, and they never kept the
    optimizer alive: a closed optimizer's backward marks nothing (it used
    to raise "closed"), and one created again over the same parameters
    steps as if it were the first (its predecessor's hooks used to mark
    first, then "marked twice")."""
    model, x = _two_layers(), torch.randn(4, 8)
    opt = muonrt.Muon(list(model.named_parameters()), lr=0.02,
                      overlap_backward=True)
    opt.close()
    model(x).sum().backward()  # no hook left to raise
    ref = weakref.ref(muonrt.Muon(list(model.named_parameters()),
                                  overlap_backward=True))
    gc.collect()
    assert ref() is None, "the hooks kept a dropped optimizer alive"
    opt = muonrt.Muon(list(model.named_parameters()), lr=0.02,
                      overlap_backward=True)
    for _ in range(2):
        opt.zero_grad(set_to_none=True)
        model(x).sum().backward()
        opt.step()
    assert opt.step_count == 2


def test_parameter_moved_is_refused_at_its_hook():
    """`p.data = ...` replaces the storage the library writes: under
    overlap_backward the hook's mark_ready refuses it as step() does,
    instead of writing freed memory."""
    model, x = _two_layers(), torch.randn(4, 8)
    opt = muonrt.Muon(list(model.named_parameters()), lr=0.02,
                      overlap_backward=True)
    model[1].weight.data = torch.randn(4, 8)
    with pytest.raises(RuntimeError, match=r"parameter '1.weight' moved"):
        model(x).sum().backward()
    with pytest.raises(RuntimeError, match=r"parameter '1.weight' moved"):
        opt.clip_qk([])


def test_gradient_changed_after_its_hook_is_refused_naming_it():
    """The hooks took each gradient's momentum at mark_ready, so a change
    afterwards cannot be applied: modified in place (clip_grad_norm_), the
    library's debug-mode check refuses the step unchanged; replaced
    (p.grad = ...), which the library does not see, the step goes through
    with the marked gradient and step() raises naming the parameter.
    Without a change the next step is quiet."""
    model, x = _two_layers(), torch.randn(4, 8)
    opt = muonrt.Muon(list(model.named_parameters()), lr=0.02,
                      overlap_backward=True)
    model(x).sum().backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
    with pytest.raises(RuntimeError, match=r'gradient of parameter '
                                           r'"\d.weight" changed after '
                                           r'MarkReady'):
        opt.step()
    assert opt.step_count == 0
    opt.zero_grad(set_to_none=True)
    model(x).sum().backward()
    model[1].weight.grad = model[1].weight.grad * 0.5
    with pytest.raises(RuntimeError, match=r"gradient of '1.weight' was "
                                           r"replaced after mark_ready"):
        opt.step()
    assert opt.step_count == 1
    opt.zero_grad(set_to_none=True)
    model(x).sum().backward()
    opt.step()
    assert opt.step_count == 2


def test_overlap_with_a_frozen_parameter_is_refused_naming_it():
    """A parameter that does not require grad can take no gradient hook:
    refused at construction naming it, not with torch's hook error."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8, bias=False),
                                torch.nn.Linear(8, 4, bias=False))
    model[0].weight.requires_grad_(False)
    with pytest.raises(ValueError, match=r"parameter '0.weight' does not "
                                         r"require grad.*overlap_backward"):
        muonrt.Muon(list(model.named_parameters()), overlap_backward=True)
    muonrt.Muon(list(model.named_parameters()))  # without overlap: as before


def test_overlap_inside_a_torch_job_of_several_ranks_warns(monkeypatch):
    """One muonrt rank per torch rank (no muonrt.init_process_group): if
    that job is DDP, the hooks take each rank's gradient before DDP
    averages it and the replicas drift apart. A warning naming both ways
    out (a pipeline stage with an optimizer of its own is fine, so not an
    error); none without overlap, where the step reads the averaged
    gradient (as torch.optim.Muon)."""
    import warnings
    model = torch.nn.Sequential(torch.nn.Linear(8, 8, bias=False))
    monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *a: 4)
    with pytest.warns(RuntimeWarning, match=r"overlap_backward with a muonrt "
                                            r"world of one inside a "
                                            r"torch.distributed job of 4 "
                                            r"ranks.*init_process_group"):
        muonrt.Muon(list(model.named_parameters()),
                    overlap_backward=True).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        muonrt.Muon(list(model.named_parameters())).close()


def test_check_finite_with_overlap_undoes_a_nan_step():
    """check_finite=True with overlap_backward: a NaN input makes the
    gradients NaN during backward (the hooks mark every parameter, the
    first-marked layer's bucket runs meanwhile); step() fails, and the
    parameters, momentum and step count are as before it; the next step
    goes on as in a run that never saw the NaN (check_finite off)."""
    def make(check):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False),
                                    torch.nn.Linear(16, 4, bias=False))
        opt = muonrt.Muon(list(model.named_parameters()), lr=0.02,
                          overlap_backward=True, bucket_size_bytes=64,
                          check_finite=check)
        return model, opt

    def step(model, opt, x):
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        return opt._ready.copy(), opt.step()

    model, opt = make(True)
    ref_model, ref_opt = make(False)
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(4, 8, generator=g) for _ in range(2)]
    for m, o in ((model, opt), (ref_model, ref_opt)):
        step(m, o, xs[0])
    before = [p.detach().clone() for p in model.parameters()]
    momentum = [s["momentum_buffer"].clone()
                for s in opt.state_dict()["state"].values()]
    bad = xs[1].clone()
    bad[0, 3] = float("nan")  # both layers' gradients hold NaN
    with pytest.raises(RuntimeError, match="non-finite gradient"):
        step(model, opt, bad)
    assert opt.step_count == 1
    for p, q in zip(model.parameters(), before):
        assert torch.equal(p.detach(), q)
    for s, q in zip(opt.state_dict()["state"].values(), momentum):
        assert torch.equal(s["momentum_buffer"], q)
    for m, o in ((model, opt), (ref_model, ref_opt)):
        marked, _ = step(m, o, xs[1])
        assert len(marked) == 2  # the hooks marked both during backward
    for p, q in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(p.detach(), q.detach())


def test_check_finite_false_lets_nan_through_as_torch_does():
    """check_finite=False: a NaN gradient propagates into the parameter
    (torch.optim.Muon's behaviour); the default refuses the step and keeps
    the parameter."""
    w = torch.nn.Parameter(torch.ones(4, 4))
    before = w.detach().clone()
    checked = muonrt.Muon([("w", w)], lr=0.1)
    w.grad = torch.full((4, 4), float("nan"))
    with pytest.raises(RuntimeError, match="non-finite|NaN|nan"):
        checked.step()
    assert torch.equal(w.detach(), before)
    unchecked = muonrt.Muon([("w", w)], lr=0.1, check_finite=False)
    unchecked.step()
    assert torch.isnan(w.detach()).all()


def test_check_finite_unset_is_off_under_overlap():
    """check_finite left unset with overlap_backward: no finite check, so a
    NaN gradient propagates (as torch.optim.Muon) instead of failing."""
    w = torch.nn.Parameter(torch.ones(4, 4))
    opt = muonrt.Muon([("w", w)], lr=0.1, overlap_backward=True)
    w.grad = torch.full((4, 4), float("nan"))
    opt.step()
    assert torch.isnan(w.detach()).all()

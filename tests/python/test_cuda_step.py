"""muonrt.Muon on CUDA tensors: the device-resident step against
torch.optim.Muon on the same GPU (its Newton-Schulz in bfloat16, ours too by
default), ordering on the caller's stream, momentum buffers on the device
and the non-finite check. Needs a GPU and PyTorch with torch.optim.Muon
(2.9+): skipped with the reason otherwise, failed instead when
MUON_REQUIRE_GPU=1 (tools/device_checks.sh sets it on the GPU machine).
"""
import os

import pytest
import torch

import muonrt

pytestmark = pytest.mark.usefixtures("lib")

SHAPES = {"w_square": (256, 256), "w_tall": (384, 128), "w_wide": (96, 320),
          "w_uneven": (100, 70)}
# Frobenius norm of (ours - torch's) update over torch's update: the bf16
# bound of tools/torch_muon_compare.py (torch rounds U and its norm to
# bf16 before the iteration; ours normalises in fp32 first).
FRO_BOUND = 4e-2


def _need_gpu():
    reason = None
    if not torch.cuda.is_available():
        reason = "torch.cuda.is_available() is False"
    elif not hasattr(torch.optim, "Muon"):
        reason = f"torch {torch.__version__} has no torch.optim.Muon"
    if reason is None:
        return
    if os.environ.get("MUON_REQUIRE_GPU") == "1":
        pytest.fail(f"MUON_REQUIRE_GPU=1 but {reason}")
    pytest.skip(reason)


def _problem(dtype, steps, seed=0):
    g = torch.Generator().manual_seed(seed)
    init = {n: (torch.randn(s, generator=g) * 0.02).to(dtype)
            for n, s in SHAPES.items()}
    grads = [{n: torch.randn(s, generator=g).to(dtype)
              for n, s in SHAPES.items()} for _ in range(steps)]
    return init, grads


def _run(opt_cls, init, grads, **kw):
    params = {n: torch.nn.Parameter(w.clone().cuda()) for n, w in init.items()}
    opt = opt_cls(list(params.values()) if opt_cls is torch.optim.Muon
                  else list(params.items()), lr=0.02, **kw)
    for step_grads in grads:
        for n, p in params.items():
            p.grad = step_grads[n].cuda()
        opt.step()
    torch.cuda.synchronize()
    return opt, {n: p.detach().cpu() for n, p in params.items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_tensors_within_bf16_bound_of_torch_optim_muon(dtype):
    _need_gpu()
    init, grads = _problem(dtype, steps=3)
    _, ours = _run(muonrt.Muon, init, grads)
    _, theirs = _run(torch.optim.Muon, init, grads)
    for n in SHAPES:
        upd = (theirs[n].double() - init[n].double()).norm().item()
        diff = (ours[n].double() - theirs[n].double()).norm().item()
        print(f"{n} {dtype}: |ours - torch| / |torch's update| = "
              f"{diff / upd:.3g} (bound {FRO_BOUND})")
        assert upd > 0
        assert diff <= FRO_BOUND * upd, f"{n}: {diff / upd}"


def test_cuda_step_on_side_stream_same_bits_as_default_stream():
    _need_gpu()
    init, grads = _problem(torch.float32, steps=2)
    _, ref = _run(muonrt.Muon, init, grads)
    params = {n: torch.nn.Parameter(w.clone().cuda()) for n, w in init.items()}
    opt = muonrt.Muon(list(params.items()), lr=0.02)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for step_grads in grads:
            # Gradients made on the side stream: the step must read them
            # after these copies (it is ordered on the current stream).
            for n, p in params.items():
                p.grad = step_grads[n].to("cuda", non_blocking=True)
            opt.step()
    side.synchronize()
    for n, p in params.items():
        assert torch.equal(p.detach().cpu(), ref[n]), n


def test_cuda_momentum_buffer_on_device_and_nonfinite_refused():
    _need_gpu()
    init, grads = _problem(torch.float32, steps=1)
    opt, after = _run(muonrt.Muon, init, grads)
    buf = opt.momentum_buffer("w_square")
    assert buf.device.type == "cuda"
    assert buf.shape == SHAPES["w_square"]
    assert buf.abs().sum().item() > 0
    for group in opt.param_groups:
        for p in group["params"]:
            p.grad = torch.zeros_like(p)
            p.grad.view(-1)[3] = float("nan")
    with pytest.raises(RuntimeError, match="non-finite gradient"):
        opt.step()
    for n, p in zip(SHAPES, opt.param_groups[0]["params"]):
        assert torch.equal(p.detach().cpu(), after[n]), n

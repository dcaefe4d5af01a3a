"""An independent formulation of torch.optim.Muon's step in PyTorch ops.

Written from torch/optim/_muon.py's documented algorithm (PyTorch 2.9+,
_single_tensor_muon), in float32 torch ops (fp64 on request) and with
Newton-Schulz in the same precision instead of torch's bf16, so it is
comparable with the runtime's fp32 results within rounding:

    B <- B.lerp(G, 1 - momentum)
    U <- G.lerp(B, momentum) if nesterov else B
    O <- NS(U): X = U (transposed when rows > cols); X /= max(||X||_F, eps);
         ns_steps times { A = X X^T; B = b A + c A A; X = a X + B X }
    NorMuon (normuon=True; arXiv 2510.05491 Algorithm 1, microsoft/dion's
    normuon.py rescale): V <- V.lerp(mean over each row of O**2,
         1 - beta2); O' = O / (sqrt(V) + eps); O <- O' * ||O||_F /
         max(||O'||_F, eps)
    W <- W * (1 - lr * weight_decay)
    W <- W - adjust_lr(lr, shape) * O
It shares no code with muonrt.
"""
import math

import torch


def zeropower_via_newtonschulz(update, ns_coefficients=(3.4445, -4.7750,
                                                        2.0315),
                               ns_steps=5, eps=1e-7, dtype=torch.float32):
    a, b, c = ns_coefficients
    x = update.to(dtype)
    transposed = x.size(0) > x.size(1)
    if transposed:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        poly = b * gram + c * (gram @ gram)
        x = a * x + poly @ x
    if transposed:
        x = x.T
    return x


def adjust_lr(lr, adjust_lr_fn, shape):
    rows, cols = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return lr * math.sqrt(max(1, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    if adjust_lr_fn == "spectral_norm":
        # microsoft/dion's adjust_lr_spectral_norm: fan_out / fan_in.
        return lr * math.sqrt(rows / cols)
    raise ValueError(adjust_lr_fn)


def normuon_normalize(o, v, beta2=0.95, eps=1e-8):
    """NorMuon's row-wise normalization of an orthogonalized update `o`
    ([rows, cols]) with row state `v` ([rows, 1], updated in place)."""
    norm = o.norm()
    v.lerp_((o * o).mean(dim=-1, keepdim=True), 1 - beta2)
    normalized = o / (v.sqrt() + eps)
    return normalized * (norm / normalized.norm().clamp(min=eps))


class ReferenceMuon:
    """State for a list of 2-D parameters (tensors updated in place).

    step(grads, lrs=None, weight_decays=None, momentums=None): one step;
    per-parameter lr, weight decay and momentum override the constructor's
    (param groups, schedulers).
    bf16 parameters are computed in fp32 and rounded after each in-place op,
    as torch does for p.mul_ / p.add_ on a bf16 tensor."""

    def __init__(self, params, lr=1e-3, weight_decay=0.1, momentum=0.95,
                 nesterov=True, ns_coefficients=(3.4445, -4.7750, 2.0315),
                 eps=1e-7, ns_steps=5, adjust_lr_fn=None,
                 dtype=torch.float32, normuon=False, normuon_beta2=0.95,
                 normuon_eps=1e-8):
        self.params = params
        self.lr, self.weight_decay, self.momentum = lr, weight_decay, momentum
        self.nesterov, self.ns_coefficients = nesterov, ns_coefficients
        self.eps, self.ns_steps, self.adjust_lr_fn = eps, ns_steps, adjust_lr_fn
        self.dtype = dtype
        self.buffers = [torch.zeros(p.shape, dtype=dtype) for p in params]
        self.normuon = normuon
        self.normuon_beta2, self.normuon_eps = normuon_beta2, normuon_eps
        self.variances = [torch.zeros(p.shape[0], 1, dtype=dtype)
                          for p in params]

    def step(self, grads, lrs=None, weight_decays=None, momentums=None):
        for i, (p, g) in enumerate(zip(self.params, grads)):
            lr = self.lr if lrs is None else lrs[i]
            wd = self.weight_decay if weight_decays is None else \
                weight_decays[i]
            momentum = self.momentum if momentums is None else momentums[i]
            g = g.to(self.dtype)
            buf = self.buffers[i]
            buf.lerp_(g, 1 - momentum)
            update = g.lerp(buf, momentum) if self.nesterov else buf
            o = zeropower_via_newtonschulz(update, self.ns_coefficients,
                                           self.ns_steps, self.eps,
                                           self.dtype)
            if self.normuon:
                o = normuon_normalize(o, self.variances[i],
                                      self.normuon_beta2, self.normuon_eps)
            alr = adjust_lr(lr, self.adjust_lr_fn, p.shape)
            if p.dtype == torch.bfloat16:
                w = (p.to(self.dtype) * (1 - lr * wd)).to(torch.bfloat16)
                w = (w.to(self.dtype) - alr * o).to(torch.bfloat16)
                p.copy_(w)
            else:
                w = p.to(self.dtype) * (1 - lr * wd)
                p.copy_(w - alr * o)

"""QK-clip (MuonClip) helpers for PyTorch attention code.

QK-clip (Kimi K2 technical report, arXiv 2507.20534, "MuonClip") needs,
per attention layer and step, the largest pre-softmax logit S_max of each
query head in the forward pass. torch's scaled_dot_product_attention does
not return its logits, so these recompute them from the same q and k:

    tracker = muonrt.MaxLogitTracker(num_layers)
    # in layer i's forward, next to F.scaled_dot_product_attention(q, k, v,
    # is_causal=True):
    tracker.record(i, q, k, is_causal=True)
    ...
    loss.backward(); opt.step()
    opt.clip_qk(tracker.values()); tracker.reset()

The recomputation costs one q @ k^T per layer (in chunks of query rows, so
memory stays O(chunk x keys)) without gradients.
"""
import math

import torch


def attention_max_logits(q, k, scale=None, is_causal=False, attn_mask=None,
                         chunk=256):
    """The largest pre-softmax logit of each query head, as
    torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask,
    is_causal=is_causal, scale=scale) computes its logits: q @ k^T * scale
    (scale None = 1 / sqrt(head dim)), with the causal mask's and a boolean
    mask's hidden positions left out and a float mask added.

    q: [..., heads, L, D]; k: [..., kv_heads, S, D] with kv_heads dividing
    heads (grouped-query attention: query head h reads key head h //
    (heads // kv_heads)). Returns a float32 tensor [heads] on q's device
    (-inf for a head whose every position is masked)."""
    with torch.no_grad():
        heads, kv_heads = q.shape[-3], k.shape[-3]
        if heads % kv_heads != 0:
            raise ValueError(f"attention_max_logits: {kv_heads} key heads do "
                             f"not divide {heads} query heads")
        if kv_heads != heads:
            k = k.repeat_interleave(heads // kv_heads, dim=-3)
        s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        qf, kf = q.float(), k.float()
        length, keys = q.shape[-2], k.shape[-2]
        if attn_mask is not None:
            # A mask broadcast over batch, heads or queries ([S], [B,1,1,S]):
            # to the logits' shape, so that each chunk of queries slices it.
            attn_mask = torch.broadcast_to(
                attn_mask, tuple(q.shape[:-1]) + (keys,))
        out = torch.full((heads,), -math.inf, device=q.device)
        for start in range(0, length, chunk):
            end = min(length, start + chunk)
            logits = qf[..., start:end, :] @ kf.transpose(-1, -2) * s
            if is_causal:
                rows = torch.arange(start, end, device=q.device)[:, None]
                cols = torch.arange(keys, device=q.device)[None, :]
                logits = logits.masked_fill(cols > rows, -math.inf)
            if attn_mask is not None:
                m = attn_mask[..., start:end, :]
                if m.dtype == torch.bool:
                    logits = logits.masked_fill(~m, -math.inf)
                else:
                    logits = logits + m
            per_head = logits.movedim(-3, 0).reshape(heads, -1)
            out = torch.maximum(out, per_head.amax(dim=1))
        return out


class MaxLogitTracker:
    """Running per-head maxima of `num_layers` attention layers over a
    step's forward passes (micro-batches included): record() them in the
    forward, hand values() to muonrt.Muon.clip_qk after the step, then
    reset()."""

    def __init__(self, num_layers):
        self._values = [None] * num_layers

    def record(self, layer, q, k, **kwargs):
        """Folds attention_max_logits(q, k, **kwargs) into layer `layer`."""
        m = attention_max_logits(q, k, **kwargs)
        old = self._values[layer]
        self._values[layer] = m if old is None else torch.maximum(old, m)

    def values(self):
        """One [heads] tensor per layer (None for a layer not recorded)."""
        return list(self._values)

    def reset(self):
        self._values = [None] * len(self._values)

"""QK-clip from Python: muonrt.attention_max_logits against logits written
out by hand (grouped-query, causal and masked), and muonrt.Muon(qk_clip=...)
.clip_qk on a small attention model: after the clip, a clipped group's
largest logit recomputed from the weights is the threshold, the others
keep their bits; bad input is refused with the library's message."""
import math

import pytest
import torch

import muonrt

pytestmark = pytest.mark.usefixtures("lib")

H, G, D, E = 4, 2, 8, 16  # query heads, key heads, head dim, model width


def logits_by_hand(q, k, scale, causal):
    """[B, H, L, S] logits of grouped-query attention, -inf where masked."""
    b, h, length, _ = q.shape
    out = torch.empty(b, h, length, k.shape[-2], dtype=torch.float64)
    for head in range(h):
        kh = k[:, head // (h // k.shape[1])].double()
        out[:, head] = q[:, head].double() @ kh.transpose(-1, -2) * scale
    if causal:
        mask = torch.ones(length, k.shape[-2], dtype=torch.bool).triu(1)
        out = out.masked_fill(mask, -math.inf)
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_attention_max_logits_matches_logits_by_hand(causal):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, H, 7, D, generator=g)
    k = torch.randn(2, G, 7, D, generator=g)
    got = muonrt.attention_max_logits(q, k, is_causal=causal, chunk=3)
    want = logits_by_hand(q, k, 1 / math.sqrt(D), causal).amax(dim=(0, 2, 3))
    assert got.shape == (H,)
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-6)
    # A boolean mask hiding everything but the first key.
    mask = torch.zeros(7, 7, dtype=torch.bool)
    mask[:, 0] = True
    got = muonrt.attention_max_logits(q, k, scale=0.5, attn_mask=mask)
    want = logits_by_hand(q, k, 0.5, False)[..., 0].amax(dim=(0, 2))
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-6)
    # A padding mask broadcast over queries ([S]), in chunks of 3 queries.
    got = muonrt.attention_max_logits(q, k, scale=0.5, attn_mask=mask[0],
                                      chunk=3)
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-6)


def project(x, w, heads):
    """[B, L, E] x [heads * D, E]^T -> [B, heads, L, D]."""
    b, length, _ = x.shape
    return (x @ w.T).view(b, length, heads, D).transpose(1, 2)


def test_clip_qk_lands_clipped_groups_on_threshold():
    g = torch.Generator().manual_seed(1)
    wq = torch.nn.Parameter(torch.randn(H * D, E, generator=g))
    wk = torch.nn.Parameter(torch.randn(G * D, E, generator=g))
    x = torch.randn(2, 6, E, generator=g)
    tracker = muonrt.MaxLogitTracker(1)
    with torch.no_grad():
        tracker.record(0, project(x, wq, H), project(x, wk, G), is_causal=True)
    before = tracker.values()[0]
    groups_before = before.view(G, -1).amax(dim=1)
    tau = float(groups_before.sort().values[0] + groups_before.sort().values[1]) / 2
    opt = muonrt.Muon([("wq", wq), ("wk", wk)], lr=0.0, weight_decay=0.0,
                      qk_clip={"threshold": tau, "layers": [
                          {"q": "wq", "k": "wk", "num_heads": H,
                           "num_kv_heads": G, "head_dim": D}]})
    kept = {"wq": wq.detach().clone(), "wk": wk.detach().clone()}
    result = opt.clip_qk(tracker.values())
    assert result["groups_clipped"] == 1
    assert result["max_logit"] == pytest.approx(float(before.max()))
    with torch.no_grad():
        after = muonrt.attention_max_logits(project(x, wq, H),
                                            project(x, wk, G), is_causal=True)
    groups_after = after.view(G, -1).amax(dim=1)
    for gi in range(G):
        rows_q = slice(gi * (H // G) * D, (gi + 1) * (H // G) * D)
        rows_k = slice(gi * D, (gi + 1) * D)
        if groups_before[gi] > tau:
            assert float(groups_after[gi]) == pytest.approx(tau, rel=1e-5)
        else:
            assert torch.equal(wq.detach()[rows_q], kept["wq"][rows_q])
            assert torch.equal(wk.detach()[rows_k], kept["wk"][rows_k])


def test_clip_qk_bad_input_is_refused():
    wq = torch.nn.Parameter(torch.randn(H * D, E))
    wk = torch.nn.Parameter(torch.randn(G * D, E))
    layer = {"q": "wq", "k": "wk", "num_heads": H, "num_kv_heads": G,
             "head_dim": D}
    opt = muonrt.Muon([("wq", wq), ("wk", wk)],
                      qk_clip={"layers": [layer]})
    with pytest.raises(ValueError, match="ClipQk got 3 maxima but the 1 "
                                         "qk_clip layers have 4 query heads"):
        opt.clip_qk(torch.zeros(3))
    with pytest.raises(ValueError, match="is inf"):
        opt.clip_qk(torch.tensor([1.0, float("inf"), 2.0, 3.0]))
    with pytest.raises(ValueError, match="num_heads 4 and num_kv_heads 3"):
        muonrt.Muon([("wq", wq), ("wk", wk)],
                    qk_clip={"layers": [dict(layer, num_kv_heads=3)]})
    with pytest.raises(ValueError, match='names parameter "wv"'):
        muonrt.Muon([("wq", wq), ("wk", wk)],
                    qk_clip={"layers": [dict(layer, k="wv")]})

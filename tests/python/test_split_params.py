"""muonrt.split_params on a small language model: Muon gets the hidden
layers' matrices; embeddings, the head, norms and biases go to AdamW."""
import torch

import muonrt


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.attn = torch.nn.ModuleDict({
            "wq": torch.nn.Linear(d, d, bias=False),
            "output": torch.nn.ModuleDict({"dense": torch.nn.Linear(d, d)}),
        })
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d),
                                       torch.nn.GELU(),
                                       torch.nn.Linear(4 * d, d))


class TinyLM(torch.nn.Module):
    def __init__(self, vocab=50, d=16, tie=False):
        super().__init__()
        self.tok_emb = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Parameter(torch.zeros(8, d))  # a 2-D non-module param
        self.blocks = torch.nn.ModuleList([Block(d), Block(d)])
        self.conv = torch.nn.Conv1d(d, d, 3)  # 3-D weight
        self.final_norm = torch.nn.LayerNorm(d)
        self.lm_head = torch.nn.Linear(d, vocab, bias=False)
        if tie:
            self.lm_head.weight = self.tok_emb.weight


def test_split_params_small_lm():
    model = TinyLM()
    muon, other = muonrt.split_params(model, exclude=["pos"])
    muon_names = [n for n, _ in muon]
    assert muon_names == [
        "blocks.0.attn.wq.weight", "blocks.0.attn.output.dense.weight",
        "blocks.0.mlp.0.weight", "blocks.0.mlp.2.weight",
        "blocks.1.attn.wq.weight", "blocks.1.attn.output.dense.weight",
        "blocks.1.mlp.0.weight", "blocks.1.mlp.2.weight"]
    other_names = [n for n, _ in other]
    for n in ["tok_emb.weight", "pos", "lm_head.weight", "final_norm.weight",
              "final_norm.bias", "blocks.0.norm.weight", "blocks.0.mlp.0.bias",
              "conv.weight", "conv.bias"]:
        assert n in other_names, n
    # A partition of named_parameters(), in its order.
    all_names = [n for n, _ in model.named_parameters()]
    assert sorted(muon_names + other_names) == sorted(all_names)
    assert other_names == [n for n in all_names if n not in muon_names]
    for _, p in muon:
        assert p.ndim == 2


def test_split_params_defaults_and_options():
    model = TinyLM()
    muon, _ = muonrt.split_params(model)
    assert "pos" in [n for n, _ in muon]  # 2-D, not excluded by default
    muon, _ = muonrt.split_params(model, exclude="blocks.1")
    assert not any(n.startswith("blocks.1.") for n, _ in muon)


def test_split_params_tied_head_and_mlp_classifier():
    tied = TinyLM(tie=True)
    muon, other = muonrt.split_params(tied)
    names = [n for n, _ in muon]
    assert "tok_emb.weight" not in names and "lm_head.weight" not in names
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                              torch.nn.Linear(16, 16), torch.nn.ReLU(),
                              torch.nn.Linear(16, 3))
    muon, other = muonrt.split_params(mlp)
    assert [n for n, _ in muon] == ["0.weight", "2.weight"]
    muon, other = muonrt.split_params(mlp, exclude_last_linear=False)
    assert [n for n, _ in muon] == ["0.weight", "2.weight", "4.weight"]


def test_split_params_frozen_go_to_other():
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 16),
                              torch.nn.Linear(16, 3))
    mlp[0].weight.requires_grad_(False)
    muon, other = muonrt.split_params(mlp)
    assert [n for n, _ in muon] == ["1.weight"]
    assert "0.weight" in [n for n, _ in other]


def test_split_params_feeds_muon_and_adamw(lib):
    torch.manual_seed(0)
    model = TinyLM()
    muon_params, other = muonrt.split_params(model)
    opt = muonrt.Muon(muon_params, lr=0.02)
    adamw = torch.optim.AdamW([p for _, p in other], lr=1e-3)
    tokens = torch.randint(0, 50, (4, 8))
    x = model.tok_emb(tokens) + model.pos
    for block in model.blocks:
        h = block.norm(x)
        x = x + block.attn["output"]["dense"](block.attn["wq"](h))
        x = x + block.mlp(block.norm(x))
    x = x + model.conv(x.transpose(1, 2)).transpose(1, 2).mean() * 0
    logits = model.lm_head(model.final_norm(x))
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 50),
                                             tokens.reshape(-1))
    loss.backward()
    before = {n: p.detach().clone() for n, p in muon_params}
    opt.step()
    adamw.step()
    for n, p in muon_params:
        assert not torch.equal(before[n], p.detach()), n

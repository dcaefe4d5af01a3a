"""muonrt.spec_from_module / write_spec: a job spec (JSON-ready dict in
common/spec.h's JobSpecToJson spelling) from a torch.nn.Module, with the
rules of tools/spec_builder.h (tested in tests/tools/spec_builder_test.cc).
Pure Python: no libmuonrt call (the C ABI has no spec entry point), and no
muonctl call.
"""
import json
import os

import pytest
import torch

import muonrt

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


class Block(torch.nn.Module):
    def __init__(self, d=16, kv=8, ff=32):
        super().__init__()
        self.input_layernorm = torch.nn.LayerNorm(d)
        self.q_proj = torch.nn.Linear(d, d, bias=False)
        self.k_proj = torch.nn.Linear(d, kv, bias=False)
        self.v_proj = torch.nn.Linear(d, kv, bias=False)
        self.o_proj = torch.nn.Linear(d, d, bias=False)
        self.gate_proj = torch.nn.Linear(d, ff, bias=False)
        self.up_proj = torch.nn.Linear(d, ff, bias=False)
        self.down_proj = torch.nn.Linear(ff, d, bias=True)


class TinyLlama(torch.nn.Module):
    def __init__(self, vocab=64, d=16):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(vocab, d)
        self.layers = torch.nn.ModuleList([Block(d), Block(d)])
        self.norm = torch.nn.LayerNorm(d)
        self.lm_head = torch.nn.Linear(d, vocab, bias=False)


class Conv1D(torch.nn.Module):
    """GPT-2's Conv1D: weight stored [in, out] (y = x @ W + b)."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(n_in, n_out))
        self.bias = torch.nn.Parameter(torch.zeros(n_out))


class TinyGpt2(torch.nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.wte = torch.nn.Embedding(64, d)
        self.wpe = torch.nn.Embedding(32, d)
        self.ln_1 = torch.nn.LayerNorm(d)
        self.c_attn = Conv1D(d, 3 * d)
        self.c_proj = Conv1D(d, d)
        self.ln_f = torch.nn.LayerNorm(d)


TP_RULES = [(r"q_proj|k_proj|v_proj|gate_proj|up_proj", "tp:Shard(0)"),
            (r"o_proj|down_proj", "tp:Shard(1)")]


def by_name(spec):
    return {p["name"]: p for p in spec["params"]}


def test_llama_fsdp_tp_rules_and_exclusions():
    skipped = []
    spec = muonrt.spec_from_module(TinyLlama(), "dp_shard=2,tp=2",
                                   placements_rules=TP_RULES,
                                   job_id="llama-tp", skipped=skipped)
    assert spec["job_id"] == "llama-tp"
    assert spec["mesh"] == {"dims": [{"name": "dp_shard", "size": 2},
                                     {"name": "tp", "size": 2}]}
    p = by_name(spec)
    assert len(p) == 14  # 7 matrices x 2 layers
    assert p["layers.0.q_proj.weight"]["placements"] == ["Shard(0)",
                                                         "Shard(0)"]
    assert p["layers.1.o_proj.weight"]["placements"] == ["Shard(0)",
                                                         "Shard(1)"]
    assert p["layers.1.down_proj.weight"]["placements"] == ["Shard(0)",
                                                            "Shard(1)"]
    assert p["layers.0.k_proj.weight"]["shape"] == [8, 16]
    assert p["layers.0.down_proj.weight"]["shape"] == [16, 32]
    for gone in ("embed_tokens.weight", "norm.weight", "lm_head.weight",
                 "layers.0.input_layernorm.weight",
                 "layers.0.down_proj.bias"):
        assert gone not in p
    reasons = dict(skipped)
    assert reasons["embed_tokens.weight"] == 'excluded by "embed"'
    assert reasons["lm_head.weight"] == 'excluded by "lm_head"'
    assert reasons["layers.0.down_proj.bias"] == "1-D"
    # Model order (named_parameters()).
    assert spec["params"][0]["name"] == "layers.0.q_proj.weight"


def test_gpt2_transpose_swaps_conv1d_in_out():
    spec = muonrt.spec_from_module(TinyGpt2(), "dp_shard=4", job_id="gpt2",
                                   transpose=r"c_attn|c_proj")
    p = by_name(spec)
    assert set(p) == {"c_attn.weight", "c_proj.weight"}
    assert p["c_attn.weight"]["shape"] == [48, 16]  # stored [16, 48]
    assert p["c_attn.weight"]["placements"] == ["Shard(0)"]
    plain = muonrt.spec_from_module(TinyGpt2(), "dp_shard=4", job_id="gpt2")
    assert by_name(plain)["c_attn.weight"]["shape"] == [16, 48]


def test_default_placements_rules_forms_and_mesh_forms():
    model = TinyLlama()
    a = muonrt.spec_from_module(model, {"dp_replicate": 2, "dp_shard": 2},
                                job_id="h")
    assert a["params"][0]["placements"] == ["Replicate()", "Shard(0)"]
    # Positional, dict and "REGEX=PLACEMENTS" forms, short spellings.
    b = muonrt.spec_from_module(
        model, muonrt.Mesh(["dp_shard", "tp"], [2, 2]), job_id="b",
        default_placements="S(0),R",
        placements_rules=["o_proj=tp:S(1)", ("q_proj", {"tp": "Shard(0)"})])
    p = by_name(b)
    assert p["layers.0.o_proj.weight"]["placements"] == ["Shard(0)",
                                                         "Shard(1)"]
    assert p["layers.0.q_proj.weight"]["placements"] == ["Shard(0)",
                                                         "Shard(0)"]
    assert p["layers.0.up_proj.weight"]["placements"] == ["Shard(0)",
                                                          "Replicate()"]
    # exclude replaces the defaults.
    c = muonrt.spec_from_module(model, "dp_shard=2", job_id="c",
                                exclude=["proj"])
    assert [x["name"] for x in c["params"]] == ["embed_tokens.weight",
                                                "lm_head.weight"]


def test_expert_stacks():
    class Moe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.experts_w1 = torch.nn.Parameter(torch.zeros(4, 8, 6))
            self.hidden = torch.nn.Linear(6, 6, bias=False)
            # The last Linear: AdamW's, by split_params's rule.
            self.router = torch.nn.Linear(6, 4, bias=False)

    assert len(muonrt.spec_from_module(Moe(), "ep=2", job_id="m")
               ["params"]) == 1
    spec = muonrt.spec_from_module(Moe(), "ep=2", job_id="m",
                                   expert_stacks=True, transpose="experts",
                                   default_placements="Shard(0)")
    assert spec["params"][0] == {"name": "experts_w1", "shape": [4, 6, 8],
                                 "placements": ["Shard(0)"]}


@pytest.mark.parametrize("kwargs, message", [
    (dict(mesh="dp_shard=0"), "integer >= 1"),
    (dict(mesh="dp_shard"), "not name=size"),
    (dict(mesh="tp=2,tp=2"), "twice"),
    (dict(placements_rules=["o_proj"]), "expected REGEX=PLACEMENTS"),
    (dict(placements_rules=[("(", "Shard(0)")]), "bad regular expression"),
    (dict(placements_rules=[("o_proj", "ep:Shard(0)")]), "no such dim"),
    (dict(placements_rules=[("o_proj", "Shard(0),Shard(1)")]),
     "2 placements for a mesh of 1"),
    (dict(placements_rules=[("o_proj", "Partial()")]), "Partial"),
    (dict(placements_rules=[("o_proj", "Shard(2)")]), "shards dim 2"),
    (dict(job_id=""), "job_id"),
    (dict(exclude=["."]), "none of the"),
])
def test_bad_arguments_raise_value_error(kwargs, message):
    args = dict(mesh="tp=2", job_id="j")
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        muonrt.spec_from_module(TinyLlama(), **args)


def test_write_spec_json_matches_spec_file_structure(tmp_path):
    spec = muonrt.spec_from_module(TinyLlama(), "dp_shard=2,tp=2",
                                   placements_rules=TP_RULES,
                                   job_id="llama-tp")
    path = tmp_path / "llama.json"
    muonrt.write_spec(spec, str(path))
    loaded = json.loads(path.read_text())
    assert loaded == spec
    # The field names of a hand-written spec (examples/specs, read by
    # common/spec.h ParseJobSpecJson) and nothing else.
    with open(os.path.join(REPO, "examples", "specs", "tp_fsdp.json")) as f:
        example = json.load(f)
    assert set(loaded) <= set(example)
    assert set(loaded["mesh"]) == set(example["mesh"])
    assert set(loaded["mesh"]["dims"][0]) == set(example["mesh"]["dims"][0])
    for p in loaded["params"]:
        assert set(p) == set(example["params"][0])
        assert all(isinstance(d, int) and d >= 1 for d in p["shape"])
        assert len(p["placements"]) == len(loaded["mesh"]["dims"])


def test_default_rule_matches_split_params():
    """With the default exclusions the spec lists exactly the matrices
    split_params gives to Muon (an MLP's classifier, the last Linear, goes
    to AdamW in both)."""
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10))
    skipped = []
    spec = muonrt.spec_from_module(model, "dp_shard=2", job_id="mlp",
                                   skipped=skipped)
    muon_names = [n for n, _ in muonrt.split_params(model)[0]]
    assert [p["name"] for p in spec["params"]] == muon_names
    assert ("4.weight", "left to AdamW by split_params (embedding, output "
            "head or last Linear)") in skipped


def test_optimizer_writes_its_own_spec_that_muonctl_plans(tmp_path):
    """opt.write_spec(path): the optimizer's mesh, names, global shapes and
    placements; the package's muonctl plans it."""
    import subprocess
    import torch
    w1 = torch.nn.Parameter(torch.randn(12, 8))
    w2 = torch.nn.Parameter(torch.randn(8, 6))
    opt = muonrt.Muon([("w1", w1), ("w2", w2)], lr=0.02)
    path = tmp_path / "job.json"
    spec = opt.write_spec(path, job_id="mine")
    assert json.load(open(path)) == spec
    assert spec["mesh"] == {"dims": [{"name": "dp_shard", "size": 1}]}
    assert [(p["name"], p["shape"]) for p in spec["params"]] == [
        ("w1", [12, 8]), ("w2", [8, 6])]
    muonctl = os.path.join(REPO, "python", "muonrt", "bin", "muonctl")
    if not os.path.exists(muonctl):
        muonctl = os.path.join(REPO, "bazel-bin", "tools", "muonctl")
    if not os.path.exists(muonctl):
        pytest.skip("muonctl is not built")
    r = subprocess.run([muonctl, "plan", "--spec", str(path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "2 matrices over 1 rank" in r.stdout
    assert "optimizer" not in spec  # fp32 parameters: fp32 momentum


def test_bf16_optimizer_spec_counts_bf16_momentum(tmp_path):
    """A bf16 model's spec carries its momentum dtype (a spec's parameters
    carry none), so muonctl plan counts 2 bytes per parameter."""
    import torch
    w = torch.nn.Parameter(torch.randn(16, 8).bfloat16())
    opt = muonrt.Muon([("w", w)], lr=0.02)
    spec = opt.write_spec(tmp_path / "job.json")
    assert spec["optimizer"] == {"momentum_dtype": "bfloat16"}
    opt32 = muonrt.Muon([("w", w)], lr=0.02, momentum_dtype=torch.float32)
    assert opt32.write_spec(tmp_path / "job32.json")["optimizer"] == {
        "momentum_dtype": "float32"}

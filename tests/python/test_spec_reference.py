"""docs/spec_reference.md is generated from proto/muon/v1/coordinator.proto.

Run from the repository root:
    /usr/bin/python3 -m pytest -q tests/python/test_spec_reference.py
When the proto's comments change, regenerate with
    python3 tools/gen_spec_reference.py --out docs/spec_reference.md
"""
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GEN = os.path.join(REPO, "tools", "gen_spec_reference.py")
DOC = os.path.join(REPO, "docs", "spec_reference.md")
PROTO = os.path.join(REPO, "proto", "muon", "v1", "coordinator.proto")
SPEC_MESSAGES = ["JobSpec", "Mesh", "MeshDim", "ParamSpec",
                 "OptimizerOptions", "ExecutionOptions"]


def _generated(*args):
    return subprocess.run([sys.executable, GEN, *args], cwd=REPO,
                          check=True, capture_output=True, text=True,
                          timeout=60).stdout


def _proto_fields(message):
    """Field names of `message`, read with a regex independent of the generator."""
    text = open(PROTO, encoding="utf-8").read()
    m = re.search(r"^message\s+" + message + r"\s*\{(.*?)^\}", text,
                  re.S | re.M)
    assert m, f"message {message} not found in {PROTO}"
    body = "\n".join(l.split("//")[0] for l in m.group(1).splitlines())
    return re.findall(r"(\w+)\s*=\s*\d+\s*;", body)


def test_committed_doc_is_current():
    with open(DOC, encoding="utf-8") as f:
        committed = f.read()
    assert committed == _generated(), (
        "docs/spec_reference.md is stale: run "
        "python3 tools/gen_spec_reference.py --out docs/spec_reference.md")


def test_out_flag_writes_the_same_text(tmp_path):
    out = tmp_path / "ref.md"
    assert _generated("--out", str(out)) == ""
    assert out.read_text(encoding="utf-8") == _generated()


def test_every_jobspec_field_appears():
    doc = _generated()
    fields = _proto_fields("JobSpec")
    assert set(fields) >= {"job_id", "mesh", "params", "optimizer",
                           "execution"}
    section = doc.split("## JobSpec\n", 1)[1].split("\n## ", 1)[0]
    for name in fields:
        assert f"| `{name}` |" in section, name


def test_every_field_of_the_spec_messages_appears_with_its_comment():
    doc = _generated()
    for message in SPEC_MESSAGES:
        assert f"## {message}\n" in doc, message
        section = doc.split(f"## {message}\n", 1)[1].split("\n## ", 1)[0]
        for name in _proto_fields(message):
            assert f"| `{name}` |" in section, (message, name)
    # Leading and trailing comments both make it in.
    assert "Opt-in re-planning from measured times" in doc
    assert "default 0.95" in doc
    assert '"Partial()" is rejected' in doc


def test_example_comes_from_spec_h():
    doc = _generated()
    assert '{"job_id": "mlp", "mesh": {"dims": [{"name": "dp_shard", "size": 4}]},' in doc
    assert '"sub_mesh": {"pp": 1}}' in doc

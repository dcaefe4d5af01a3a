"""tools/ns_accuracy.py on the CPU: the distance of muonrt's Newton-Schulz
(standard and Gram) and of torch's bf16 `_zeropower_via_newtonschulz` to a
float64 run of the same iteration, and the verdict that ours is no farther.
The same tool runs on the GPU (tools/device_checks.sh)."""
import json
import os
import subprocess
import sys

from conftest import library_or_skip

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
TOOL = os.path.join(REPO, "tools", "ns_accuracy.py")


def test_ours_is_no_farther_from_float64_than_torch_on_the_cpu(tmp_path):
    library_or_skip()
    out = tmp_path / "acc.json"
    r = subprocess.run(
        [sys.executable, TOOL, "--device", "cpu", "--shapes",
         "64x32,48x130,96x96", "--strict", "--json", str(out)],
        env=dict(os.environ, PYTHONPATH=os.path.join(REPO, "python")),
        capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["problems"] == []
    assert [row["shape"] for row in report["shapes"]] == [
        [64, 32], [48, 130], [96, 96]]
    for row in report["shapes"]:
        d = row["rel_fro"]
        # Ours is fp32 on the CPU: ~1e-6 from float64; torch's bf16 ~1e-2.
        assert d["ours"] < 1e-5 and d["ours_gram"] < 1e-5, row
        assert d["ours"] <= d["torch"], row
        assert row["ours_no_farther_than_torch"] is True, row

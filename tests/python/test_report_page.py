"""`muonctl report`: one self-contained HTML page, opened in headless
Chromium (Debian's chromium); the screenshot must not be blank and the page
must hold the plan's numbers.

Skips, with the reason, when Chromium or the built binaries are missing.
"""
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import tempfile
import time
import zlib

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
MUONCTL = os.path.join(ROOT, "bazel-bin", "tools", "muonctl")
DAEMON = os.path.join(ROOT, "bazel-bin", "server", "muon-coordinator")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.skipif(not os.access(MUONCTL, os.X_OK),
                       reason=f"{MUONCTL} not built (bazel build //...)"),
    pytest.mark.skipif(CHROMIUM is None,
                       reason="chromium not installed (apt-get install "
                              "chromium)"),
]


def read_png(path):
    """(width, height, bytes per pixel, rows) of an 8-bit RGB(A) PNG."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, color, _, _, interlace = struct.unpack(">IIBBBBB",
                                                                body)
            assert depth == 8 and interlace == 0 and color in (2, 6)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    bpp = 3 if color == 2 else 4
    raw, stride = zlib.decompress(idat), w * bpp
    rows, prev = [], bytearray(stride)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):  # PNG filters (RFC 2083 section 6)
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, bpp, rows


def screenshot(html, png):
    subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
         "--hide-scrollbars", "--window-size=1100,1400",
         f"--screenshot={png}", f"file://{html}"],
        check=True, timeout=120, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    w, h, bpp, rows = read_png(png)
    pixels = [r[i:i + 3] for r in rows for i in range(0, len(r), bpp)]
    nonwhite = sum(1 for p in pixels if p != b"\xff\xff\xff")
    return nonwhite / (w * h), len(set(pixels))


def page_data(html):
    text = open(html).read()
    m = re.search(r'<script type="application/json" id="muon-report-data">'
                  r'\n(.*)\n</script>', text)
    assert m, "no embedded data"
    assert "http://" not in text and "https://" not in text, "needs network"
    return text, json.loads(m.group(1))


def test_report_offline_plan_page_renders_with_the_plans_numbers(tmp_path):
    spec = os.path.join(ROOT, "examples/specs/models/llama3_8b_tp8_dp8.json")
    html = str(tmp_path / "report.html")
    subprocess.run([MUONCTL, "report", "--spec", spec, "--out", html],
                   check=True, timeout=120)
    plan = json.loads(subprocess.run(
        [MUONCTL, "plan", "--spec", spec, "--json"], check=True,
        capture_output=True, timeout=120).stdout)
    text, data = page_data(html)
    assert data["plan_hash"] == plan["hash"] and plan["hash"] in text
    assert data["world_size"] == 64
    assert data["ns_flops"] == [l["ns_flops"] for l in plan["loads"]]
    assert len(data["round_robin_ns_flops"]) == 64
    assert max(data["round_robin_ns_flops"]) > max(data["ns_flops"])
    assert len(data["bytes_sent"]) == 64 and min(data["bytes_sent"]) > 0
    fraction, colors = screenshot(html, str(tmp_path / "report.png"))
    assert fraction > 0.05, f"screenshot nearly blank ({fraction:.3f})"
    assert colors > 10


@pytest.mark.skipif(not os.access(DAEMON, os.X_OK),
                    reason=f"{DAEMON} not built")
def test_report_live_job_has_step_times_and_timeline(tmp_path):
    spec = os.path.join(ROOT, "examples/specs/fsdp.json")
    env = dict(os.environ, MUON_JOB_SECRET="ab" * 32)
    port_file = tmp_path / "port"
    daemon = subprocess.Popen(
        [DAEMON, "--port", "0", "--port_file", str(port_file),
         "--world_size", "4", "--job_id", "report"], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    try:
        deadline = time.time() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            assert time.time() < deadline, "daemon did not start"
            assert daemon.poll() is None, "daemon exited"
            time.sleep(0.05)
        address = "127.0.0.1:" + port_file.read_text().strip()
        subprocess.run([MUONCTL, "validate", "--spec", spec, "--steps", "3",
                        "--coordinator", address], env=env, check=True,
                       timeout=300, stdout=subprocess.DEVNULL)
        # No spec: the report is of the job's own layout and plan.
        html = str(tmp_path / "live.html")
        subprocess.run([MUONCTL, "report", "--coordinator", address,
                        "--out", html], env=env, check=True, timeout=60)
        # A spec that matches the live job is accepted.
        subprocess.run([MUONCTL, "report", "--spec", spec, "--coordinator",
                        address, "--out", str(tmp_path / "matching.html")],
                       env=env, check=True, timeout=60,
                       stdout=subprocess.DEVNULL)
        # One that does not (DDP's Replicate() for FSDP's Shard(0)) is
        # refused, naming the difference, and writes nothing.
        other = os.path.join(ROOT, "examples/specs/ddp.json")
        refused = subprocess.run(
            [MUONCTL, "report", "--spec", other, "--coordinator", address,
             "--out", str(tmp_path / "other.html")], env=env, timeout=60,
            capture_output=True, text=True)
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        daemon.wait(timeout=20)
    assert refused.returncode == 1, refused.stderr
    assert ('does not describe the live job "report": mesh dp_replicate=4 '
            "differs from the live job's dp_shard=4") in refused.stderr
    assert not (tmp_path / "other.html").exists()
    # The live job's plan: the spec planned offline under the job's id.
    with open(spec) as f:
        as_job = json.load(f)
    as_job["job_id"] = "report"
    (tmp_path / "as_job.json").write_text(json.dumps(as_job))
    offline = json.loads(subprocess.run(
        [MUONCTL, "plan", "--spec", str(tmp_path / "as_job.json"), "--json"],
        check=True, capture_output=True, timeout=120).stdout)
    text, data = page_data(html)
    assert data["plan_hash"] == offline["hash"]
    assert data["world_size"] == 4
    assert data["ns_flops"] == [l["ns_flops"] for l in offline["loads"]]
    assert f'live job &quot;report&quot; at {address}' in text
    assert sorted(data["step_time_ms"]) == ["0", "1", "2", "3"]
    assert all(len(steps) == 3 for steps in data["step_time_ms"].values())
    assert "Step timeline" in text and "url(#wait)" in text
    for op in ("gather", "redistribute", "apply"):
        assert f": {op} " in text
    fraction, colors = screenshot(html, str(tmp_path / "live.png"))
    assert fraction > 0.05, f"screenshot nearly blank ({fraction:.3f})"
    assert colors > 10

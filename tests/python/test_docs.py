"""Checks on the docs a new user copies from: commands that would leave the
other commands broken, and blocks that race what they start."""
import glob
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DOCS = [os.path.join(REPO, "README.md"),
        os.path.join(REPO, "python", "README.md")] + sorted(
            glob.glob(os.path.join(REPO, "docs", "*.md")))


def test_opt_builds_keep_bazel_bin_on_the_default_build():
    """`bazel build -c opt` moves the bazel-bin symlink to the opt tree
    (no muonrun or coordinator there, and muonrt would load the opt
    library): every such command in the docs passes --symlink_prefix=/."""
    bad = []
    for path in DOCS:
        for n, line in enumerate(open(path), 1):
            if re.search(r"\bbazel build -c opt\b", line) and \
                    "--symlink_prefix=/" not in line:
                bad.append(f"{os.path.relpath(path, REPO)}:{n}: {line.strip()}")
    assert bad == [], "\n".join(bad)


def test_port_files_are_waited_for_before_they_are_read():
    """A block that starts a daemon with --port_file F in the background
    waits until F is written before it reads F (the user guide's daemon
    block read an empty file: `address=127.0.0.1:`)."""
    bad = []
    for path in DOCS:
        text = open(path).read()
        for block in re.findall(r"```[^\n]*\n(.*?)```", text, re.S):
            m = re.search(r"--port_file[ =](\S+)[^\n]*&\s*$", block, re.M)
            if not m:
                continue
            f = m.group(1)
            read = block.find(f"$(cat {f})")
            wait = block.find(f"-s {f}")
            if read >= 0 and not (0 <= wait < read):
                bad.append(f"{os.path.relpath(path, REPO)}: reads {f} "
                           f"without waiting for it")
    assert bad == [], "\n".join(bad)


DOC_BLOCKS = os.path.join(REPO, "tools", "doc_blocks.py")
# The documents whose command blocks the test command runs
# (tools/run_tests.sh): every shell and python block in them is run or says
# why not.
RUN_DOCS = ["README.md", "python/README.md", "docs/user_guide.md"]


def run_doc_blocks(*args, timeout=120):
    return subprocess.run([sys.executable, DOC_BLOCKS, *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def test_every_command_block_of_the_run_documents_is_marked():
    r = run_doc_blocks("--list", *RUN_DOCS)
    assert r.returncode == 0, r.stderr
    runs = [line for line in r.stdout.splitlines()
            if line.endswith(" runs")]
    assert len(runs) >= 12, r.stdout


def test_unmarked_command_block_is_refused_with_its_line(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("# t\n\n```json\n{}\n```\n\nText.\n\n```\necho hi\n```\n")
    r = run_doc_blocks("--list", str(doc))
    assert r.returncode == 2
    assert f"{doc}:9: shell block without a marker" in r.stderr


def test_blocks_share_one_session_and_a_failure_stops_the_rest(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "<!-- doc-test file=greet.py -->\n```python\nprint('hello')\n```\n"
        "<!-- doc-test expect=\"hello\" -->\n```\nx=1; /usr/bin/python3 "
        "greet.py\n```\n"
        "<!-- doc-test expect=\"x is 1\" -->\n```\necho \"x is $x\"\n```\n"
        "<!-- doc-test expect=\"absent\" -->\n```\necho present\n```\n"
        "<!-- doc-test -->\n```\nfalse\necho after\n```\n"
        "<!-- doc-test -->\n```\necho never\n```\n"
        "<!-- doc-not-run: needs two hosts -->\n```\nssh other\n```\n")
    r = run_doc_blocks(str(doc))
    assert r.returncode == 1, r.stdout + r.stderr
    out = r.stdout
    assert f"{doc}:2 OK (wrote greet.py)" in out
    assert f"{doc}:6 OK (ran)" in out
    assert f"{doc}:10 OK (ran)" in out  # the variable of the block before
    assert f"{doc}:14 FAILED (output lacks 'absent')" in out
    assert f"{doc}:18 FAILED (exit 1)" in out
    assert f"{doc}:23 FAILED (not reached)" in out
    assert f"{doc}:27 not run: needs two hosts" in out
    assert "    after" not in out  # set -e stopped the block at `false`
    assert out.strip().endswith("3 passed, 3 failed")


def test_a_block_that_hangs_is_stopped_at_the_timeout(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- doc-test -->\n```\nsleep 300 &\nsleep 300\n```\n")
    start = time.monotonic()
    r = run_doc_blocks("--timeout_s", "2", str(doc))
    assert time.monotonic() - start < 30
    assert r.returncode == 1
    assert "FAILED (timed out after 2.0 s)" in r.stdout


def test_cpu_only_markers_match_the_options_refused_on_cuda():
    """The features the code refuses with CUDA parameters (kCpuOnlyOptions
    in client/muon_options.h, each refused by name: resolve_options_test)
    are exactly those the user guide and python/README.md mark with
    <!-- cpu-only: NAME -->, and each such file says "in this version"."""
    header = open(os.path.join(REPO, "client", "muon_options.h")).read()
    m = re.search(r"kCpuOnlyOptions = \{([^}]*)\}", header)
    assert m, "client/muon_options.h has no kCpuOnlyOptions list"
    refused = set(re.findall(r'"([a-z_]+)"', m.group(1)))
    assert refused, "kCpuOnlyOptions is empty"
    for rel in ("docs/user_guide.md", "python/README.md"):
        text = open(os.path.join(REPO, rel)).read()
        marked = set(re.findall(r"<!-- cpu-only: ([a-z_]+) -->", text))
        assert marked == refused, (
            f"{rel} marks {sorted(marked)} as CPU-only but the code refuses "
            f"{sorted(refused)} on CUDA")
        assert "in this version" in text, rel
    all_marked = set()
    for path in DOCS:
        all_marked |= set(re.findall(r"<!-- cpu-only: ([a-z_]+) -->",
                                     open(path).read()))
    assert all_marked <= refused, (
        f"markers for features the code no longer refuses: "
        f"{sorted(all_marked - refused)}")

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


# The project's command-line programs, their path under bazel-bin, and
# how they print every flag.
PROGRAMS = {
    "muonctl": ("tools/muonctl", "cli11"),
    "muonrun": ("tools/muonrun", "muonrun"),
    "muon-coordinator": ("server/muon-coordinator", "absl"),
    "ns_bench": ("tools/ns_bench", "absl"),
    "ns_gpu_bench": ("tools/ns_gpu_bench", "absl"),
    "step_bench": ("tools/step_bench", "absl"),
    "plan_scale_bench": ("tools/plan_scale_bench", "absl"),
    "coordinator_load_bench": ("tools/coordinator_load_bench", "absl"),
}
FLAG = re.compile(r"^--([A-Za-z0-9][A-Za-z0-9_-]*)")


def _help_text(path, kind, sub=None):
    if kind == "cli11":
        args = [path, sub, "--help"] if sub else [path, "--help"]
    elif kind == "absl":
        args = [path, "--helpfull"]
    else:
        args = [path, "--help"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    return out.stdout + out.stderr


def _flags_in(text):
    return {m.replace("-", "_") for m in re.findall(r"--([A-Za-z0-9_-]+)", text)}


def _doc_commands():
    """(doc:line, program, subcommand, [flags]) for every use of a program
    in the docs' code: the lines of code blocks and the inline code spans
    elsewhere. A command line is cut at pipes, `&&`, `;` and `&`, and the
    flags are those after the program (muonrun's end at its `program`
    argument)."""
    uses = set()
    for path in DOCS:
        rel = os.path.relpath(path, REPO)
        in_block = False
        lines = open(path).read().replace("\\\n", " ").split("\n")
        for n, line in enumerate(lines, 1):
            if line.lstrip().startswith("```"):
                in_block = not in_block
                continue
            spans = [line] if in_block else re.findall(r"`([^`]+)`", line)
            for span in spans:
                for part in re.split(r"\|\||\||&&|;|&(?!\S)", span):
                    for use in _uses_in(part.split(), f"{rel}:{n}"):
                        uses.add(use)
    return sorted(uses, key=str)


def _uses_in(tokens, where):
    for i, tok in enumerate(tokens):
        name = os.path.basename(tok)
        if name not in PROGRAMS:
            continue
        rest = tokens[i + 1:]
        sub = None
        if name == "muonctl" and rest and not rest[0].startswith("-"):
            sub, rest = rest[0], rest[1:]
        flags = []
        j = 0
        while j < len(rest):
            m = FLAG.match(rest[j])
            if m:
                flags.append(m.group(1).split("=")[0])
            elif name == "muonrun" and not rest[j].startswith("-") and (
                    j == 0 or not FLAG.match(rest[j - 1]) or
                    "=" in rest[j - 1] or rest[j - 1] in ("--standalone",
                                                          "--no-rank-prefix")):
                break  # the program muonrun starts, with its own flags
            j += 1
        yield where, name, sub, tuple(flags)
        return


def test_every_documented_flag_is_one_the_program_takes():
    """Each flag the docs give muonctl (per subcommand), muonrun, the
    daemon and the benchmarks is in that program's own --help (absl's
    --helpfull; `--noX` for a boolean X; `-` and `_` alike)."""
    helps = {}
    missing = []
    bad = []
    for where, name, sub, flags in _doc_commands():
        if not flags:
            continue
        rel, kind = PROGRAMS[name]
        path = os.path.join(REPO, "bazel-bin", rel)
        if not os.path.exists(path):
            missing.append(rel)
            continue
        key = (name, sub)
        if key not in helps:
            helps[key] = _flags_in(_help_text(path, kind, sub))
        known = helps[key]
        for flag in flags:
            f = flag.replace("-", "_")
            if f in known or f == "help" or (f.startswith("no") and
                                             f[2:] in known):
                continue
            bad.append(f"{where}: {name}{' ' + sub if sub else ''} --{flag}")
    if missing and not helps:
        import pytest
        pytest.skip("not built: " + ", ".join(sorted(set(missing))) +
                    " (bash tools/run_tests.sh builds them first)")
    # Some built and some not: the unbuilt ones' flags would go unchecked.
    assert not missing, ("documented programs not built: " +
                         ", ".join(sorted(set(missing))))
    assert bad == [], "flags the programs do not take:\n" + "\n".join(bad)

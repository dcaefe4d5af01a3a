#!/usr/bin/env python3
"""Runs the command blocks of the project's Markdown documents as written.

Every shell block (a fence with no language, ``sh``, ``bash`` or
``console``) and every ``python`` block of a document given on the command
line must be preceded by one marker line:

  <!-- doc-test -->                  run it
  <!-- doc-test file=train.py -->    write it to train.py (for later blocks)
  <!-- doc-test expect="TEXT" -->    run it; its output must contain TEXT
  <!-- doc-not-run: REASON -->       leave it, saying why (two hosts, ...)

Blocks in other languages (json, cpp, text) are not commands and need no
marker. An unmarked command block is an error, so a new block is either
tested or says why not.

The runnable blocks of one document run in order in ONE bash session, as a
reader types them: variables, exported secrets and background jobs carry
from block to block. Shell blocks are sourced with `set -e`; a python
block runs as `PYTHONPATH=python /usr/bin/python3 block.py`. The session
runs in a scratch directory holding a symbolic link to every entry of the
repository root (so `bazel-bin/...`, `python`, `examples/...` resolve and
whatever the blocks write stays out of the repository); `bazel` runs in the
repository itself, so the blocks share its build. The session is bounded
by --timeout_s (DOC_TEST_TIMEOUT_S, default 600) and everything it leaves
running (its process group) is stopped.

Prints one line per block and, last, "N passed, N failed"; a block after
a failed one counts as failed (not reached). Exit status 1 on any failure,
2 on an unmarked block or a bad marker.

  --list   check the markers and list the blocks without running them.
"""
import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHELL_LANGUAGES = {"", "sh", "bash", "console", "shell"}
MARKER = re.compile(r"^<!--\s*(doc-test|doc-not-run)\b(.*?)-->\s*$")
# Entries of the repository root the scratch directory does not link: with
# them bazel would take the scratch directory for a workspace of its own.
NOT_LINKED = {".git", "WORKSPACE", "WORKSPACE.bazel", "MODULE.bazel",
              ".bazelrc", ".bazelversion", "BUILD.bazel", "BUILD"}


class MarkerError(Exception):
    pass


class Block:
    """One fenced block: where it is, its language, text and marker."""

    def __init__(self, path, line, language, text, marker):
        self.path, self.line, self.language = path, line, language
        self.text, self.kind = text, marker[0] if marker else None
        self.file = self.expect = self.reason = None
        if self.kind == "doc-not-run":
            self.reason = marker[1].lstrip(":").strip()
            if not self.reason:
                raise MarkerError(f"{self.where}: doc-not-run needs a reason")
        elif self.kind == "doc-test":
            self._parse_options(marker[1])

    @property
    def where(self):
        return f"{self.path}:{self.line}"

    def _parse_options(self, text):
        for item in shlex.split(text.lstrip(":")):
            key, _, value = item.partition("=")
            if key == "file" and value and "/" not in value:
                self.file = value
            elif key == "expect" and value:
                self.expect = value
            else:
                raise MarkerError(f"{self.where}: doc-test option {item!r}: "
                                  "expected file=NAME or expect=TEXT")

    @property
    def is_command(self):
        return self.language in SHELL_LANGUAGES or self.language == "python"


def parse_blocks(path):
    """The fenced blocks of a Markdown file, each with the marker line
    (the last non-blank line before its opening fence), if any."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    blocks, i, previous = [], 0, ""
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            language, start = line[3:].strip(), i
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            if j == len(lines):
                raise MarkerError(f"{path}:{start + 1}: unclosed fence")
            m = MARKER.match(previous.strip())
            marker = (m.group(1), m.group(2)) if m else None
            blocks.append(Block(path, start + 1, language,
                                "\n".join(lines[start + 1:j]) + "\n", marker))
            i, previous = j + 1, ""
            continue
        if line.strip():
            previous = line
        i += 1
    return blocks


def check_markers(blocks):
    """Raises MarkerError for a command block without a marker, or a marker
    on a block that is not a command."""
    for b in blocks:
        if b.is_command and b.kind is None:
            raise MarkerError(
                f"{b.where}: {b.language or 'shell'} block without a marker: "
                "precede it with <!-- doc-test --> or <!-- doc-not-run: "
                "REASON -->")
        if not b.is_command and b.kind is not None:
            raise MarkerError(f"{b.where}: marker on a {b.language} block")


def make_scratch_dir():
    scratch = tempfile.mkdtemp(prefix="doc-blocks.")
    work = os.path.join(scratch, "work")
    os.mkdir(work)
    for name in sorted(os.listdir(REPO)):
        if name not in NOT_LINKED:
            os.symlink(os.path.join(REPO, name), os.path.join(work, name))
    return scratch, work


def write_session(blocks, scratch, work):
    """The session script; block i logs to out_i.log and writes i to the
    progress file before it starts."""
    progress = os.path.join(scratch, "progress")
    lines = ["set -e",
             f"bazel() {{ (cd {shlex.quote(REPO)} && command bazel \"$@\"); }}",
             f"cd {shlex.quote(work)}"]
    for i, b in enumerate(blocks):
        log = os.path.join(scratch, f"out_{i}.log")
        step = f"echo {i} > {shlex.quote(progress)}"
        if b.file:
            target = os.path.join(work, b.file)
            with open(target, "w", encoding="utf-8") as f:
                f.write(b.text)
            continue
        source = os.path.join(scratch, f"block_{i}" +
                              (".py" if b.language == "python" else ".sh"))
        with open(source, "w", encoding="utf-8") as f:
            f.write(b.text)
        if b.language == "python":
            run = (f"PYTHONPATH=python /usr/bin/python3 {shlex.quote(source)}")
        else:
            run = f"source {shlex.quote(source)}"
        lines.append(f"{step}; {run} > {shlex.quote(log)} 2>&1")
    lines.append(f"echo done > {shlex.quote(progress)}")
    path = os.path.join(scratch, "session.sh")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path, progress


def stop_group(pid):
    """SIGTERM the session's process group, then SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        time.sleep(0.3)


def run_document(path, timeout_s):
    """Runs one document's blocks; returns (passed, failed)."""
    blocks = [b for b in parse_blocks(path) if b.is_command]
    check_markers(blocks)
    for b in blocks:
        if b.kind == "doc-not-run":
            print(f"doc_blocks: {b.where} not run: {b.reason}")
    runnable = [b for b in blocks if b.kind == "doc-test"]
    if not runnable:
        return 0, 0
    scratch, work = make_scratch_dir()
    script, progress = write_session(runnable, scratch, work)
    start = time.time()
    session = subprocess.Popen(["bash", script], cwd=work,
                               stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        rc = session.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        rc = None
    stop_group(session.pid)
    session.wait()
    reached = open(progress).read().strip() if os.path.exists(progress) \
        else "0"
    last = len(runnable) if reached == "done" else int(reached)
    passed = failed = 0
    for i, b in enumerate(runnable):
        log = os.path.join(scratch, f"out_{i}.log")
        output = open(log, errors="replace").read() \
            if os.path.exists(log) else ""
        if b.file:
            ok, why = True, ""
        elif i < last:
            ok = b.expect is None or b.expect in output
            why = f"output lacks {b.expect!r}"
        elif i == last:
            ok = False
            why = (f"timed out after {timeout_s} s" if rc is None
                   else f"exit {rc}")
        else:
            ok, why = False, "not reached"
        what = f"wrote {b.file}" if b.file else "ran"
        if ok:
            passed += 1
            print(f"doc_blocks: {b.where} OK ({what})")
        else:
            failed += 1
            print(f"doc_blocks: {b.where} FAILED ({why}); its output:")
            for line in output.splitlines()[-60:]:
                print(f"    {line}")
    print(f"doc_blocks: {path}: {time.time() - start:.0f} s")
    subprocess.run(["rm", "-rf", scratch], check=False)
    return passed, failed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("documents", nargs="+")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--timeout_s", type=float, default=float(
        os.environ.get("DOC_TEST_TIMEOUT_S", "600")))
    args = parser.parse_args()
    try:
        if args.list:
            for path in args.documents:
                blocks = [b for b in parse_blocks(path) if b.is_command]
                check_markers(blocks)
                for b in blocks:
                    state = (f"not run: {b.reason}" if b.reason else
                             f"writes {b.file}" if b.file else "runs")
                    print(f"{b.where} {b.language or 'shell'} {state}")
            return 0
        passed = failed = 0
        for path in args.documents:
            p, f = run_document(path, args.timeout_s)
            passed, failed = passed + p, failed + f
    except MarkerError as e:
        print(f"doc_blocks: {e}", file=sys.stderr)
        return 2
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())

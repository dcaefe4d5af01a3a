"""Checks on the docs a new user copies from: commands that would leave the
other commands broken, and blocks that race what they start."""
import glob
import os
import re

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

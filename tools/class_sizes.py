#!/usr/bin/env python3
"""Data members and methods of the optimizer's main classes at a git
revision (default HEAD), counted from their headers: a declaration with a
parameter list is a method, one naming a trailing-underscore field a member
(nested structs and comments left out). Usage: class_sizes.py [REV]."""
import re
import subprocess
import sys

CLASSES = [("client/muon.h", "Muon"), ("client/step_executor.h", "StepExecutor"),
           ("client/step_pipeline.h", "StepPipeline"),
           ("client/optimizer_state.h", "OptimizerState"),
           ("client/qk_clipper.h", "QkClipper")]


def body(text, cls):
    i = text.index("\nclass " + cls + " ")
    j = text.index("{", i)
    depth, k = 0, j
    while True:
        depth += {"{": 1, "}": -1}.get(text[k], 0)
        if depth == 0:
            return text[j + 1:k]
        k += 1


def count(text, cls):
    b = re.sub(r"\n  struct [^\n]*\{.*?\n  \};", "", body(text, cls), flags=re.S)
    b = re.sub(r"//[^\n]*", "", b)
    members = methods = 0
    for st in re.split(r";|\{[^{}]*\}", b):
        st = " ".join(st.split())
        if st.startswith(("public", "private", "protected")):
            st = st.split(":", 1)[-1].strip()
        if not st or (st.startswith(("using ", "friend ", "template")) and "(" not in st):
            continue
        if "(" in st and not re.search(r"[a-z0-9]_\s*(=|\{|$)", st.split("(")[0]):
            methods += 1
        elif re.search(r"[A-Za-z0-9]_\s*(=.*)?$", st):
            members += 1
    return members, methods


def main():
    rev = sys.argv[1] if len(sys.argv) > 1 else "HEAD"
    for path, cls in CLASSES:
        shown = subprocess.run(["git", "show", f"{rev}:{path}"],
                               capture_output=True, text=True)
        if shown.returncode != 0:
            continue  # not at this revision
        members, methods = count(shown.stdout, cls)
        print(f"{cls}: {members} members, {methods} methods")


if __name__ == "__main__":
    main()

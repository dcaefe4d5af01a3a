#!/usr/bin/env python3
"""Function lengths of a tree (outside tests/): C++ top-level definitions
(a line at column 0 that opens a body ending at a column-0 '}'), Python
functions by ast. Prints the count over N lines and the longest."""
import ast, os, re, subprocess, sys
root = sys.argv[1]; limit = int(sys.argv[2]) if len(sys.argv) > 2 else 80
files = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True).stdout.split()
out = []
for f in files:
    if f.startswith(("tests/", "third_party/", "fuzz/")) or "/test" in f:
        continue
    path = os.path.join(root, f)
    if f.endswith((".cc", ".h", ".cu")):
        lines = open(path, errors="replace").read().split("\n")
        i = 0
        while i < len(lines):
            l = lines[i]
            if l and not l[0].isspace() and not l.startswith(("//", "#", "}", "namespace", "class", "struct", "enum", "using", "template", "static_assert", "extern", "/*", " *")) and "(" in l:
                # find the opening brace of a definition
                j = i
                while j < len(lines) and "{" not in lines[j] and not lines[j].rstrip().endswith(";"):
                    j += 1
                if j < len(lines) and "{" in lines[j] and not lines[j].rstrip().endswith(";"):
                    k = j
                    while k < len(lines) and lines[k] != "}" and not (k > j and lines[k].startswith("}")):
                        if lines[k].rstrip().endswith("}") and k == j: break
                        k += 1
                    n = k - i + 1
                    name = re.sub(r"\s+", " ", l.split("(")[0]).split(" ")[-1]
                    out.append((n, f"{f}:{i+1} {name}"))
                    i = k + 1
                    continue
            i += 1
    elif f.endswith(".py"):
        try:
            tree = ast.parse(open(path).read())
        except Exception:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((node.end_lineno - node.lineno + 1, f"{f}:{node.lineno} {node.name}"))
big = sorted([o for o in out if o[0] > limit], reverse=True)
print(f"{len(big)} functions over {limit} lines (of {len(out)})")
for n, w in big[:40]:
    print(f"  {n:4d} {w}")

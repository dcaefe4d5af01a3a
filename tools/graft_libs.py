#!/usr/bin/env python3
"""Makes a self-contained copy of libmuonrt.so (and of binaries) that loads
next to any PyTorch: every shared library it needs beyond the C and C++
runtimes is copied beside it under a name of our own, the way auditwheel
grafts a wheel's libraries.

    python3 tools/graft_libs.py --out DIR bazel-bin/capi/libmuonrt.so ...

For each input (a shared library or an executable), the transitive NEEDED
closure (as the dynamic loader resolves it here, `ldd`) is split into:
  - kept outside: glibc's libraries, the dynamic loader, libstdc++ and
    libgcc_s, and the CUDA / NCCL libraries of CUDA builds (the machine's
    own; see KEEP);
  - grafted: everything else (Gloo and its RDMA/Redis deps, gRPC, protobuf,
    Abseil, OpenBLAS, re2, c-ares, OpenSSL, zlib, ...): copied into DIR as
    lib<name>-muonrt.so.<version> (a soname no other library uses, so the
    loader never takes PyTorch's copy of the same soname for ours).
Then, with Debian's patchelf, every NEEDED entry naming a grafted library
is rewritten to the new name, each grafted library gets its new SONAME, and
every file gets RUNPATH $ORIGIN (libraries) or $ORIGIN/../lib (executables
copied into DIR/bin when --bin is given), followed by the system folders
(under /usr/) it named before, such as CUDA's /usr/local/cuda/lib64. Names are unchanged inside the
libraries (the symbols); which copy a symbol binds to is decided by the
loader's scope: muonrt loads the library with RTLD_LOCAL | RTLD_DEEPBIND
(python/muonrt/_lib.py), so its own scope, with the grafted copies, comes
before any library PyTorch loaded.

Prints one line per file: what it is and its NEEDED list after grafting.
Exit status 1 with a message on any failure (a missing tool, a library the
loader cannot find).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

# Sonames (by prefix) that stay outside: the runtime every process shares,
# and the machine's CUDA / NCCL (they match its driver).
KEEP = (
    "linux-vdso.so", "ld-linux", "libc.so", "libm.so", "libdl.so",
    "librt.so", "libpthread.so", "libutil.so", "libresolv.so",
    "libstdc++.so", "libgcc_s.so",
    "libcuda.so", "libcudart.so", "libcublas.so", "libcublasLt.so",
    "libnccl.so", "libnvidia-",
)


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: "
                           f"{p.stderr.strip()}")
    return p.stdout


def needed(path):
    """The NEEDED entries of `path` (readelf -d)."""
    out = run(["readelf", "-d", path])
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def resolved(path):
    """soname -> resolved path for the whole closure of `path` (ldd)."""
    out = run(["ldd", path])
    libs = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) => (\S+) \(", line)
        if m:
            libs[m.group(1)] = m.group(2)
        elif "=> not found" in line:
            raise RuntimeError(f"{path}: the loader cannot find "
                               f"{line.split()[0]}")
    return libs


def kept(soname):
    return soname.startswith(KEEP)


def grafted_name(soname):
    """libgloo.so.0 -> libgloo-muonrt.so.0."""
    base, sep, version = soname.partition(".so")
    return f"{base}-muonrt.so{version}"


def patch(path, renames, runpath):
    """Renames the grafted NEEDED entries of `path` and sets its RUNPATH to
    `runpath` followed by the system folders it had (e.g. the CUDA
    toolkit's /usr/local/cuda/lib64 in CUDA builds)."""
    for old in needed(path):
        if old in renames:
            run(["patchelf", "--replace-needed", old, renames[old], path])
    before = run(["patchelf", "--print-rpath", path]).strip()
    keep = [d for d in before.split(":") if d.startswith("/usr/")]
    run(["patchelf", "--set-rpath", ":".join([runpath] + keep), path])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--bin", nargs="*", default=[],
                    help="executables to copy into OUT/bin")
    ap.add_argument("libs", nargs="*", help="shared libraries to copy")
    args = ap.parse_args()
    for tool in ("patchelf", "readelf", "ldd"):
        if shutil.which(tool) is None:
            sys.exit(f"graft_libs: {tool} not found (apt-get install "
                     f"{'patchelf' if tool == 'patchelf' else 'binutils'})")
    inputs = [(p, False) for p in args.libs] + [(p, True) for p in args.bin]
    closure = {}
    try:
        for path, _ in inputs:
            closure.update(resolved(path))
    except RuntimeError as e:
        sys.exit(f"graft_libs: {e}")
    to_graft = {s: p for s, p in closure.items() if not kept(s)}
    renames = {s: grafted_name(s) for s in to_graft}
    lib_dir = os.path.join(args.out, "lib") if args.bin else args.out
    os.makedirs(lib_dir, exist_ok=True)
    try:
        for soname, src in sorted(to_graft.items()):
            dst = os.path.join(lib_dir, renames[soname])
            shutil.copyfile(os.path.realpath(src), dst)
            os.chmod(dst, 0o755)
            run(["patchelf", "--set-soname", renames[soname], dst])
            patch(dst, renames, "$ORIGIN")
        for path, is_bin in inputs:
            where = os.path.join(args.out, "bin") if is_bin else lib_dir
            os.makedirs(where, exist_ok=True)
            dst = os.path.join(where, os.path.basename(path))
            shutil.copyfile(path, dst)
            os.chmod(dst, 0o755)
            patch(dst, renames, "$ORIGIN/../lib" if is_bin else "$ORIGIN")
            print(f"{dst}: NEEDED {' '.join(needed(dst))}")
    except RuntimeError as e:
        sys.exit(f"graft_libs: {e}")
    print(f"graft_libs: {len(to_graft)} libraries grafted into {lib_dir}")


if __name__ == "__main__":
    main()

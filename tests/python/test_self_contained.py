"""The self-contained libmuonrt.so (tools/graft_libs.py, in
python/muonrt/lib) and tools (python/muonrt/bin: muonrun, muonctl): they
need nothing outside the package but the C and C++ runtimes, every library
beside them was renamed (so no soname clashes with a PyTorch process's own
Gloo, protobuf, Abseil or OpenBLAS), the library exports the C ABI only,
and the tools start on a system without the build's libraries (the
PyTorch 2.x chroot runs this file too). Runs on any Python (no torch
needed)."""
import os
import re
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
LIB_DIR = os.path.join(REPO, "python", "muonrt", "lib")
LIBRARY = os.path.join(LIB_DIR, "libmuonrt.so")
BIN_DIR = os.path.join(REPO, "python", "muonrt", "bin")
# The runtime every process shares: glibc's own libraries (one file on
# Debian 12, several on Ubuntu, where libc.so.6 still pulls in librt,
# libdl, libpthread, ...), libstdc++ and libgcc_s, and, in CUDA builds, the
# machine's CUDA and NCCL libraries.
SYSTEM = re.compile(r"^(libc\.so\.6|libm\.so\.6|libdl\.so\.2|"
                    r"libpthread\.so\.0|librt\.so\.1|libresolv\.so\.2|"
                    r"libutil\.so\.1|libstdc\+\+\.so\.6|"
                    r"libgcc_s\.so\.1|ld-linux-x86-64\.so\.2|"
                    r"libcudart\.so\..*|libcublas(Lt)?\.so\..*|"
                    r"libnccl\.so\..*|libcuda\.so\..*)$")


def needed(path):
    out = subprocess.run(["readelf", "-d", path], check=True,
                         capture_output=True, text=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


@pytest.fixture
def library():
    for tool in ("readelf", "nm", "ldd"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (binutils)")
    if not os.path.isfile(LIBRARY):
        pytest.skip("python/muonrt/lib is not made: "
                    "python3 tools/graft_libs.py --out python/muonrt/lib "
                    "bazel-bin/capi/libmuonrt.so")
    return LIBRARY


def test_needed_only_system_runtime_and_grafted_copies(library):
    grafted = sorted(f for f in os.listdir(LIB_DIR) if "-muonrt.so" in f)
    assert any(f.startswith("libgloo-muonrt.so") for f in grafted)
    tools = [os.path.join(BIN_DIR, t) for t in ("muonrun", "muonctl")
             if os.path.isfile(os.path.join(BIN_DIR, t))]
    outside = set()
    for f in ["libmuonrt.so"] + grafted + tools:
        for n in needed(os.path.join(LIB_DIR, f)):
            if n in grafted:
                continue
            assert SYSTEM.match(n), f"{f} needs {n}, neither grafted nor system"
            outside.add(n)
    print(f"libmuonrt.so NEEDED: {' '.join(needed(library))}")
    print(f"{len(grafted)} grafted libraries; outside: {sorted(outside)}")


def test_every_grafted_library_has_its_new_soname_and_origin_runpath(library):
    for f in os.listdir(LIB_DIR):
        if "-muonrt.so" not in f and f != "libmuonrt.so":
            continue
        out = subprocess.run(["readelf", "-d", os.path.join(LIB_DIR, f)],
                             check=True, capture_output=True, text=True).stdout
        if f != "libmuonrt.so":
            assert f"Library soname: [{f}]" in out, f
        assert re.search(r"runpath: \[\$ORIGIN[]:]", out), \
            f"{f}: RUNPATH does not start with $ORIGIN"


def test_loader_finds_everything_inside_the_folder(library):
    out = subprocess.run(["ldd", library], check=True, capture_output=True,
                         text=True).stdout
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) => (\S+)", line)
        if not m or SYSTEM.match(m.group(1)):
            continue
        assert os.path.dirname(m.group(2)) == LIB_DIR, line


def test_exports_only_the_c_abi(library):
    out = subprocess.run(["nm", "-D", "--defined-only", library], check=True,
                         capture_output=True, text=True).stdout
    names = [line.split()[-1] for line in out.splitlines() if line.strip()]
    others = [n for n in names if not n.startswith("muonrt_")]
    print(f"{len(names)} exported symbols")
    assert len(names) >= 20
    assert others == []


@pytest.mark.parametrize("tool", ["muonrun", "muonctl"])
def test_tool_starts_with_only_the_package_libraries(tool):
    path = os.path.join(BIN_DIR, tool)
    if not os.path.isfile(path):
        pytest.skip(f"{path} is not made (tools/graft_libs.py --bin)")
    r = subprocess.run([path, "--help"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert tool in (r.stdout + r.stderr)

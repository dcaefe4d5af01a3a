"""The self-contained libmuonrt.so (tools/graft_libs.py, in
python/muonrt/lib): it needs nothing outside its folder but the C and C++
runtimes, every library beside it was renamed (so no soname clashes with a
PyTorch process's own Gloo, protobuf, Abseil or OpenBLAS), and it exports
the C ABI only. Runs on any Python (no torch needed)."""
import os
import re
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
LIB_DIR = os.path.join(REPO, "python", "muonrt", "lib")
LIBRARY = os.path.join(LIB_DIR, "libmuonrt.so")
# The runtime every process shares (and, in CUDA builds, the machine's
# CUDA and NCCL libraries).
SYSTEM = re.compile(r"^(libc\.so\.6|libm\.so\.6|libstdc\+\+\.so\.6|"
                    r"libgcc_s\.so\.1|ld-linux-x86-64\.so\.2|"
                    r"libcudart\.so\..*|libcublas(Lt)?\.so\..*|"
                    r"libnccl\.so\..*|libcuda\.so\..*)$")


def needed(path):
    out = subprocess.run(["readelf", "-d", path], check=True,
                         capture_output=True, text=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


@pytest.fixture
def library():
    if not os.path.isfile(LIBRARY):
        pytest.skip("python/muonrt/lib is not made: "
                    "python3 tools/graft_libs.py --out python/muonrt/lib "
                    "bazel-bin/capi/libmuonrt.so")
    return LIBRARY


def test_needed_only_system_runtime_and_grafted_copies(library):
    grafted = sorted(f for f in os.listdir(LIB_DIR) if "-muonrt.so" in f)
    assert any(f.startswith("libgloo-muonrt.so") for f in grafted)
    outside = set()
    for f in ["libmuonrt.so"] + grafted:
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

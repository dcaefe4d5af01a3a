"""pytest setup for the muonrt package tests.

Run from the repository root:
    PYTHONPATH=python MUONRT_LIBRARY=bazel-bin/capi/libmuonrt.so \
        /usr/bin/python3 -m pytest tests/python
Tests that need libmuonrt skip with a reason when it is not built and
MUONRT_LIBRARY is unset; a MUONRT_LIBRARY that names a missing file fails
them instead.
"""
import os
import socket
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, HERE)


def library_or_skip():
    import muonrt
    from muonrt import _lib
    if not os.environ.get("MUONRT_LIBRARY"):
        try:
            _lib._find()
        except _lib.LibraryNotFoundError as e:
            pytest.skip(f"libmuonrt.so is not built: {e}")
    return muonrt.library_path()


@pytest.fixture
def lib():
    return library_or_skip()


# The PyTorch 2.x suite (tests/python/torch2; tools/torch2_env.sh runs it
# in a Debian sid chroot) is skipped with its reason on an older torch
# (Debian 12's 1.13).
TORCH2_DIR = os.path.join(HERE, "torch2")


def _torch_version():
    import torch
    return tuple(int(x) for x in
                 torch.__version__.split("+")[0].split(".")[:2])


def pytest_report_header(config):
    import torch
    return (f"torch {torch.__version__}, Python {sys.version.split()[0]}")


def pytest_collection_modifyitems(config, items):
    import torch
    if _torch_version() >= (2, 6):
        return
    skip = pytest.mark.skip(
        reason=f"needs PyTorch >= 2.6 (FSDP2, DTensor, torch.optim.Muon); "
               f"this is {torch.__version__}: tools/torch2_env.sh runs it")
    for item in items:
        if str(item.fspath).startswith(TORCH2_DIR):
            item.add_marker(skip)


def free_port_pair():
    """A port P with P and P+1 free (the embedded coordinator takes
    MASTER_PORT+1, MASTER_PORT stays torch.distributed's)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port >= 65535:
            continue
        try:
            with socket.socket() as s2:
                s2.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair")

"""The PyTorch 2.x suite (tools/torch2_env.sh runs it in a Debian sid
chroot): skipped with its reason on an older torch (Debian 12's 1.13)."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _version():
    return tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])


def pytest_report_header(config):
    return (f"torch {torch.__version__}, Python {sys.version.split()[0]} "
            f"(PyTorch 2.x suite: tests/python/torch2)")


def pytest_collection_modifyitems(config, items):
    if _version() >= (2, 6):
        return
    skip = pytest.mark.skip(
        reason=f"needs PyTorch >= 2.6 (FSDP2, DTensor, torch.optim.Muon); "
               f"this is {torch.__version__}: tools/torch2_env.sh runs it")
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(skip)

"""pytest setup for the muonrt package tests.

Run from the repository root:
    PYTHONPATH=python MUONRT_LIBRARY=bazel-bin/capi/libmuonrt.so \
        /usr/bin/python3 -m pytest tests/python
Tests that need libmuonrt skip with a reason when it is not built and
MUONRT_LIBRARY is unset; a MUONRT_LIBRARY that names a missing file fails
them instead.
"""
import os
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

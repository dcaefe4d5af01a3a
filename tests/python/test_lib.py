"""muonrt._lib: finding the library, ABI version, status -> exception."""
import os
import shutil
import subprocess
import sys

import pytest
import torch

import muonrt
from muonrt import _lib

from conftest import REPO

PY = sys.executable
TIMEOUT = 60


def run_py(code, env_update, cwd=None):
    env = dict(os.environ)
    for k, v in env_update.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return subprocess.run([PY, "-c", code], env=env, cwd=cwd, timeout=TIMEOUT,
                          capture_output=True, text=True)


def test_import_without_library_then_clear_error():
    r = run_py("import muonrt, torch\n"
               "try:\n"
               "    muonrt.Muon([('w', torch.zeros(2, 2))])\n"
               "except muonrt.LibraryNotFoundError as e:\n"
               "    print('ERR', e)\n",
               {"MUONRT_LIBRARY": "/nonexistent/libmuonrt.so",
                "PYTHONPATH": os.path.join(REPO, "python")})
    assert r.returncode == 0, r.stderr
    assert "ERR MUONRT_LIBRARY='/nonexistent/libmuonrt.so': no such file" in r.stdout


def test_abi_version_and_path(lib):
    assert muonrt.abi_version() == muonrt.ABI_VERSION == 18
    assert os.path.isfile(muonrt.library_path())


def test_library_next_to_the_package_is_found(lib, tmp_path):
    shutil.copytree(os.path.join(REPO, "python", "muonrt"),
                    tmp_path / "muonrt",
                    ignore=shutil.ignore_patterns("__pycache__", "lib"))
    # A self-contained library (tools/graft_libs.py) comes with the
    # libraries grafted beside it.
    src = os.path.dirname(lib)
    grafted = [f for f in os.listdir(src) if "-muonrt.so" in f]
    for f in grafted:
        shutil.copy(os.path.join(src, f), tmp_path / "muonrt" / f)
    shutil.copy(lib, tmp_path / "muonrt" / "libmuonrt.so")
    r = run_py("import muonrt; print(muonrt.library_path()); "
               "print(muonrt.abi_version())",
               {"MUONRT_LIBRARY": None, "PYTHONPATH": str(tmp_path)},
               cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(tmp_path / "muonrt" / "libmuonrt.so"),
                                str(_lib.ABI_VERSION)]


def test_library_in_bazel_bin_is_found_walking_up(lib):
    built = os.path.join(REPO, "bazel-bin", "capi", "libmuonrt.so")
    if not os.path.isfile(built):
        pytest.skip("bazel-bin/capi/libmuonrt.so is not built")
    # A copy of the package without its packaged library, inside the
    # checkout (.cache/ is git-ignored), so that the walk up finds bazel-bin.
    where = os.path.join(REPO, ".cache", "walkup-test")
    shutil.rmtree(where, ignore_errors=True)
    try:
        shutil.copytree(os.path.join(REPO, "python", "muonrt"),
                        os.path.join(where, "muonrt"),
                        ignore=shutil.ignore_patterns("__pycache__", "lib"))
        r = run_py("import muonrt; print(muonrt.library_path())",
                   {"MUONRT_LIBRARY": None, "PYTHONPATH": where})
    finally:
        shutil.rmtree(where, ignore_errors=True)
    assert r.returncode == 0, r.stderr
    assert os.path.samefile(r.stdout.strip(), built)


def test_packaged_self_contained_library_is_found_first(lib):
    packaged = os.path.join(REPO, "python", "muonrt", "lib", "libmuonrt.so")
    if not os.path.isfile(packaged):
        pytest.skip("python/muonrt/lib is not made (tools/graft_libs.py)")
    r = run_py("import muonrt; print(muonrt.library_path())",
               {"MUONRT_LIBRARY": None,
                "PYTHONPATH": os.path.join(REPO, "python")})
    assert r.returncode == 0, r.stderr
    assert os.path.samefile(r.stdout.strip(), packaged)


def test_candidate_paths_order(monkeypatch):
    monkeypatch.setenv("MUONRT_LIBRARY", "/x/libmuonrt.so")
    paths = _lib.candidate_paths()
    pkg = os.path.dirname(os.path.abspath(_lib.__file__))
    assert paths[:4] == ["/x/libmuonrt.so",
                         os.path.join(pkg, "lib", "libmuonrt.so"),
                         os.path.join(pkg, "libmuonrt.so"),
                         os.path.join(os.path.dirname(pkg), "libmuonrt.so")]
    assert os.path.join(REPO, "bazel-bin", "capi", "libmuonrt.so") in paths


@pytest.mark.parametrize("code, cls, builtin", [
    (3, muonrt.InvalidArgumentError, ValueError),
    (4, muonrt.DeadlineExceededError, TimeoutError),
    (5, muonrt.NotFoundError, FileNotFoundError),
    (5, muonrt.NotFoundError, KeyError),
    (9, muonrt.FailedPreconditionError, RuntimeError),
    (11, muonrt.OutOfRangeError, IndexError),
    (12, muonrt.UnimplementedError, NotImplementedError),
    (16, muonrt.UnauthenticatedError, PermissionError),
    (13, muonrt.LibraryRuntimeError, RuntimeError),
    (14, muonrt.LibraryRuntimeError, RuntimeError),
    (15, muonrt.LibraryRuntimeError, RuntimeError),
])
def test_status_to_exception(code, cls, builtin):
    assert _lib.error_class(code) is cls
    e = cls("the message", code)
    assert isinstance(e, builtin) and isinstance(e, muonrt.MuonRTError)
    assert str(e) == "the message" and e.code == code


def test_library_error_keeps_message_and_code(lib):
    opt = muonrt.Muon([("w", torch.nn.Parameter(torch.zeros(3, 3)))])
    with pytest.raises(IndexError) as e:
        _lib.call("muonrt_optimizer_set_grad", opt._handle, 7, None)
    assert e.value.code_name == "OUT_OF_RANGE"
    assert str(e.value) == _lib.last_error() or "7" in str(e.value)
    # Success clears the message.
    _lib.call("muonrt_optimizer_set_grad", opt._handle, 0, None)
    assert _lib.last_error() == ""
    with pytest.raises(RuntimeError) as e:  # FAILED_PRECONDITION, no grad
        _lib.call("muonrt_optimizer_step", opt._handle, None)
    assert e.value.code_name == "FAILED_PRECONDITION"
    assert "w" in str(e.value)
    # A stream orders CUDA parameters' step; CPU parameters take None.
    with pytest.raises(ValueError) as e:
        _lib.call("muonrt_optimizer_step", opt._handle, 1)
    assert e.value.code_name == "INVALID_ARGUMENT"
    assert "CPU tensors" in str(e.value)


def test_init_process_group_without_environment_is_value_error(lib):
    code = ("import muonrt\n"
            "try:\n"
            "    muonrt.init_process_group(timeout=5)\n"
            "except ValueError as e:\n"
            "    print('ERR', e)\n")
    env = {k: None for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR",
                             "MASTER_PORT", "LOCAL_RANK", "MUON_COORDINATOR")}
    env["PYTHONPATH"] = os.path.join(REPO, "python")
    env["MUONRT_LIBRARY"] = lib
    r = run_py(code, env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ERR ") and "RANK" in r.stdout, r.stdout


def test_single_rank_process_group(lib):
    """A world of one through init_process_group: rank, barrier, an
    optimizer on it, destroy (which closes the optimizer)."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    code = ("import muonrt, torch\n"
            "pg = muonrt.init_process_group(timeout=20)\n"
            "assert muonrt.get_default_group() is pg\n"
            "print(pg.rank, pg.world_size)\n"
            "pg.barrier()\n"
            "w = torch.nn.Parameter(torch.randn(4, 4))\n"
            "opt = muonrt.Muon([('w', w)], lr=0.1)\n"
            "assert opt.process_group is pg and opt.mesh == muonrt.Mesh(['dp_shard'], [1])\n"
            "try:\n"
            "    muonrt.Muon([('v', torch.zeros(2, 2))], mesh=muonrt.Mesh(['dp'], [2]))\n"
            "except ValueError as e:\n"
            "    assert 'the process group has 1' in str(e), e\n"
            "w.grad = torch.randn(4, 4)\n"
            "opt.step()\n"
            "print(opt.step_count)\n"
            "muonrt.destroy_process_group()\n"
            "assert muonrt.get_default_group() is None\n"
            "try:\n"
            "    opt.step()\n"
            "except RuntimeError as e:\n"
            "    print('closed' in str(e))\n")
    r = run_py(code, {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                      "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                      "PYTHONPATH": os.path.join(REPO, "python"),
                      "MUONRT_LIBRARY": lib})
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split() == ["0", "1", "1", "True"], r.stdout + r.stderr


def test_readme_muon_signature_lists_every_constructor_argument():
    """python/README.md's Muon(...) row names every argument of
    muonrt.Muon.__init__ (a new user copies from it)."""
    import inspect
    text = open(os.path.join(REPO, "python", "README.md")).read()
    row = next(line for line in text.splitlines()
               if line.startswith("| `Muon(params"))
    for name in inspect.signature(muonrt.Muon.__init__).parameters:
        if name in ("self",):
            continue
        assert f"{name}=" in row or name == "params", \
            f"python/README.md's Muon(...) omits {name}"

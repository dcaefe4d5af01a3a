"""`pip install ./python` (pyproject.toml, setuptools) installs muonrt with
the self-contained library inside the package: `import muonrt` from the
installed copy finds muonrt/lib/libmuonrt.so with no environment variable
and steps an optimizer."""
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def test_pip_install_puts_the_library_inside_the_package(tmp_path):
    lib_dir = os.path.join(REPO, "python", "muonrt", "lib")
    if not os.path.isfile(os.path.join(lib_dir, "libmuonrt.so")):
        pytest.skip("python/muonrt/lib is not made (tools/graft_libs.py)")
    probe = subprocess.run([sys.executable, "-m", "pip", "--version"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"no pip for {sys.executable} (apt-get install "
                    f"python3-pip python3-setuptools python3-wheel)")
    src = tmp_path / "src"
    shutil.copytree(os.path.join(REPO, "python"), src,
                    ignore=shutil.ignore_patterns("__pycache__", "build",
                                                  "*.egg-info"))
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                        "--no-index", "--no-build-isolation", "--target",
                        str(target), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    grafted = sorted(os.listdir(target / "muonrt" / "lib"))
    assert "libmuonrt.so" in grafted
    assert any(f.startswith("libgloo-muonrt.so") for f in grafted)
    env = {k: v for k, v in os.environ.items()
           if k not in ("MUONRT_LIBRARY", "PYTHONPATH")}
    env["PYTHONPATH"] = str(target)
    code = ("import muonrt, torch; print(muonrt.library_path()); "
            "w = torch.nn.Parameter(torch.ones(4, 3)); "
            "opt = muonrt.Muon([('w', w)], lr=0.1); w.grad = torch.eye(4, 3); "
            "opt.step(); print(bool((w != 1).any()))")
    r = subprocess.run([sys.executable, "-c", code], env=env,
                       capture_output=True, text=True, timeout=120,
                       cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    path, stepped = r.stdout.split()
    assert path == str(target / "muonrt" / "lib" / "libmuonrt.so")
    assert stepped == "True"

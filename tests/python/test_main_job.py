"""The main job (examples/fashion_mnist_torch/train.py) on a small slice of
Fashion-MNIST: muonrun ranks vs one process, both layouts, bitwise."""
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, library_or_skip

TRAIN = os.path.join(REPO, "examples", "fashion_mnist_torch", "train.py")
DATA = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"


def run_job(*args):
    library_or_skip()
    muonrun = os.environ.get("MUONRUN", os.path.join(REPO, "bazel-bin", "tools", "muonrun"))
    if not os.path.exists(muonrun):
        pytest.skip(f"{muonrun} is not built")
    if not os.path.exists(DATA):
        pytest.skip("dataset-fashion-mnist is not installed")
    env = dict(os.environ, MUONRUN=muonrun)
    r = subprocess.run([sys.executable, TRAIN, "--epochs", "1", "--train-limit", "3000",
                        "--skip-torch-muon", *args],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    line = [l for l in r.stdout.splitlines() if l.startswith("fashion-mnist: distributed_acc=")]
    assert line, r.stdout
    return dict(re.findall(r"(\w+)=(\S+)", line[-1]))


@pytest.mark.parametrize("layout,nproc", [("fsdp", 4), ("ddp", 2)])
def test_main_job_small_slice_distributed_bitwise_equal_to_one_process(layout, nproc):
    summary = run_job("--layout", layout, "--nproc", str(nproc))
    assert summary["ranks"] == str(nproc)
    assert summary["layout"] == layout
    assert float(summary["max_abs_param_diff"]) == 0.0
    assert float(summary["max_rel_loss_diff"]) == 0.0
    assert summary["distributed_acc"] == summary["single_acc"]
    assert float(summary["distributed_acc"]) > 0.3  # learned something in 3 steps

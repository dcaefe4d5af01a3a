"""The main job (examples/fashion_mnist_torch/train.py) on a small slice of
Fashion-MNIST: muonrun ranks vs one process, both layouts, bitwise; and its
--device cuda path's CPU side: the error without a GPU, and the one-process
job with the device mapped to the CPU."""
import importlib.util
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


def test_device_cuda_without_a_gpu_fails_with_the_reason():
    """No CUDA device: a non-zero exit naming the flag and the reason,
    before the data is read (the data dir does not exist) and before
    anything trains on the CPU instead."""
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    r = subprocess.run([sys.executable, TRAIN, "--device", "cuda",
                        "--data-dir", "/nonexistent/fashion-mnist"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0, r.stdout + r.stderr
    assert ("fashion-mnist: --device cuda: no CUDA device "
            "(torch.cuda.is_available() is False)") in r.stderr
    assert "train / " not in r.stdout and "epoch" not in r.stdout


def test_worker_refuses_device_cuda():
    """Rank processes are CPU-only: --worker --device cuda names why and
    exits before it joins a process group."""
    r = subprocess.run([sys.executable, TRAIN, "--worker", "--device", "cuda",
                        "--out", "/nonexistent"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "--worker --device cuda: rank processes run on the CPU" in r.stderr


# train.py's --device cuda path with cuda:0 mapped to the CPU: what runs
# there on a GPU (one process, muonrt.Muon then the PyTorch Muon, the
# summary line and its checks) minus the CUDA kernels.
CUDA_ON_CPU = """
import importlib.util, sys, torch
torch.cuda.is_available = lambda: True
torch.cuda.get_device_name = lambda index=None: "the CPU standing in for cuda:0"
spec = importlib.util.spec_from_file_location("train", sys.argv[1])
train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train)
train.torch_device = lambda args: torch.device("cpu")
sys.argv = sys.argv[1:]
train.main()
"""


def test_device_cuda_path_on_the_cpu_runs_one_process_beside_torch_muon():
    library_or_skip()
    if not os.path.exists(DATA):
        pytest.skip("dataset-fashion-mnist is not installed")
    r = subprocess.run([sys.executable, "-c", CUDA_ON_CPU, TRAIN, "--device", "cuda",
                        "--epochs", "1", "--train-limit", "3000", "--nproc", "4",
                        "--data-dir", os.path.dirname(DATA)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no distributed run" in r.stdout and "--nproc 4 and --layout not used" in r.stdout
    assert "[rank" not in r.stdout
    assert re.search(r"\[single\] epoch 1 train loss \S+ test accuracy \S+ "
                     r"\(\S+ s/epoch, \S+ ms/step median\)", r.stdout), r.stdout
    line = [l for l in r.stdout.splitlines() if l.startswith("fashion-mnist: distributed_acc=")]
    assert line, r.stdout
    summary = dict(re.findall(r"(\w+)=(\S+)", line[-1]))
    assert summary["distributed_acc"] == "skipped"
    assert summary["ranks"] == "1" and summary["device"] == "cuda:0"
    assert summary["torch_muon_steps"] == "3/3"  # one 1000-image batch per step
    assert float(summary["single_ms_per_step"]) > 0
    assert float(summary["torch_muon_ms_per_step"]) > 0
    # fp32 on both sides here: the curves agree to rounding.
    assert float(summary["max_rel_loss_diff_vs_torch_muon"]) < 1e-4
    assert abs(float(summary["single_acc"]) - float(summary["torch_muon_acc"])) < 0.01
    assert float(summary["single_acc"]) > 0.3


def load_trainer():
    spec = importlib.util.spec_from_file_location("fashion_mnist_train", TRAIN)
    trainer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(trainer)
    return trainer


@pytest.mark.parametrize("losses,acc,ref_acc,ref_steps,error", [
    ([2.3, 1.0], 0.80, 0.81, 2, None),
    ([2.3, 1.0], 0.70, 0.70 + 0.05, 1, None),  # torch_muon stopped early
    ([2.3, float("nan")], 0.80, 0.81, 2, "muonrt.Muon's loss is nan at step 2"),
    ([2.3, 1.0], 0.70, 0.75, 2, "test accuracy 0.7000 is more than"),
])
def test_cuda_result_checks(losses, acc, ref_acc, ref_steps, error):
    trainer = load_trainer()
    single = dict(losses=losses, accuracy=acc)
    ref = dict(accuracy=ref_acc, steps=ref_steps, planned=2)
    if error is None:
        trainer.check_cuda_result(single, ref)
        trainer.check_cuda_result(single, None)
        return
    with pytest.raises(SystemExit, match=error):
        trainer.check_cuda_result(single, ref)

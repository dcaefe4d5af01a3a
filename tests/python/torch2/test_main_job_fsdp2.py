"""The main job (examples/fashion_mnist_torch/train.py) on PyTorch 2.x, on a
small slice of Fashion-MNIST: the model sharded by FSDP2 (fully_shard on a
DeviceMesh) on 4 spawned gloo ranks, its DTensors stepped by muonrt.Muon,
bitwise equal to the same trainer in one process (gradients summed in rank
order by the job's custom FSDP2 reduce-scatter), and torch.optim.Muon run
beside it for accuracy and time."""
import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
TRAIN = os.path.join(REPO, "examples", "fashion_mnist_torch", "train.py")
DATA_DIRS = [os.path.join(REPO, "data", "fashion-mnist"),
             "/usr/share/datasets/fashion-mnist"]


def test_main_job_fsdp2_four_ranks_bitwise_one_process():
    data = next((d for d in DATA_DIRS if os.path.isdir(d)), None)
    if data is None:
        pytest.skip("no Fashion-MNIST data (dataset-fashion-mnist)")
    r = subprocess.run([sys.executable, TRAIN, "--epochs", "1",
                        "--train-limit", "4000", "--nproc", "4",
                        "--launcher", "spawn", "--data-dir", data,
                        "--torch-muon-full"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    line = [l for l in r.stdout.splitlines()
            if l.startswith("fashion-mnist: distributed_acc=")]
    assert line, r.stdout
    print(line[-1])
    summary = dict(re.findall(r"(\w+)=(\S+)", line[-1]))
    assert summary["torch_muon_steps"] == "4/4"
    assert summary["layout"] == "fsdp2"
    assert summary["ranks"] == "4"
    assert float(summary["max_abs_param_diff"]) == 0.0
    assert float(summary["max_rel_loss_diff"]) == 0.0
    assert summary["distributed_acc"] == summary["single_acc"]
    # torch.optim.Muon (bf16 Newton-Schulz) trains to about the same
    # accuracy on the same slice.
    assert abs(float(summary["torch_muon_acc"]) -
               float(summary["single_acc"])) < 0.05
    assert "DTensor" in r.stdout and "Shard(dim=0)" in r.stdout


def test_main_job_fsdp2_overlap_backward_bitwise_one_process():
    """--overlap-backward: FSDP2 calls the post-accumulate-grad hooks of its
    sharded DTensor parameters after each layer's reduce-scatter, so every
    parameter is marked ready during backward and its bucket exchanged
    then; the result stays bitwise the one-process run."""
    data = next((d for d in DATA_DIRS if os.path.isdir(d)), None)
    if data is None:
        pytest.skip("no Fashion-MNIST data (dataset-fashion-mnist)")
    r = subprocess.run([sys.executable, TRAIN, "--epochs", "1",
                        "--train-limit", "4000", "--nproc", "4",
                        "--launcher", "spawn", "--data-dir", data,
                        "--skip-torch-muon", "--overlap-backward"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "overlap_backward: 3 of 3 parameters marked ready during " \
           "backward" in r.stdout, r.stdout[-4000:]
    line = [l for l in r.stdout.splitlines()
            if l.startswith("fashion-mnist: distributed_acc=")]
    assert line, r.stdout
    summary = dict(re.findall(r"(\w+)=(\S+)", line[-1]))
    assert summary["layout"] == "fsdp2"
    assert float(summary["max_abs_param_diff"]) == 0.0
    assert summary["distributed_acc"] == summary["single_acc"]

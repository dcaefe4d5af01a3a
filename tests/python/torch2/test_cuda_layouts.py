"""FSDP2 DTensors on CUDA: 4 rank processes share one GPU, their
parameters and momentum on cuda:0, over muonrt's Gloo process group (each
exchange staged through pinned host memory, as c10d's Gloo backend does for
CUDA tensors), stepped by muonrt.Muon with Newton-Schulz in fp32
(gpu_precision="fp32"): bitwise equal to muonrt.Muon on the whole tensors
in one process on the same GPU (layout_worker.py with DEVICE "cuda").

Needs a GPU: skipped with the reason otherwise, failed instead when
MUON_REQUIRE_GPU=1 (tools/device_checks.sh sets it on the GPU machine).
"""
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import layout_worker  # noqa: E402
from ranks import run_ranks  # noqa: E402

STEPS = 3
WORLD = 4


def _need_gpu():
    if torch.cuda.is_available():
        return
    reason = "torch.cuda.is_available() is False"
    if os.environ.get("MUON_REQUIRE_GPU") == "1":
        pytest.fail(f"MUON_REQUIRE_GPU=1 but {reason}")
    pytest.skip(reason)


# fsdp: fully_shard on a 1-D mesh of 4 (uneven rows: [130, 48] and [48,
# 130]; empty shards: [2, 16]); hsdp: fully_shard on a (replicate 2, shard
# 2) mesh.
@pytest.mark.parametrize("layout", ["fsdp", "hsdp"])
def test_four_ranks_on_one_gpu_bitwise_equal_to_one_process(layout,
                                                            tmp_path):
    _need_gpu()
    results = run_ranks(WORLD, [os.path.join(HERE, "layout_worker.py"),
                                layout, str(STEPS), str(tmp_path), "cuda"],
                        job_id=f"torch2-cuda-{layout}")
    for rank, (rc, out) in enumerate(results):
        assert rc == 0, f"{layout} rank {rank} exit {rc}:\n{out}"
    print(results[0][1])
    dist = torch.load(os.path.join(tmp_path, "result.pt"))
    one = layout_worker.reference(layout, STEPS, device="cuda")
    init = layout_worker.initial()
    for n in layout_worker.names(layout):
        assert not torch.equal(one[n], init[n]), f"{layout} {n}: no step"
        assert torch.equal(dist[n], one[n]), \
            f"{layout} {n}: 4 ranks on one GPU differ from one process"

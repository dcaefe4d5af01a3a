"""Real PyTorch 2.x layouts on 4 gloo ranks, stepped by muonrt.Muon reading
the DTensor parameters alone (layout_worker.py): each bitwise equal to
muonrt.Muon on whole tensors in one process, and within a bf16 bound of
torch.optim.Muon.

The bound: torch.optim.Muon runs Newton-Schulz in bfloat16 (8 significant
bits, unit roundoff u = 2^-8 ~ 3.9e-3) and muonrt in float32. Each of the 5
iterations computes X X^T and the quintic from bf16-rounded operands, so
the orthogonalized update O differs by a few u relative in Frobenius norm;
over STEPS steps the parameters' difference stays a few u of the total
update. We demand ||W_muonrt - W_torch||_F <= 4e-2 ||W_torch - W_0||_F
(about 10 u), the bound tools/torch_muon_compare.py uses on GPUs; measured
values are printed.
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
BOUND = 4e-2


def run_layout(layout, tmp_path):
    results = run_ranks(WORLD, [os.path.join(HERE, "layout_worker.py"),
                                layout, str(STEPS), str(tmp_path)],
                        job_id=f"torch2-{layout}")
    for rank, (rc, out) in enumerate(results):
        assert rc == 0, f"{layout} rank {rank} exit {rc}:\n{out}"
    print(results[0][1])
    return torch.load(os.path.join(tmp_path, "result.pt"))


# fsdp / hsdp: fully_shard on a 1-D / (replicate, shard) mesh; tp:
# parallelize_module with ColwiseParallel (Shard(0)) and RowwiseParallel
# (Shard(1)); fsdp_tp: FSDP2 over that TP on a (dp, tp) mesh (DTensor
# spells the dp placement of the colwise weight _StridedShard(dim=0, sf=2));
# ep: a [4, 24, 16] expert stack distributed Shard(0).
@pytest.mark.parametrize("layout", ["fsdp", "hsdp", "tp", "fsdp_tp", "ep"])
def test_layout_bitwise_one_process_and_within_bf16_of_torch(layout,
                                                             tmp_path):
    dist = run_layout(layout, tmp_path)
    ours = layout_worker.reference(layout, STEPS)
    theirs = layout_worker.reference(layout, STEPS, optimizer="torch")
    init = layout_worker.initial()
    for n in layout_worker.names(layout):
        assert torch.equal(dist[n], ours[n]), \
            f"{layout} {n}: 4 ranks differ from one process"
        if theirs is None:
            continue
        upd = (theirs[n].double() - init[n].double()).norm().item()
        diff = (ours[n].double() - theirs[n].double()).norm().item()
        print(f"{layout} {n}: |muonrt - torch.optim.Muon| / |update| = "
              f"{diff / upd:.3g} (bound {BOUND})")
        assert diff <= BOUND * upd, f"{layout} {n}: {diff / upd}"

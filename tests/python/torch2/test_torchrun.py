"""Real torchrun (torch.distributed.run) starting the ranks of an FSDP2 job
stepped by muonrt.Muon, bitwise equal to one process. Debian's PyTorch
build lacks libuv, which torchrun's TCPStore asks for: there the test skips
naming that error (the other torch2 tests start their ranks themselves with
the same env:// variables); on PyTorch's own builds (the GPU machines'
pip wheels) it runs."""
import os
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import layout_worker  # noqa: E402
from ranks import free_port_pair  # noqa: E402


def test_torchrun_two_ranks_fsdp2_bitwise_one_process(tmp_path):
    port = free_port_pair()
    # The ranks on 3 CPU threads, the one-process reference on 2.
    env = dict(os.environ, OMP_NUM_THREADS="1", MUON_JOB_ID="torchrun",
               MUONRT_NUM_THREADS="3")
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
         "--nproc-per-node", "2", "--rdzv-backend", "static", "--node-rank",
         "0", "--master-addr", "127.0.0.1", "--master-port", str(port),
         os.path.join(HERE, "torchrun_rank.py"), str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    if r.returncode != 0 and "libuv" in out:
        pytest.skip("torchrun fails here: this PyTorch was built without "
                    "libuv, which torchrun's TCPStore asks for")
    assert r.returncode == 0, out[-4000:]
    got = torch.load(tmp_path / "result.pt")
    ref = layout_worker.reference("fsdp", 2)
    for n in ref:
        assert torch.equal(got[n], ref[n]), n

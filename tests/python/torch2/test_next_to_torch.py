"""The self-contained libmuonrt.so in one process with PyTorch 2.x, whose
own Gloo (another version, soname libgloo.so.0 in Debian's build) is loaded
first: the library loads, a 2-rank muonrt process group steps beside a
torch.distributed gloo group, and the dynamic loader binds every Gloo
symbol our library and our Gloo use to our grafted copy
(libgloo-muonrt.so.0), never to torch's (LD_DEBUG=bindings)."""
import os
import re
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from ranks import run_ranks  # noqa: E402

RANK_CODE = r"""
import os, torch, torch.distributed as dist
import muonrt
dist.init_process_group("gloo")
pg = muonrt.init_process_group(timeout=60)
t = torch.ones(3) * (dist.get_rank() + 1)
dist.all_reduce(t)          # torch's Gloo
w = torch.nn.Parameter(torch.randn(6, 4, generator=torch.Generator().manual_seed(1)))
opt = muonrt.Muon([("w", w)], lr=0.02, placements={"w": ["Replicate()"]})
w.grad = torch.ones(6, 4)
opt.step()                  # ours (a muonrt collective over 2 ranks)
maps = open("/proc/self/maps").read()
print("torch_gloo", any(l.endswith("/libgloo.so.0") or "/libgloo.so.0." in l
                        for l in maps.splitlines()))
print("our_gloo", "libgloo-muonrt.so.0" in maps)
print("sum", t.tolist())
pg.destroy()
dist.destroy_process_group()
"""


def test_two_ranks_beside_torch_gloo_bind_to_our_gloo(tmp_path):
    import muonrt
    lib_path = muonrt.library_path()
    if "-muonrt" not in " ".join(os.listdir(os.path.dirname(lib_path))):
        pytest.skip(f"{lib_path} is not the self-contained library "
                    f"(tools/graft_libs.py)")
    results = run_ranks(2, ["-c", RANK_CODE], timeout_s=120,
                        job_id="next-to-torch",
                        extra_env={1: {"LD_DEBUG": "bindings",
                                       "LD_DEBUG_OUTPUT": str(tmp_path / "ld")}})
    outs = [out for _, out in results]
    for rank, (rc, out) in enumerate(results):
        assert rc == 0, f"rank {rank} exit {rc}:\n{out}"
        assert "our_gloo True" in out, out
        assert "sum [3.0, 3.0, 3.0]" in out, out
    torch_gloo_loaded = "torch_gloo True" in outs[1]
    print(f"torch's libgloo.so.0 in the process: {torch_gloo_loaded}")
    logs = [f for f in os.listdir(tmp_path) if f.startswith("ld")]
    assert logs, "LD_DEBUG wrote no log"
    text = "".join(open(tmp_path / f, errors="replace").read() for f in logs)
    # "binding file A [0] to B [0]: normal symbol `S'"
    bindings = re.findall(r"binding file (\S+) \[\d+\] to (\S+) \[\d+\]: "
                          r"\w+ symbol `(_ZN4gloo\S*?)'", text)
    ours = [b for b in bindings if "muonrt" in b[0]]
    assert ours, "no Gloo symbol of ours was bound (is LD_DEBUG working?)"
    wrong = [b for b in ours if "libgloo-muonrt.so.0" not in b[1]]
    print(f"{len(ours)} Gloo bindings from our libraries, "
          f"{len(wrong)} to another Gloo")
    assert wrong == [], wrong[:5]

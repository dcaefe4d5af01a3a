"""muonrt.Muon's bits do not depend on the BLAS thread count of the process
(OPENBLAS_NUM_THREADS, read by the library's private OpenBLAS), nor on the
optimizers created before in the same process: the one-process reference a
distributed run is compared with is the same on every machine of one CPU
kernel set."""
import hashlib
import os
import subprocess
import sys

import pytest
import torch

from conftest import library_or_skip

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# Tall, wide, square, several 256-tiles, tiny.
SHAPES = [(130, 48), (48, 130), (256, 256), (1000, 300), (2, 16)]
STEPS = 3
VARIANTS = {
    "standard": {},
    "gram": {"ns_method": "gram"},
    "auto": {"ns_method": "auto"},
    "normuon": {"normuon": True},
}

def params_hash(kwargs, shapes=SHAPES, steps=STEPS):
    """sha256 of the parameters' bits after `steps` steps of muonrt.Muon
    (kwargs) on `shapes`, from fixed seeds."""
    import muonrt
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(*s, generator=g))
              for s in shapes]
    opt = muonrt.Muon([("w%d" % i, p) for i, p in enumerate(params)],
                      lr=0.02, weight_decay=0.01, **kwargs)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
    h = hashlib.sha256()
    for p in params:
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


# One process (this file's params_hash): every variant; prints
# "<variant> <hash>" per variant.
CHILD = r"""
import json, sys
import muonrt
sys.path.insert(0, sys.argv[2])
from test_thread_count import params_hash

spec = json.loads(sys.argv[1])
# MUONRT_NUM_THREADS (the parent sets it): not capped at the core count,
# unlike OPENBLAS_NUM_THREADS, so 16 threads run on a 2-core machine too.
assert muonrt.compute_threads() == spec["threads"], muonrt.compute_threads()
for name, kwargs in spec["variants"].items():
    print(name, params_hash(kwargs))
"""


def hashes_with_threads(threads):
    """Runs CHILD on `threads` CPU threads (MUONRT_NUM_THREADS);
    {variant: hash}."""
    import json
    env = dict(os.environ, MUONRT_NUM_THREADS=str(threads),
               PYTHONPATH=os.path.join(REPO, "python"))
    spec = json.dumps({"variants": VARIANTS, "threads": threads})
    out = subprocess.run([sys.executable, "-c", CHILD, spec, HERE], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(line.split() for line in out.stdout.splitlines()
                if line.split() and line.split()[0] in VARIANTS)


def test_bits_are_the_same_for_1_2_3_4_8_and_16_blas_threads():
    library_or_skip()
    want = hashes_with_threads(1)
    assert sorted(want) == sorted(VARIANTS)
    # The variants differ from each other, so a hash that ignored the
    # parameters could not pass.
    assert len(set(want.values())) == len(VARIANTS)
    for threads in (2, 3, 4, 8, 16):
        got = hashes_with_threads(threads)
        assert got == want, f"MUONRT_NUM_THREADS={threads}"


def test_reference_is_unchanged_by_earlier_optimizers_in_the_process():
    library_or_skip()
    import muonrt
    first = params_hash({})
    # NorMuon, the bf16 exchange and QK-clip, each stepped, in between.
    params_hash({"normuon": True})
    params_hash({"exchange_dtype": "bfloat16"})
    g = torch.Generator().manual_seed(3)
    wq = torch.nn.Parameter(torch.randn(8, 16, generator=g))
    wk = torch.nn.Parameter(torch.randn(4, 16, generator=g))
    opt = muonrt.Muon([("wq", wq), ("wk", wk)], lr=0.02, qk_clip={
        "threshold": 1.0, "layers": [{"q": "wq", "k": "wk", "num_heads": 2,
                                      "num_kv_heads": 1, "head_dim": 4}]})
    wq.grad = torch.randn(wq.shape, generator=g)
    wk.grad = torch.randn(wk.shape, generator=g)
    opt.step()
    opt.clip_qk(torch.tensor([5.0, 0.5]))
    assert params_hash({}) == first


@pytest.mark.parametrize("threads", [1, 16])
def test_thread_count_is_the_process_blas_setting(threads):
    """The library takes its private OpenBLAS's thread count:
    OPENBLAS_NUM_THREADS, which OpenBLAS caps at the core count."""
    library_or_skip()
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads),
               PYTHONPATH=os.path.join(REPO, "python"))
    env.pop("MUONRT_NUM_THREADS", None)
    out = subprocess.run(
        [sys.executable, "-c",
         "import muonrt; print(muonrt.compute_threads(), "
         "muonrt.cpu_kernels())"],
        env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    count, kernels = out.stdout.split(" ", 1)
    assert int(count) == min(threads, len(os.sched_getaffinity(0)))
    assert "OpenBLAS" in kernels


def test_set_compute_threads_refuses_what_is_not_an_int_in_range():
    library_or_skip()
    import muonrt
    before = muonrt.compute_threads()
    for bad in (0, 65, -1, 2.5, True, 2 ** 32 + 5, "4"):
        with pytest.raises(muonrt.InvalidArgumentError) as e:
            muonrt.set_compute_threads(bad)
        assert repr(bad) in str(e.value)
    assert muonrt.compute_threads() == before


def test_bad_muonrt_num_threads_is_reported_and_ignored():
    library_or_skip()
    env = dict(os.environ, MUONRT_NUM_THREADS="many", OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=os.path.join(REPO, "python"))
    out = subprocess.run(
        [sys.executable, "-c",
         "import muonrt; print(muonrt.compute_threads())"],
        env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "1"
    assert 'MUONRT_NUM_THREADS="many"' in out.stderr

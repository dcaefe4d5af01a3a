"""Multi-process muonrt.Muon: 2 and 4 ranks with the same gradients give
bitwise the single process's parameters and momentum (each rank's shard),
every matrix is orthogonalized once in the world, and a checkpoint of one
layout resumes in another.

Ranks are started by muonrun ($MUONRUN, else bazel-bin/tools/muonrun;
torchrun's flags; the tests skip with a reason when it is not built) and, independently of it, by a
plain spawner here that sets torchrun's environment itself. Every
subprocess is bounded by a timeout.
"""
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO, free_port_pair, library_or_skip

WORKER = os.path.join(REPO, "tests", "python", "workers", "muon_worker.py")
MUONRUN = os.environ.get("MUONRUN") or os.path.join(REPO, "bazel-bin",
                                                     "tools", "muonrun")
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
TIMEOUT_S = 120
STEPS = 6

sys.path.insert(0, os.path.dirname(WORKER))
import muon_worker  # noqa: E402


def child_env(lib):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(REPO, "python")
    env["MUONRT_LIBRARY"] = os.path.abspath(lib)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
              "MASTER_ADDR", "MASTER_PORT", "MUON_COORDINATOR"):
        env.pop(k, None)
    return env


def launch_muonrun(n, args, lib):
    if not os.access(MUONRUN, os.X_OK):
        pytest.skip(f"{MUONRUN} is not built (bazel build //tools:muonrun)")
    cmd = [MUONRUN, "--nproc-per-node", str(n), "--master-addr", "127.0.0.1",
           "--master-port", str(free_port_pair()), "--timeout_s",
           str(TIMEOUT_S - 20), "--grace_s", "5", PY, WORKER] + args
    r = subprocess.run(cmd, env=child_env(lib), capture_output=True,
                       text=True, timeout=TIMEOUT_S)
    assert r.returncode == 0, (f"{' '.join(cmd)} -> {r.returncode}\n"
                               f"{r.stdout}\n{r.stderr}")


def launch_direct(n, args, lib):
    """torchrun's environment set here, one process per rank."""
    port = free_port_pair()
    procs = []
    try:
        for rank in range(n):
            env = child_env(lib)
            env.update(RANK=str(rank), WORLD_SIZE=str(n), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port))
            procs.append(subprocess.Popen(
                [PY, WORKER] + args, env=env, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True))
        outs = [p.communicate(timeout=TIMEOUT_S)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    for rank, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {rank} -> {p.returncode}\n{out}"


LAUNCHERS = {"muonrun": launch_muonrun, "direct": launch_direct}


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """The one-process run (full tensors, no process group), with the
    parameters at step 3 and a checkpoint there."""
    library_or_skip()
    out = tmp_path_factory.mktemp("single")
    result = muon_worker.run("single", STEPS, str(out), save_at=3,
                             ckpt=str(out / "ckpt_at_3"))
    return result, out


def check_ranks(out, n, layout_name, single_result):
    _, sizes, placements = muon_worker.layout(layout_name, n)
    total = 0
    assignments = None
    for rank in range(n):
        r = torch.load(os.path.join(out, f"rank_{rank}.pt"))
        assert r["world"] == n and r["step_count"] == STEPS
        for name in muon_worker.SHAPES:
            want = muon_worker.local_shard(single_result["params"][name],
                                           sizes, placements[name], rank)
            assert torch.equal(r["params"][name], want), \
                f"rank {rank} {name}: parameter differs from one process"
            want_m = muon_worker.local_shard(single_result["momentum"][name],
                                             sizes, placements[name], rank)
            assert torch.equal(r["momentum"][name], want_m), \
                f"rank {rank} {name}: momentum differs from one process"
        total += r["stats"]["matrices_orthogonalized"]
        if assignments is None:
            assignments = r["assignments"]
        assert r["assignments"] == assignments
    # Zero redundancy: each matrix orthogonalized once in the world.
    assert total == len(muon_worker.SHAPES)
    owned = sorted(i for v in assignments.values() for i in v)
    assert owned == list(range(len(muon_worker.SHAPES)))
    # Every rank is listed, also one that owns nothing.
    assert sorted(assignments) == list(range(n))


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
@pytest.mark.parametrize("n", [2, 4])
def test_fsdp_ranks_match_single_process_bitwise(single, tmp_path, launcher,
                                                 n):
    lib = library_or_skip()
    LAUNCHERS[launcher](n, ["--layout", "fsdp", "--steps", str(STEPS),
                            "--out", str(tmp_path)], lib)
    check_ranks(tmp_path, n, "fsdp", single[0])


def test_rank_with_a_bad_gradient_fails_every_rank_at_once_unchanged(
        single, tmp_path):
    """Rank 1's non-contiguous gradient fails its step in Python, before
    the library; the library still takes its part in the step's agreement
    (muonrt_optimizer_refuse_step), so rank 0 fails at once naming rank 1
    instead of waiting out a collective, nothing changes on either rank,
    and the run then matches one process bitwise."""
    lib = library_or_skip()
    launch_muonrun(2, ["--layout", "fsdp", "--steps", str(STEPS), "--out",
                       str(tmp_path), "--refuse-at", "2"], lib)
    check_ranks(tmp_path, 2, "fsdp", single[0])
    ours = torch.load(os.path.join(tmp_path, "rank_1.pt"))["refused"]
    peer = torch.load(os.path.join(tmp_path, "rank_0.pt"))["refused"]
    assert ours[0] == "RuntimeError" and "is not contiguous" in ours[1], ours
    assert peer[0] == "FailedPreconditionError", peer
    assert "rank 0: rank 1 refused step 3's inputs" in peer[1], peer
    assert "unchanged on every rank" in peer[1], peer
    assert peer[2] < 20, f"rank 0 waited {peer[2]:.1f} s"


def test_rank_failing_a_python_check_at_creation_fails_every_rank_at_once(
        tmp_path):
    """Rank 1's placements= names a parameter its model lacks: muonrt.Muon
    refuses it in Python, before the library, and still tells the
    coordinator (muonrt_pg_report_create_failure), so rank 0's construction
    fails at once naming rank 1 and its error instead of waiting out the
    join timeout (60 s in this worker)."""
    lib = library_or_skip()
    launch_muonrun(2, ["--layout", "fsdp", "--out", str(tmp_path),
                       "--bad-create"], lib)
    ours = torch.load(os.path.join(tmp_path, "rank_1.pt"))["failed"]
    peer = torch.load(os.path.join(tmp_path, "rank_0.pt"))["failed"]
    assert ours[0] == "ValueError" and "no.such.weight" in ours[1], ours
    assert peer[0] == "InvalidArgumentError", peer
    assert ("rank 1 could not create its optimizer: ValueError: "
            "muonrt.Muon: placements names unknown") in peer[1], peer
    assert "no.such.weight" in peer[1], peer
    assert peer[2] < 20, f"rank 0 waited {peer[2]:.1f} s"


def test_destroy_from_another_thread_waits_for_the_step_in_flight(tmp_path):
    """muonrt.destroy_process_group() from a watchdog thread while rank 0's
    step waits for rank 1: the destroy waits for the library call in
    flight instead of freeing the optimizer under it (a crash before); the
    step completes and the next one raises RuntimeError naming the closed
    optimizer."""
    lib = library_or_skip()
    launch_muonrun(2, ["--layout", "fsdp", "--out", str(tmp_path),
                       "--close-during-step"], lib)
    r = torch.load(os.path.join(tmp_path, "rank_0.pt"))
    assert r["destroy_end"] is not None, r
    assert r["destroy_end"] >= r["step_end"], r
    assert r["after"][0] == "RuntimeError", r
    assert "closed" in r["after"][1], r


@pytest.mark.parametrize("layout_name, n", [("mixed", 2), ("hsdp_tp", 4),
                                            ("hsdp", 4), ("dtensor", 2),
                                            ("ddp", 2)])
def test_other_layouts_match_single_process_bitwise(single, tmp_path,
                                                    layout_name, n):
    lib = library_or_skip()
    launch_muonrun(n, ["--layout", layout_name, "--steps", str(STEPS),
                       "--out", str(tmp_path)], lib)
    check_ranks(tmp_path, n, layout_name, single[0])


@pytest.mark.parametrize("layout_name, n", [("fsdp", 4), ("hsdp", 4)])
def test_bf16_exchange_close_to_single_process_and_replicas_equal(
        single, tmp_path, layout_name, n):
    """exchange_dtype="bfloat16": the momentum stays bitwise the one-process
    one (computed locally), the parameters within 2^-7 x lr x steps of it
    (the C++ test's bound, with lr and steps of this worker), every replica
    of a shard equal (the C++ test also checks the bytes halve)."""
    lib = library_or_skip()
    launch_muonrun(n, ["--layout", layout_name, "--steps", str(STEPS),
                       "--out", str(tmp_path), "--exchange-dtype",
                       "bfloat16"], lib)
    _, sizes, placements = muon_worker.layout(layout_name, n)
    lr = muon_worker.OPTIONS["lr"]
    bound = STEPS * 2 * lr * 2.0 ** -7
    seen = {}
    worst = 0.0
    for rank in range(n):
        r = torch.load(os.path.join(tmp_path, f"rank_{rank}.pt"))
        for name in muon_worker.SHAPES:
            want = muon_worker.local_shard(single[0]["params"][name],
                                           sizes, placements[name], rank)
            got = r["params"][name]
            if got.numel() > 0:  # empty shards hold nothing
                worst = max(worst, (got - want).abs().max().item())
            want_m = muon_worker.local_shard(single[0]["momentum"][name],
                                             sizes, placements[name], rank)
            assert torch.equal(r["momentum"][name], want_m), (rank, name)
            key = (name, want.numpy().tobytes())  # the region's contents
            if key in seen:
                assert torch.equal(seen[key], got), (rank, name)
            seen[key] = got
    assert 0 < worst <= bound, (worst, bound)


@pytest.fixture(scope="module")
def single_normuon(tmp_path_factory):
    """The one-process run with normuon=True."""
    library_or_skip()
    out = tmp_path_factory.mktemp("single_normuon")
    return muon_worker.run("single", STEPS, str(out), normuon=True)


@pytest.mark.parametrize("layout_name, n", [("fsdp", 4), ("mixed", 2),
                                            ("hsdp_tp", 4), ("dtensor", 2)])
def test_normuon_ranks_match_single_process_bitwise(single_normuon, tmp_path,
                                                    layout_name, n):
    """normuon=True: parameters, momentum and the row state
    ("variance_neuron", [local rows, 1]: a rank keeps the rows it holds part
    of, all of them under Shard(1)) bitwise the one-process run's, and the
    row state is in state_dict."""
    lib = library_or_skip()
    launch_muonrun(n, ["--layout", layout_name, "--steps", str(STEPS),
                       "--out", str(tmp_path), "--normuon"], lib)
    _, sizes, placements = muon_worker.layout(layout_name, n)
    for rank in range(n):
        r = torch.load(os.path.join(tmp_path, f"rank_{rank}.pt"))
        for name in muon_worker.SHAPES:
            pl = placements[name]
            want = muon_worker.local_shard(single_normuon["params"][name],
                                           sizes, pl, rank)
            assert torch.equal(r["params"][name], want), (rank, name)
            rows_pl = ["Replicate()" if p == "Shard(1)" else p for p in pl]
            want_v = muon_worker.local_shard(
                single_normuon["variance"][name], sizes, rows_pl, rank)
            if want.numel() == 0:  # no columns here: no state of its own
                want_v = torch.zeros_like(want_v)
            assert torch.equal(r["variance"][name], want_v), (rank, name)
            assert r["state_keys"][name] == ["momentum_buffer",
                                             "variance_neuron"]


@pytest.mark.parametrize("layout_name, n", [("fsdp", 4), ("hsdp_tp", 4),
                                            ("ddp", 2)])
def test_overlap_backward_ranks_match_single_process_bitwise(
        single, tmp_path, layout_name, n):
    """overlap_backward=True with every parameter marked ready by hand,
    last first, before step(): bitwise the one-process run without
    overlap, every matrix orthogonalized once."""
    lib = library_or_skip()
    launch_muonrun(n, ["--layout", layout_name, "--steps", str(STEPS),
                       "--out", str(tmp_path), "--overlap"], lib)
    check_ranks(tmp_path, n, layout_name, single[0])


def test_pipeline_stages_with_sub_mesh(single, tmp_path):
    """Mesh pp=2, each rank holds only its stage's parameters (sub_mesh
    "pp=<stage>"): bitwise the one-process result, each matrix owned within
    its stage."""
    lib = library_or_skip()
    launch_muonrun(2, ["--layout", "pp", "--steps", str(STEPS), "--out",
                       str(tmp_path)], lib)
    total = 0
    for rank in range(2):
        r = torch.load(os.path.join(tmp_path, f"rank_{rank}.pt"))
        names = [n for n, s in muon_worker.STAGES.items() if s == rank]
        assert sorted(r["params"]) == sorted(names)
        for name in names:
            assert torch.equal(r["params"][name],
                               single[0]["params"][name]), name
            assert torch.equal(r["momentum"][name],
                               single[0]["momentum"][name]), name
        total += r["stats"]["matrices_orthogonalized"]
        assert r["stats"]["bytes_sent"] == 0  # never gathered across pp
    assert total == len(muon_worker.SHAPES)


def test_checkpoint_of_four_ranks_resumes_on_two_and_on_one(single,
                                                             tmp_path):
    """FSDP over 4 saves at step 3; resumed as Shard(0)/Shard(1)/Replicate
    over 2 ranks and as one process, both end bitwise where the
    uninterrupted one-process run ends."""
    lib = library_or_skip()
    single_result, single_out = single
    ckpt = tmp_path / "ckpt"
    launch_muonrun(4, ["--layout", "fsdp", "--steps", str(STEPS), "--out",
                       str(tmp_path), "--save-at", "3", "--ckpt", str(ckpt)],
                   lib)
    assert (ckpt / "rank_3.safetensors").is_file()
    params_at_3 = str(single_out / "params_at_3.pt")
    two = tmp_path / "two"
    two.mkdir()
    launch_muonrun(2, ["--layout", "mixed", "--steps", str(STEPS), "--out",
                       str(two), "--resume", params_at_3, "--ckpt", str(ckpt),
                       "--start", "3"], lib)
    check_ranks(two, 2, "mixed", single_result)
    one = tmp_path / "one"
    one.mkdir()
    result = muon_worker.run("single", STEPS, str(one), resume=params_at_3,
                             ckpt=str(ckpt), start=3)
    for name in muon_worker.SHAPES:
        assert torch.equal(result["params"][name],
                           single_result["params"][name]), name
        assert torch.equal(result["momentum"][name],
                           single_result["momentum"][name]), name

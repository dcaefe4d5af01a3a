"""Start-up that cannot collide, through torch's store: rank 0's
coordinator binds a port the kernel picks and hands its address over in
torch's TCPStore (the default group's when the ranks initialized
torch.distributed first; else the one torchrun's agent hosts on
MASTER_PORT), so a job whose MASTER_PORT+1 is held by another process still
starts, and a second muonrt.init_process_group in the same job finds the
new address, not the old one. Every subprocess is bounded by a timeout.
"""
import os
import socket
import subprocess
import sys
import textwrap
from datetime import timedelta

from conftest import REPO, free_port_pair, library_or_skip

PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
TIMEOUT_S = 120

RANK = textwrap.dedent("""
    import sys
    import torch.distributed as dist
    import muonrt
    dist.init_process_group("gloo")
    for attempt in range(2):
        pg = muonrt.init_process_group(timeout=60)
        assert pg.world_size == dist.get_world_size()
        port = int(pg.coordinator_address.rsplit(":", 1)[1])
        assert port != int(sys.argv[1]) + 1, pg.coordinator_address
        pg.barrier()
        muonrt.destroy_process_group()
        dist.barrier()
    dist.destroy_process_group()
""")


# Ranks under torchrun's agent store, without torch.distributed.
AGENT_RANK = textwrap.dedent("""
    import sys
    import muonrt
    for attempt in range(2):
        pg = muonrt.init_process_group(timeout=60)
        port = int(pg.coordinator_address.rsplit(":", 1)[1])
        assert port != int(sys.argv[1]) + 1, pg.coordinator_address
        pg.barrier()
        muonrt.destroy_process_group()
""")


def run_ranks(n, port, lib, extra_env=None, script=RANK):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(REPO, "python")
    env["MUONRT_LIBRARY"] = os.path.abspath(lib)
    for k in ("MUON_COORDINATOR", "MUON_COORDINATOR_PORT",
              "MUON_COORDINATOR_FILE"):
        env.pop(k, None)
    env.update(extra_env or {})
    procs = []
    try:
        for rank in range(n):
            e = dict(env, RANK=str(rank), WORLD_SIZE=str(n),
                     LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(n),
                     MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            procs.append(subprocess.Popen(
                [PY, "-c", script, str(port)], env=e, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True))
        outs = [p.communicate(timeout=TIMEOUT_S)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    return [(p.returncode, out) for p, out in zip(procs, outs)]


def test_master_port_plus_one_held_ranks_start_through_torch_store():
    lib = library_or_skip()
    port = free_port_pair()
    with socket.socket() as held:  # "another job" on MASTER_PORT+1
        held.bind(("127.0.0.1", port + 1))
        held.listen()
        results = run_ranks(4, port, lib)
    for rank, (code, out) in enumerate(results):
        assert code == 0, f"rank {rank} -> {code}\n{out}"


def test_master_port_plus_one_held_ranks_start_through_torchrun_agent_store():
    """torchrun's agent hosts a TCPStore on MASTER_PORT and sets
    TORCHELASTIC_USE_AGENT_STORE=True: ranks that never initialize
    torch.distributed find the coordinator through it."""
    lib = library_or_skip()
    import torch.distributed as dist
    port = free_port_pair()
    try:  # torch 2.x: Debian's build has no libuv (the default server)
        agent_store = dist.TCPStore("127.0.0.1", port, 5, True,
                                    timedelta(seconds=60),
                                    wait_for_workers=False, use_libuv=False)
    except TypeError:  # torch 1.13: no use_libuv
        agent_store = dist.TCPStore("127.0.0.1", port, 5, True,
                                    timedelta(seconds=60),
                                    wait_for_workers=False)
    with socket.socket() as held:
        held.bind(("127.0.0.1", port + 1))
        held.listen()
        results = run_ranks(4, port, lib, script=AGENT_RANK,
                            extra_env={"TORCHELASTIC_USE_AGENT_STORE": "True",
                                       "TORCHELASTIC_RESTART_COUNT": "0"})
    del agent_store
    for rank, (code, out) in enumerate(results):
        assert code == 0, f"rank {rank} -> {code}\n{out}"

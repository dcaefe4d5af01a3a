"""Starting N rank processes of a torch.distributed + muonrt job on this
machine the way torchrun's env:// does (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT; Debian's torchrun needs libuv, which its build lacks, so the
tests spawn the ranks themselves), bounded in time."""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
from conftest import free_port_pair  # noqa: E402,F401 (tests/python's)


# The CPU threads of the ranks' Newton-Schulz (MUONRT_NUM_THREADS, which
# unlike OPENBLAS_NUM_THREADS is not capped at the core count, so it holds
# on a 2-core machine too): 1 on even ranks, 3 on odd ones, and
# never the one-process references' count (layout_worker.REFERENCE_THREADS),
# so every bitwise comparison also shows that the thread count does not
# change the bits.
RANK_THREADS = (1, 3)


def run_ranks(world, argv, timeout_s=240, job_id="torch2", extra_env=None):
    """Runs `argv` (after the Python interpreter) as ranks 0..world-1;
    returns each rank's (returncode, output). A rank still running after
    `timeout_s` is killed, with every other rank, and reported as
    returncode None."""
    port = free_port_pair()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   USE_LIBUV="0", OMP_NUM_THREADS="1", MUON_JOB_ID=job_id,
                   MUONRT_NUM_THREADS=str(RANK_THREADS[rank % 2]))
        env.update((extra_env or {}).get(rank, {}))
        procs.append(subprocess.Popen([sys.executable] + list(argv), env=env,
                                      stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    deadline = time.time() + timeout_s
    results = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1, deadline - time.time()))
            results.append((p.returncode, out))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
            results.append((None, out))
    return results

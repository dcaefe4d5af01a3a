"""muonrt: distributed Muon (torch.optim.Muon) over libmuonrt's C ABI.

Pure Python over ctypes: one package for every Python and PyTorch version
(Debian's 1.13 on Python 3.11, PyTorch 2.x with DTensor). The library
(libmuonrt.so, ``bazel build //capi:libmuonrt.so``) is found through
MUONRT_LIBRARY, next to the package, or in <repo>/bazel-bin/capi/, and
loaded on first use (see muonrt._lib).

Single process::

    import muonrt
    muon_params, other = muonrt.split_params(model)
    opt = muonrt.Muon(muon_params, lr=0.02)          # torch.optim.Muon's args
    adamw = torch.optim.AdamW([p for _, p in other], lr=3e-4)
    loss.backward(); opt.step(); adamw.step()

Distributed (under torchrun or muonrun)::

    pg = muonrt.init_process_group()                  # RANK, WORLD_SIZE, ...
    opt = muonrt.Muon(shards, lr=0.02, mesh=muonrt.Mesh(["dp_shard"], [pg.world_size]),
                      placements={n: ["Shard(0)"] for n, _ in shards},
                      global_shapes={n: full_shape[n] for n, _ in shards})
    # or DTensor parameters (torch 2.x FSDP2): mesh and placements are read
    # from them.

Job spec for muonctl / the daemon from a model (muonrt.spec)::

    spec = muonrt.spec_from_module(model, "dp_shard=8,tp=8", job_id="llama",
                                   placements_rules=[("o_proj", "tp:Shard(1)")])
    muonrt.write_spec(spec, "llama.json")
"""
from ._lib import (ABI_VERSION, MuonRTError, InvalidArgumentError,
                   NotFoundError, FailedPreconditionError, OutOfRangeError,
                   UnimplementedError, DeadlineExceededError,
                   UnauthenticatedError, LibraryRuntimeError, LibraryNotFoundError, AbiVersionError,
                   library_path)
from .distributed import (ProcessGroup, Mesh, Shard, Replicate,
                          init_process_group, destroy_process_group,
                          get_default_group, is_initialized,
                          normalize_placement)
from .spec import spec_from_module, write_spec, DEFAULT_EXCLUDE

__version__ = "0.1.0"


def __getattr__(name):
    # torch is imported on first use of Muon / split_params, so that
    # `import muonrt` (process groups, meshes, the library) works in an
    # interpreter without torch.
    if name == "Muon":
        from .optim import Muon
        return Muon
    if name == "split_params":
        from .params import split_params
        return split_params
    if name in ("attention_max_logits", "MaxLogitTracker"):
        from . import qk_clip
        return getattr(qk_clip, name)
    raise AttributeError(f"module 'muonrt' has no attribute {name!r}")


def abi_version():
    """MUONRT_ABI_VERSION of the loaded library (loads it)."""
    from . import _lib
    return _lib.lib().muonrt_abi_version()


def compute_threads():
    """Threads the library's CPU Newton-Schulz runs on (loads it): at first
    use MUONRT_NUM_THREADS (1 to 64), else the thread count of its private
    OpenBLAS (OPENBLAS_NUM_THREADS, which OpenBLAS caps at the core count,
    else the core count; torch.set_num_threads does not reach it). Speed
    only: the results are the same bits for every count."""
    from . import _lib
    return _lib.lib().muonrt_compute_threads()


MAX_COMPUTE_THREADS = 64


def set_compute_threads(threads):
    """Sets compute_threads() to an int in [1, MAX_COMPUTE_THREADS] (64,
    OpenBLAS's own limit on calls in flight); raises InvalidArgumentError
    naming the value otherwise."""
    from . import _lib
    if (isinstance(threads, bool) or not isinstance(threads, int)
            or not 1 <= threads <= MAX_COMPUTE_THREADS):
        raise _lib.error_class(_lib.INVALID_ARGUMENT)(
            f"set_compute_threads: threads must be an int in [1, "
            f"{MAX_COMPUTE_THREADS}], got {threads!r}", _lib.INVALID_ARGUMENT)
    _lib.call("muonrt_set_compute_threads", threads)


def cpu_kernels():
    """The CPU kernel set of the library's OpenBLAS, with its version
    ("SkylakeX (OpenBLAS 0.3.21 ...)"). The bitwise promise (a distributed
    run equals one process) holds for any thread and rank count on one
    kernel set; OPENBLAS_CORETYPE chooses another."""
    from . import _lib
    return _lib.lib().muonrt_cpu_kernels().decode("utf-8", "replace")


__all__ = [
    "Muon", "split_params", "attention_max_logits", "MaxLogitTracker",
    "Mesh", "Shard", "Replicate", "ProcessGroup",
    "init_process_group", "destroy_process_group", "get_default_group",
    "is_initialized", "normalize_placement", "library_path", "abi_version",
    "compute_threads", "set_compute_threads", "cpu_kernels",
    "ABI_VERSION", "MuonRTError", "InvalidArgumentError", "NotFoundError",
    "FailedPreconditionError", "OutOfRangeError", "UnimplementedError",
    "DeadlineExceededError", "UnauthenticatedError", "LibraryRuntimeError", "LibraryNotFoundError",
    "AbiVersionError", "spec_from_module", "write_spec", "DEFAULT_EXCLUDE",
]

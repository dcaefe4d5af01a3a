"""Process groups, meshes and placements.

- ``init_process_group(backend=None, timeout=60.0, device_id=None)`` joins
  the job described by torchrun's environment (RANK, WORLD_SIZE,
  MASTER_ADDR, MASTER_PORT) and makes it the module's default group, which
  ``muonrt.Muon`` uses when given no ``process_group``. Collective: every
  rank calls it. It is separate from torch.distributed's group (gloo/nccl):
  a trainer typically has both, on the same environment. Rank 0 embeds the
  coordinator unless MUON_COORDINATOR names a daemon: on a port the
  kernel picks, its address handed to the other ranks through torch's
  store (the default group's after torch.distributed.init_process_group,
  else the TCPStore torchrun's agent hosts on MASTER_PORT), so no fixed
  port can collide with another job's; with neither, on MASTER_PORT+1 (or
  MUON_COORDINATOR_PORT; under muonrun on one node, a free port again,
  through muonrun's directory). See capi/muonrt.h.
- ``Mesh(names, sizes)``: a named device mesh, row-major over ranks (as
  torch's DeviceMesh(mesh_dim_names=...) over arange(world)).
- placements in DTensor spelling: "Shard(0)" / "Replicate()", torch's
  Shard/Replicate objects (their repr on 2.x is "Shard(dim=0)"), or this
  module's ``Shard``/``Replicate``.
"""
import atexit
import ctypes
import datetime
import os
import re
import sys
import threading
import weakref

from . import _lib


class ProcessGroup:
    """A joined job (muonrt_process_group*). ``rank``, ``world_size``,
    ``coordinator_address``, ``barrier()``, ``destroy()``. Optimizers created on it are destroyed
    with it (the library requires that order)."""

    def __init__(self, handle):
        self._handle = handle
        L = _lib.lib()
        self.rank = L.muonrt_pg_rank(handle)
        self.world_size = L.muonrt_pg_world_size(handle)
        # host:port of the coordinator (rank 0's embedded one), for
        # `muonctl --coordinator`.
        self.coordinator_address = \
            L.muonrt_pg_coordinator_address(handle).decode()
        self._optimizers = weakref.WeakSet()
        self._lock = threading.Lock()

    @property
    def handle(self):
        if self._handle is None:
            raise RuntimeError("muonrt: the process group was destroyed")
        return self._handle

    @property
    def destroyed(self):
        return self._handle is None

    def barrier(self):
        """Blocks until every rank got here (bounded by the group's
        timeout). Raises on a timeout or a lost peer."""
        _lib.call("muonrt_pg_barrier", self.handle)

    def _register(self, optimizer):
        self._optimizers.add(optimizer)

    def destroy(self):
        """Destroys every optimizer created on this group, then the group.
        Idempotent."""
        with self._lock:
            if self._handle is None:
                return
            for opt in list(self._optimizers):
                opt._destroy()
            handle, self._handle = self._handle, None
        _lib.lib().muonrt_pg_destroy(handle)
        global _default_group
        if _default_group is self:
            _default_group = None

    def __del__(self):
        try:
            self.destroy()
        except Exception:  # interpreter shutdown
            pass

    def __repr__(self):
        state = "destroyed" if self._handle is None else "live"
        return (f"muonrt.ProcessGroup(rank={self.rank}, "
                f"world_size={self.world_size}, {state})")


_default_group = None


def _timeout_seconds(timeout):
    if timeout is None:
        return 0.0
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout)


def init_process_group(backend=None, timeout=60.0, device_id=None):
    """Joins the job of torchrun's environment and returns its
    ProcessGroup, which becomes the default group (``get_default_group``).

    `backend` (torch.distributed's names): "gloo" (CPU tensors; the default
    for None; CUDA tensors too, as c10d's Gloo backend takes them: each
    exchange is staged through host memory, so several ranks can share one
    GPU) or "nccl" (CUDA tensors), which also joins a Gloo group for the
    step's control values, as c10d keeps Gloo beside NCCL. `device_id`
    (an int or a torch.device "cuda:N"; None = LOCAL_RANK, torchrun's one
    GPU per local rank) is the GPU of the NCCL group.
    `timeout` (seconds, or a datetime.timedelta; None = the library's 60 s)
    bounds rendezvous and every collective.
    Raises ValueError (the environment: a missing or malformed variable,
    named; an unknown backend), NotImplementedError ("nccl" with a library
    built without CUDA), TimeoutError / RuntimeError (peers or coordinator
    unreachable; no such GPU), RuntimeError when a default group already
    exists."""
    global _default_group
    if _default_group is not None and not _default_group.destroyed:
        raise RuntimeError(
            "muonrt.init_process_group: a default process group already "
            "exists (call muonrt.destroy_process_group() first)")
    if backend is not None and not isinstance(backend, str):
        raise TypeError(
            f"muonrt.init_process_group: backend must be \"gloo\" or "
            f"\"nccl\", got {backend!r} (pass a timeout as timeout=)")
    if device_id is None:
        device = -1
    elif isinstance(device_id, int):
        device = _lib.c_int(device_id, "init_process_group's device_id")
    else:  # torch.device
        if getattr(device_id, "type", None) != "cuda":
            raise ValueError(f"muonrt.init_process_group: device_id "
                             f"{device_id!r} is not a CUDA device")
        # torch.device("cuda") without an index: the current device, as
        # torch.distributed takes it (each rank set its own with
        # torch.cuda.set_device), not cuda:0 on every rank.
        device = (device_id.index if device_id.index is not None else
                  _current_cuda_device())
    out = ctypes.c_void_p()
    name = None if backend is None else backend.encode()
    seconds = _timeout_seconds(timeout)
    store = _job_store(seconds if seconds > 0 else 60.0)
    if store is None:
        _lib.call("muonrt_pg_init_backend_from_env", name, device,
                  _timeout_seconds(timeout), ctypes.byref(out))
    else:
        publish, lookup = _store_callbacks(store)
        _lib.call("muonrt_pg_init_with_store", name, device,
                  _timeout_seconds(timeout), publish, lookup, None,
                  ctypes.byref(out))
    _default_group = ProcessGroup(out.value)
    return _default_group


def _current_cuda_device():
    """torch.cuda.current_device(), or -1 (LOCAL_RANK's GPU) when torch has
    no CUDA."""
    import torch
    if not torch.cuda.is_available():
        return -1
    return torch.cuda.current_device()


# How many process groups this process has initialized through torch's
# store: every rank initializes the same groups in the same order, so the
# n-th one's key is the same on every rank and never an older address.
_store_inits = 0


def _job_store(timeout_s):
    """The job's key-value store for the coordinator's address, or None:
    torch.distributed's default store when the trainer has initialized
    torch.distributed; else, under torchrun (TORCHELASTIC_USE_AGENT_STORE
    =True), a client of the TCPStore its agent hosts on MASTER_ADDR:
    MASTER_PORT. None when MUON_COORDINATOR or MUON_COORDINATOR_PORT name
    the coordinator, or without torch. torch is imported here only under
    torchrun."""
    if os.environ.get("MUON_COORDINATOR") or \
            os.environ.get("MUON_COORDINATOR_PORT"):
        return None
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            from torch.distributed import distributed_c10d
            return distributed_c10d._get_default_store()
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
            return None
        import torch.distributed as tdist
        args = (os.environ.get("MASTER_ADDR", "127.0.0.1"),
                int(os.environ["MASTER_PORT"]))
        kwargs = dict(is_master=False,
                      timeout=datetime.timedelta(seconds=timeout_s))
        try:
            return tdist.TCPStore(*args, **kwargs)
        except Exception as e:
            # torch 2.x built without libuv (Debian's) refuses its default
            # even for a client; torch 1.13 has no use_libuv at all.
            if "libuv" not in str(e):
                raise
            return tdist.TCPStore(*args, use_libuv=False, **kwargs)
    except Exception:  # no torch, a stripped one, or no agent store
        return None


def _store_callbacks(store):
    """The publish and lookup callbacks (capi/muonrt.h muonrt_publish_fn,
    muonrt_lookup_fn) of the coordinator's address under this init's key of
    `store`. Errors inside (KeyboardInterrupt too: a callback cannot raise
    through C) are printed and reported as failures."""
    global _store_inits
    _store_inits += 1
    # An elastic restart reuses torchrun's store: a fresh key per attempt.
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    key = f"muonrt/coordinator/{restart}/{_store_inits}"

    def publish(_ctx, address):
        try:
            store.set(key, address)
            return 0
        except BaseException as e:  # reported by the library as UNAVAILABLE
            print(f"muonrt: publishing the coordinator's address in "
                  f"torch's store failed: {e!r}", file=sys.stderr)
            return 1

    def lookup(_ctx, timeout_s, buf, size):
        try:
            store.wait([key], datetime.timedelta(seconds=max(timeout_s, 0.0)))
            value = bytes(store.get(key))[:size - 1] + b"\0"
            ctypes.memmove(buf, value, len(value))
            return 0
        except BaseException as e:  # reported as DEADLINE_EXCEEDED
            print(f"muonrt: no coordinator address under {key!r} in "
                  f"torch's store: {e!r}", file=sys.stderr)
            return 1

    return _lib.PUBLISH_FN(publish), _lib.LOOKUP_FN(lookup)


def get_default_group():
    """The group of the last init_process_group(), or None."""
    if _default_group is not None and _default_group.destroyed:
        return None
    return _default_group


def is_initialized():
    return get_default_group() is not None


def destroy_process_group(group=None):
    """Destroys `group` (default: the default group) and its optimizers,
    each after the call in flight on it (from another thread) returns."""
    group = group if group is not None else _default_group
    if group is not None:
        group.destroy()


@atexit.register
def _destroy_at_exit():
    # Optimizers and groups in the right order before the interpreter tears
    # modules down (their __del__ would then run in any order).
    optim = sys.modules.get(__package__ + ".optim")
    if optim is not None:
        try:
            optim._destroy_all()
        except Exception:
            pass
    if _default_group is not None:
        try:
            _default_group.destroy()
        except Exception:
            pass


class Mesh:
    """A named device mesh: ``Mesh(["dp_shard"], [4])``,
    ``Mesh(("dp_replicate", "dp_shard"), (2, 2))``. Ranks are laid out
    row-major; the product of the sizes is the world size."""

    def __init__(self, names, sizes):
        if isinstance(names, str):
            names = [names]
        if isinstance(sizes, int):
            sizes = [sizes]
        self.names = tuple(str(n) for n in names)
        self.sizes = tuple(int(s) for s in sizes)
        if len(self.names) != len(self.sizes):
            raise ValueError(
                f"muonrt.Mesh: {len(self.names)} names {list(self.names)} "
                f"but {len(self.sizes)} sizes {list(self.sizes)}")
        if not self.names:
            raise ValueError("muonrt.Mesh: at least one dimension")
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"muonrt.Mesh: duplicate names {list(self.names)}")
        for n, s in zip(self.names, self.sizes):
            if s < 1:
                raise ValueError(f"muonrt.Mesh: dimension {n!r} has size {s}")
            _lib.c_int(s, f"Mesh dimension {n!r}'s size")

    @property
    def ndim(self):
        return len(self.names)

    def size(self, dim=None):
        """The number of ranks (dim None) or the size of dim (name or
        index)."""
        if dim is None:
            n = 1
            for s in self.sizes:
                n *= s
            return n
        if isinstance(dim, str):
            return self.sizes[self.names.index(dim)]
        return self.sizes[dim]

    @classmethod
    def from_device_mesh(cls, device_mesh):
        """A Mesh with the names and shape of a torch DeviceMesh (duck-typed:
        ``mesh_dim_names`` and ``mesh.shape``); unnamed dims are called
        "dim0", "dim1", ..."""
        shape = tuple(int(s) for s in device_mesh.mesh.shape)
        names = getattr(device_mesh, "mesh_dim_names", None)
        if not names:
            names = [f"dim{i}" for i in range(len(shape))]
        return cls(names, shape)

    def __eq__(self, other):
        return (isinstance(other, Mesh) and self.names == other.names
                and self.sizes == other.sizes)

    def __hash__(self):
        return hash((self.names, self.sizes))

    def __repr__(self):
        return f"Mesh({list(self.names)}, {list(self.sizes)})"


class Shard:
    """Placement Shard(dim): the tensor's dim `dim` is split over the mesh
    dimension like torch.chunk."""

    def __init__(self, dim):
        self.dim = int(dim)

    def __eq__(self, other):
        try:
            return normalize_placement(other) == repr(self)
        except ValueError:
            return False

    def __hash__(self):
        return hash(repr(self))

    def __repr__(self):
        return f"Shard({self.dim})"


class Replicate:
    """Placement Replicate(): every rank of the mesh dimension holds the
    whole tensor (along that dimension)."""

    def __eq__(self, other):
        try:
            return normalize_placement(other) == "Replicate()"
        except ValueError:
            return False

    def __hash__(self):
        return hash("Replicate()")

    def __repr__(self):
        return "Replicate()"


_SHARD_RE = re.compile(r"^Shard\(\s*(?:dim\s*=\s*)?(\d+)\s*\)$")
_REPLICATE_RE = re.compile(r"^Replicate\(\s*\)$")
_STRIDED_RE = re.compile(
    r"^_StridedShard\(\s*(?:dim\s*=\s*)?(\d+)\s*,\s*(?:sf|split_factor)\s*=\s*(\d+)\s*\)$")


def normalize_placement(placement):
    """The DTensor spelling the library takes ("Shard(0)", "Replicate()")
    of a string or placement object (torch's Shard(dim=0) included).
    _StridedShard(dim=d, sf=k) (FSDP2 over tensor parallelism) is kept as
    such. Raises ValueError for anything else (Partial(), ...)."""
    if isinstance(placement, str):
        text = placement.strip()
    else:
        text = repr(placement)
        cls = type(placement).__name__
        # torch's Shard has .dim; its repr is Shard(dim=0) (2.x).
        if cls == "Shard" and isinstance(getattr(placement, "dim", None), int):
            return f"Shard({placement.dim})"
        if cls == "Replicate":
            return "Replicate()"
        # FSDP2 over tensor parallelism: this mesh dim chunks the TP-local
        # shard (DTensor's _StridedShard(dim, split_factor)).
        if cls == "_StridedShard" and isinstance(
                getattr(placement, "dim", None), int):
            return (f"_StridedShard(dim={placement.dim}, "
                    f"sf={int(placement.split_factor)})")
    m = _SHARD_RE.match(text)
    if m:
        return f"Shard({int(m.group(1))})"
    m = _STRIDED_RE.match(text)
    if m:
        return f"_StridedShard(dim={int(m.group(1))}, sf={int(m.group(2))})"
    if _REPLICATE_RE.match(text):
        return "Replicate()"
    if text.startswith("Partial"):
        raise ValueError(
            f"placement {text}: Partial() is not supported (reduce the "
            f"gradient first; parameters are Shard(d) or Replicate())")
    raise ValueError(
        f"placement {text!r} is not supported: use Shard(d) or Replicate() "
        f"(DTensor spelling)")

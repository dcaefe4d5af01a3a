"""muonrt.Muon: torch.optim.Muon over libmuonrt, on one process or with
parameters sharded over ranks.

Parameters (the ``params`` argument)
------------------------------------
Every parameter has a name: the library keys plans, state_dict entries and
checkpoints by it, so it must be the same on every rank. Accepted forms:

* an iterable of ``(name, tensor)`` pairs: ``model.named_parameters()``,
  or the first list of ``muonrt.split_params(model)``;
* an iterable of dicts (param groups), each with ``"params"`` as a list of
  ``(name, tensor)`` pairs, or as a list of tensors plus a ``"param_names"``
  (alias ``"names"``) list of the same length, and optionally its own
  ``"lr"``, ``"weight_decay"`` and ``"momentum"``;
* plain tensors (or groups of them) without names: they are called
  ``"param_0"``, ``"param_1"``, ... in optimizer order (checkpoints then
  depend on that order).
Names are all given or all generated. After construction each group holds
tensors in ``"params"`` and their names in ``"param_names"`` (torch 2.x's
key for named parameters).

Per group, ``lr``, ``weight_decay`` and ``momentum`` may differ and
change at any time (schedulers: OneCycleLR and CyclicLR cycle momentum
too): step() pushes each group's current values, as torch.optim.Muon reads
them at every step. ``nesterov``, ``ns_coefficients``, ``eps``,
``ns_steps`` and ``adjust_lr_fn`` are one value for the whole optimizer
(the runtime runs one Newton-Schulz configuration): a group that sets
another value is a ValueError.

Layout (distributed mode)
-------------------------
* ``process_group``: a ``muonrt.ProcessGroup``; default: the group of
  ``muonrt.init_process_group()`` if there is one, else single device.
* ``mesh``: ``muonrt.Mesh(names, sizes)`` (or a torch DeviceMesh); its size
  must equal the group's world size. Default: DTensor parameters' mesh, else
  ``Mesh(["dp"], [world_size])`` (every parameter replicated: DDP; one
  process: ``Mesh(["dp_shard"], [1])``, the library's single-device mesh).
* ``placements``: per parameter, one placement per mesh dim in DTensor
  spelling ("Shard(0)", "Replicate()", or Shard/Replicate objects, torch's
  included): a dict ``{name: [...]}`` (every parameter must be listed),
  a callable ``(name, tensor) -> [...]``, or one list for all parameters.
  Default: Replicate() on every dim.
* ``global_shapes``: ``{name: (rows, cols)}`` or a callable: the shape of
  the whole tensor when the given one is a local shard (needed for Shard
  placements: Newton-Schulz and AdjustLR use the global shape).
* DTensor parameters (torch 2.x; duck-typed by ``placements``,
  ``device_mesh`` and ``to_local()``): mesh, placements and global shape are
  read from the parameter; the local tensor (``to_local()``) is what the
  library reads and writes, and ``p.grad.to_local()`` its gradient.

Zero copy: the library writes each parameter's local tensor in place
through its data pointer and reads its gradient through ``p.grad``'s data
pointer, re-bound at every step (``zero_grad(set_to_none=True)`` makes new
gradient tensors); Python references to the gradients are kept until the
next step. The optimizer's own state is the library's momentum buffers
(in the parameter's dtype unless momentum_dtype says otherwise).

Differences from torch.optim.Muon
---------------------------------
* Every parameter needs a gradient at every step: torch skips parameters
  whose ``grad`` is None, but this step is one collective over every
  parameter of every rank (each rank must send its shards to the owners),
  so a missing gradient is a RuntimeError naming the parameter, raised
  before anything is modified. Give parameters that received no gradient a
  zero gradient, or leave them out of the optimizer.
* Parameters are fp32 or bf16, contiguous, all on the CPU or all on one
  CUDA device. CUDA parameters run the whole step on their device (momentum
  buffers there too), ordered on ``torch.cuda.current_stream()``; step()
  returns once the step has finished on the GPU.
* Parameter groups are fixed at construction (add_param_group afterwards
  raises NotImplementedError).
* Newton-Schulz runs in fp32 for CPU parameters (torch's runs in bf16), so
  results match a float32 formulation of torch.optim.Muon; for CUDA
  parameters it runs in bf16 with fp32 accumulation, as torch's. Momentum
  buffers are in the parameter's dtype, as torch's (momentum_dtype).
"""
import collections.abc
import copy
import ctypes
import functools
import math
import json
import os
import threading
import warnings
import weakref

import torch

from . import _lib
from . import distributed as _dist
from .distributed import Mesh, ProcessGroup, normalize_placement

__all__ = ["Muon"]

DEFAULT_A = 3.4445
DEFAULT_B = -4.7750
DEFAULT_C = 2.0315
DEFAULT_NS_STEPS = 5
EPS = 1e-7

# Options that are one value for the whole optimizer (the library takes
# them at creation); _GROUP_KEYS are per group, pushed before each step.
_GLOBAL_KEYS = ("nesterov", "ns_coefficients", "eps", "ns_steps",
                "adjust_lr_fn")
_GROUP_KEYS = ("lr", "weight_decay", "momentum")


def _number(value, what):
    """float(value) for a hyperparameter (a Python number or a one-element
    tensor, as schedulers leave them); TypeError naming `what` and the
    value otherwise (float() alone names neither)."""
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError) as e:
        raise TypeError(f"muonrt.Muon: {what} must be a number, got "
                        f"{value!r}") from e


def _hooks(optimizer, name):
    """The hooks torch.optim.Optimizer keeps in attribute `name` (an
    OrderedDict since PyTorch 2.1; none before), in registration order."""
    return list(getattr(optimizer, name, {}).values())


def _group_hyperparameters(gi, group):
    """Param group gi's (lr, weight_decay, momentum) as floats."""
    return tuple(_number(group[key], f"param group {gi}'s {key}")
                 for key in _GROUP_KEYS)

_DTYPES = {torch.float32: _lib.FLOAT32, torch.bfloat16: _lib.BFLOAT16}

_live = weakref.WeakSet()  # optimizers with a library handle


def _destroy_all():
    for opt in list(_live):
        opt._destroy()


def _is_dtensor(t):
    return (hasattr(t, "placements") and hasattr(t, "device_mesh")
            and hasattr(t, "to_local"))


def _dtensor_class():
    """torch's DTensor class (torch.distributed.tensor from 2.4,
    torch.distributed._tensor before), or None without one."""
    try:
        from torch.distributed.tensor import DTensor
        return DTensor
    except ImportError:
        try:
            from torch.distributed._tensor import DTensor
            return DTensor
        except ImportError:
            return None


def _local(t):
    """The tensor whose memory holds t's elements on this rank: t itself,
    or a DTensor's local shard."""
    if _is_dtensor(t):
        local = getattr(t, "_local_tensor", None)
        if local is None:
            with torch.no_grad():
                local = t.to_local()
        return local
    return t


def _global_value(value, name, tensor, what):
    """Looks `name` up in a dict / calls a callable / returns a constant."""
    if value is None:
        return None
    if callable(value) and not isinstance(value, (list, tuple, dict)):
        return value(name, tensor)
    if isinstance(value, dict):
        if name not in value:
            raise ValueError(
                f"muonrt.Muon: {what} has no entry for parameter {name!r}")
        return value[name]
    return value


def _canonical(key, value):
    """A comparable form of a global option's value."""
    if key == "ns_coefficients":
        return tuple(float(v) for v in value)
    if key == "adjust_lr_fn":
        return "original" if value is None else value
    if key == "nesterov":
        return bool(value)
    if key == "ns_steps":
        return int(value)
    return float(value)


def _row_state_placements(placements, ndim):
    """A parameter's placements as its NorMuon row state ([..., rows, 1])
    takes them: a Shard of the last dim becomes Replicate()."""
    from torch.distributed.tensor import Replicate
    out = []
    for pl in placements:
        dim = getattr(pl, "dim", None)
        if pl.is_shard() and dim is not None and dim in (ndim - 1, -1):
            out.append(Replicate())
        else:
            out.append(pl)
    return tuple(out)


class _Slot:
    """One parameter as the library sees it."""
    __slots__ = ("name", "param", "local", "data_ptr", "dtype", "grad_dtype",
                 "local_shape", "global_shape", "placements", "device",
                 "group", "bound_grad", "grad_ref", "expert_stack",
                 "sub_mesh")



def _options_struct(defaults, runtime):
    """The muonrt_options of torch.optim.Muon's arguments (`defaults`) and
    the runtime's execution options (`runtime`)."""
    d = defaults
    opts = _lib.muonrt_options()
    _lib.lib().muonrt_options_default(ctypes.byref(opts))
    opts.lr = _number(d["lr"], "lr")
    opts.weight_decay = _number(d["weight_decay"], "weight_decay")
    opts.momentum = _number(d["momentum"], "momentum")
    opts.nesterov = 1 if d["nesterov"] else 0
    opts.ns_a, opts.ns_b, opts.ns_c = (float(v) for v in d["ns_coefficients"])
    opts.eps = float(d["eps"])
    opts.ns_steps = _lib.c_int(d["ns_steps"], "ns_steps")
    opts.adjust_lr_fn = str(d["adjust_lr_fn"] or "original").encode()
    if runtime["ns_schedule"]:
        opts.ns_schedule = str(runtime["ns_schedule"]).encode()
    if runtime["ns_method"]:
        opts.ns_method = str(runtime["ns_method"]).encode()
    opts.async_gpu_parallelism = 1 if runtime["async_gpu_parallelism"] else 0
    opts.prefetch_count = _lib.c_int(runtime["prefetch_count"],
                                     "prefetch_count")
    if runtime["assignment_policy"]:
        opts.assignment_policy = str(runtime["assignment_policy"]).encode()
    opts.bucket_size_bytes = _lib.c_int(runtime["bucket_size_bytes"],
                                        "bucket_size_bytes", 64)
    opts.transactional_step = 1 if runtime["transactional_step"] else 0
    opts.replan_every_steps = _lib.c_int(runtime["replan_every_steps"],
                                         "replan_every_steps")
    if runtime["exchange_dtype"]:
        opts.exchange_dtype = str(runtime["exchange_dtype"]).encode()
    opts.normuon = 1 if runtime["normuon"] else 0
    opts.overlap_backward = 1 if runtime["overlap_backward"] else 0
    opts.normuon_beta2 = float(runtime["normuon_beta2"])
    opts.normuon_eps = float(runtime["normuon_eps"])
    if runtime["momentum_dtype"] is not None:
        opts.momentum_dtype = _momentum_dtype_name(
            runtime["momentum_dtype"]).encode()
    if runtime["check_finite"] is not None:
        opts.check_finite = 1 if runtime["check_finite"] else 0
    if runtime["gpu_precision"] is not None:
        opts.gpu_precision = str(runtime["gpu_precision"]).encode()
    return opts


def _momentum_dtype_name(value):
    """momentum_dtype as the library spells it: a torch dtype
    (torch.float32, torch.bfloat16) or its name ("float32", "bfloat16";
    "param" is the parameter's dtype, the default)."""
    if isinstance(value, torch.dtype):
        names = {torch.float32: "float32", torch.bfloat16: "bfloat16"}
        if value not in names:
            raise ValueError(
                f"momentum_dtype {value} is not supported (use "
                "torch.float32 or torch.bfloat16)")
        return names[value]
    return str(value)

def _known_names(expert_stacks, names):
    """The set of parameter names `expert_stacks` gives, each one of
    `names`; raises ValueError naming those that are not."""
    expert_stacks = set(expert_stacks or ())
    unknown = expert_stacks - names
    if unknown:
        raise ValueError(f"muonrt.Muon: expert_stacks names unknown "
                         f"parameters {sorted(unknown)}")
    return expert_stacks


def _on_grad_ready(ref, i):
    """overlap_backward's gradient hook: marks parameter i of the optimizer
    `ref` (a weak reference) ready, unless it is gone or accumulating."""
    opt = ref()
    if opt is not None and not opt.accumulating:
        opt.mark_ready(i)


def _short_list(items, limit=4):
    """At most `limit` items of a list for a message, then how many more."""
    items = list(items)
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return f"{items[:limit]}{more}"


def _report_create_failure(process_group, error):
    """Tells the coordinator of `process_group` (else of the default group;
    none: nothing) that this rank will not create its optimizer because of
    `error`, so that the other ranks' creation fails at once naming this
    rank and the error instead of waiting out its join timeout. Best effort:
    never raises (the caller raises `error`)."""
    pg = process_group
    if pg is None:
        pg = _dist.get_default_group()
    if not isinstance(pg, ProcessGroup) or pg.destroyed:
        return
    message = f"{type(error).__name__}: {error}".encode("utf-8", "replace")
    try:
        _lib.lib().muonrt_pg_report_create_failure(pg.handle, message)
    except Exception:  # noqa: BLE001 (best effort; `error` is raised)
        pass


def _group_slot_indices(param_groups):
    """Each param group's slot indices: the groups' parameters numbered
    one after another, in order."""
    out = []
    k = 0
    for group in param_groups:
        n = len(group["params"])
        out.append(list(range(k, k + n)))
        k += n
    return out


def _holding_handle(method):
    """`method` run holding its optimizer's call lock (Muon._call_lock)."""
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._call_lock:
            return method(self, *args, **kwargs)
    return locked


class Muon(torch.optim.Optimizer):
    """torch.optim.Muon's update over libmuonrt (see the module docstring
    for the parameter and layout conventions).

    Args (torch.optim.Muon's, with its defaults and argument errors):
        params: named parameters or param groups (module docstring).
        lr (float): learning rate (1e-3).
        weight_decay (float): decoupled weight decay, applied with the
            unadjusted lr (0.1).
        momentum (float): momentum factor (0.95).
        nesterov (bool): Nesterov momentum (True).
        ns_coefficients (tuple): Newton-Schulz (a, b, c)
            ((3.4445, -4.7750, 2.0315)).
        eps (float): Frobenius-norm floor before Newton-Schulz (1e-7).
        ns_steps (int): Newton-Schulz iterations, < 100 (5).
        adjust_lr_fn (str or None): "original" (lr * sqrt(max(1, rows /
            cols)); None means it), "match_rms_adamw" (lr * 0.2 *
            sqrt(max(rows, cols))) or "spectral_norm" (lr * sqrt(rows /
            cols), microsoft/dion's default; arXiv 2310.17813), on the
            global shape.
    Layout (keyword-only): process_group, mesh, placements, global_shapes
        (module docstring); sub_mesh ({name: "pp=1"} or a callable:
        ownership restriction); row_splits ({name: [rows, ...]}: blocks
        of rows of a 2-D parameter, each orthogonalized as its own matrix
        with its own AdjustLR shape, e.g. a fused QKV [q, k, v] rows;
        microsoft/dion's split_sizes); num_heads ({name: heads}: equal
        blocks, per-head Newton-Schulz; dion's num_heads); expert_stacks (names of 3-D
        [experts, rows, cols] parameters: each slice is its own matrix).
    Runtime (keyword-only): ns_schedule ("quintic" | "polar_express"),
        ns_method ("standard" | "gram": iterate on the m x m Gram matrix |
        "auto": per matrix, whichever executes fewer FLOPs, i.e. Gram when
        the long side exceeds twice the short one on the CPU, 1.5 times on
        CUDA),
        async_gpu_parallelism (bool), prefetch_count (int),
        assignment_policy ("lpt" | "round_robin"), bucket_size_bytes (int),
        transactional_step (bool, False: a step that fails on any rank
        leaves every rank's parameters, momentum and step count bitwise
        as before it; costs a copy of the local shards and momentum on
        their device, sum(numel * (element bytes + momentum element
        bytes)) bytes per rank),
        replan_every_steps (int, 0 = never: every this many steps the
        coordinator re-plans from the ranks' measured Newton-Schulz times;
        results stay bitwise the same), exchange_dtype ("float32" (None):
        the single device's bits | "bfloat16": the gather and redistribute
        carry half the bytes, as torchtitan, microsoft/dion and Megatron-LM
        do; Newton-Schulz's input and output are rounded to nearest even
        bf16, so the result is the same on every layout and replicas stay
        equal).
    overlap_backward (keyword-only, bool, False): the step starts during
        backward: buckets are ordered last matrix first (list parameters in
        forward order), each plain parameter's gradient hook calls
        mark_ready, and a bucket whose parameters are all ready is
        exchanged and orthogonalized while backward goes on; step()
        finishes the rest. Bitwise the same results. The non-finite check
        is off with it unless check_finite=True (then a snapshot of
        parameters and momentum undoes a step with a NaN/Inf gradient);
        not with transactional_step; CPU tensors.
    gpu_precision (keyword-only, None): Newton-Schulz's element type on
        CUDA parameters: "bf16" (None; bf16 storage with fp32
        accumulation, as torch.optim.Muon's bf16 iteration), "tf32" or
        "fp32" (fp32 throughout: the same bits on every layout, also
        with several ranks on one GPU). CPU parameters run in fp32.
    check_finite (keyword-only, None): before the step changes anything,
        every gradient is scanned for NaN/Inf and the ranks agree; on one,
        step() raises (naming the rank, parameter and value) and nothing
        changes on any rank. None: on, except with overlap_backward; True;
        False: NaN/Inf propagate, as in torch.optim.Muon.
    momentum_dtype (keyword-only, None): the momentum buffer's dtype. None
        (or "param"): each parameter's own, as torch.optim.Muon keeps it
        (2 bytes per parameter for bf16). torch.float32 / "float32": fp32
        buffers for bf16 parameters too (2 more bytes per parameter; small
        increments (1 - momentum) * grad are no longer rounded away).
        torch.bfloat16 / "bfloat16". state_dict carries the values as fp32
        either way. Nesterov's look-ahead is formed per bucket, so the
        optimizer keeps no other per-parameter buffer.
    NorMuon (keyword-only; arXiv 2510.05491, microsoft/dion's NorMuon):
        normuon (bool, False): after Newton-Schulz each matrix's update is
        normalized per row by a second-moment estimate v (v <- lerp(v,
        mean over the row of O**2, 1 - normuon_beta2); O / (sqrt(v) +
        normuon_eps)) and rescaled to its Frobenius norm before AdjustLR;
        normuon_beta2 (float in [0, 1), 0.95); normuon_eps (float > 0,
        1e-8). The state "variance_neuron" (fp32, [..., rows, 1], sharded
        with the rows) is in state_dict and the checkpoints. CPU
        parameters, float32 exchange.
    QK-clip (keyword-only; MuonClip, Kimi K2 report arXiv 2507.20534,
        Megatron-LM's grouped-query rule): qk_clip (dict or None):
        {"threshold": 100.0, "alpha": 0.5, "layers": [{"q": name, "k":
        name, "num_heads": H, "num_kv_heads": G (default H), "head_dim": D,
        "q_row_begin": 0, "k_row_begin": 0, "k_head_dim": D, "q_rope_dim":
        0 (MLA: the rotary rows of each query head)}, ...]}; after a step,
        clip_qk(max_logits) scales the query and key rows of every group
        whose largest logit exceeded the threshold (muonrt.MaxLogitTracker
        records the maxima next to scaled_dot_product_attention).

    Raises at construction: ValueError (torch's argument errors; a
    parameter that is not 2-D, with torch's message and its name; not
    contiguous; layout errors), TypeError (dtype other than float32 /
    bfloat16), ValueError (parameters on several devices, or on neither
    the CPU nor CUDA), and the library's
    errors (distributed creation is collective: every rank constructs its
    optimizer at the same point).
    """

    def __init__(self, params, lr=1e-3, weight_decay=0.1, momentum=0.95,
                 nesterov=True, ns_coefficients=(DEFAULT_A, DEFAULT_B,
                                                  DEFAULT_C),
                 eps=EPS, ns_steps=DEFAULT_NS_STEPS, adjust_lr_fn=None, *,
                 process_group=None, mesh=None, placements=None,
                 global_shapes=None, sub_mesh=None, expert_stacks=(),
                 row_splits=None, num_heads=None,
                 ns_schedule=None, ns_method=None,
                 async_gpu_parallelism=False,
                 prefetch_count=0, assignment_policy=None,
                 bucket_size_bytes=0, transactional_step=False,
                 replan_every_steps=0, exchange_dtype=None, normuon=False,
                 normuon_beta2=0.95, normuon_eps=1e-8, qk_clip=None,
                 overlap_backward=False, momentum_dtype=None,
                 check_finite=None, gpu_precision=None):
        self._handle = None
        self._created = False
        # Held around every library call on the handle, and by _destroy:
        # close() or the group's destroy() from another thread waits for a
        # call in flight instead of freeing what it uses (the C ABI allows
        # one thread per handle at a time).
        self._call_lock = threading.RLock()
        # The Python types torch.optim.Muon.__init__ checks; the values are
        # checked once, by the library (muonrt_options_validate, below).
        if isinstance(lr, torch.Tensor) and lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
        if len(ns_coefficients) != 3:
            raise ValueError(
                "Coefficients must be a tuple of exactly 3 values")
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum,
                        nesterov=nesterov, ns_coefficients=ns_coefficients,
                        eps=eps, ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn)
        runtime = dict(
            ns_schedule=ns_schedule,
            ns_method=ns_method,
            async_gpu_parallelism=async_gpu_parallelism,
            prefetch_count=prefetch_count,
            assignment_policy=assignment_policy,
            bucket_size_bytes=bucket_size_bytes,
            transactional_step=transactional_step,
            replan_every_steps=replan_every_steps,
            exchange_dtype=exchange_dtype,
            normuon=normuon,
            normuon_beta2=normuon_beta2,
            normuon_eps=normuon_eps,
            overlap_backward=overlap_backward,
            momentum_dtype=momentum_dtype,
            check_finite=check_finite,
            gpu_precision=gpu_precision)
        # torch.optim.Muon's argument checks (its messages; torch checks
        # ns_steps at the first step, the library now) and the runtime
        # options': the library's, raised as InvalidArgumentError
        # (a ValueError) before anything else is done.
        # The same on every rank of an SPMD program: refused locally, so a
        # fallback construction (try ... except ValueError) stays possible.
        _lib.call("muonrt_options_validate",
                  ctypes.byref(_options_struct(defaults, runtime)))
        try:
            self._num_named = 0
            self._num_unnamed = 0
            super().__init__(params, defaults)
            names = self._check_param_groups(defaults)
            self._slots = self._make_slots(_known_names(expert_stacks,
                                                        names))
            self._resolve_process_group(process_group, mesh)
            self._resolve_layout(placements, global_shapes, sub_mesh)
            self._row_splits = self._resolve_row_splits(row_splits,
                                                        num_heads, names)
            self._check_hookable(overlap_backward)
            create_args = self._create_args(runtime)
        except Exception as e:
            # The other ranks wait in their creation's join: they fail at
            # once naming this rank and this error (the library does the
            # same for the checks of its own).
            _report_create_failure(process_group, e)
            raise
        self._create(create_args)
        self._set_variants(normuon, qk_clip, overlap_backward)
        self._momentum_dtype = momentum_dtype
        self._track_groups()

    def _track_groups(self):
        """After creation: each group's slots and members (fixed from now
        on) and the hyperparameters last pushed (none yet), and torch's
        per-parameter state, read through the library (see _StateView):
        never empty, so torch.distributed.checkpoint's
        get/set_optimizer_state_dict do not "initialize" it with a step."""
        self._group_slots = _group_slot_indices(self.param_groups)
        self._group_members = [tuple(id(p) for p in g["params"])
                               for g in self.param_groups]
        self._pushed = [None] * len(self.param_groups)
        self.state = _StateView(self)

    def _check_param_groups(self, defaults):
        """Checks the names (all given or none, each once) and that groups
        differ only in lr, weight_decay and momentum; returns the set of
        names."""
        if self._num_named and self._num_unnamed:
            raise ValueError(
                "all optimizer params should be with/without names. Some "
                "param names are missing")
        seen = set()
        for n in (n for g in self.param_groups for n in g["param_names"]):
            if n in seen:
                raise ValueError(
                    f"muonrt.Muon: parameter name {n!r} appears twice")
            seen.add(n)
        for gi, group in enumerate(self.param_groups):
            for key in _GLOBAL_KEYS:
                if _canonical(key, group[key]) != _canonical(key,
                                                             defaults[key]):
                    raise ValueError(
                        f"muonrt.Muon: param group {gi} sets {key}="
                        f"{group[key]!r}, but {key} is one value for the "
                        f"whole optimizer ({defaults[key]!r}); only lr, "
                        f"weight_decay and momentum may differ per group")
        return seen

    def _resolve_process_group(self, process_group, mesh):
        """Sets self._pg (the given group, else the default one, else None)
        and self._mesh, whose size must be the group's world size."""
        if process_group is None:
            process_group = _dist.get_default_group()
        if process_group is not None and not isinstance(process_group,
                                                        ProcessGroup):
            raise TypeError(
                f"muonrt.Muon: process_group must be a muonrt.ProcessGroup "
                f"(muonrt.init_process_group()), not "
                f"{type(process_group).__name__}")
        self._pg = process_group
        world = process_group.world_size if process_group else 1
        self._mesh = self._resolve_mesh(mesh, world)
        if self._mesh.size() == world:
            return
        if process_group is None:
            raise ValueError(
                f"muonrt.Muon: the mesh {self._mesh} has "
                f"{self._mesh.size()} ranks but there is no process "
                f"group: call muonrt.init_process_group() on every rank "
                f"first (or pass process_group=)")
        raise ValueError(
            f"muonrt.Muon: the mesh {self._mesh} has {self._mesh.size()} "
            f"ranks but the process group has {world}")

    # ---- param groups ------------------------------------------------------

    def add_param_group(self, param_group):
        """Adds a group during construction (torch's Optimizer.__init__
        calls this). Afterwards: NotImplementedError (the runtime plans over
        every parameter once)."""
        if getattr(self, "_created", False):
            raise NotImplementedError(
                "muonrt.Muon: parameter groups are fixed at construction "
                "(the runtime plans over every parameter once): create the "
                "optimizer with all its groups")
        if not isinstance(param_group, dict):
            raise TypeError("param group must be a dict")
        group = dict(param_group)
        params = group["params"]
        if isinstance(params, torch.Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError(
                "optimizer parameters need to be organized in ordered "
                "collections, but the ordering of tensors in sets will change "
                "between runs. Please use a list instead.")
        else:
            params = list(params)
        given = group.pop("names", None)
        if "param_names" in group:
            if given is not None:
                raise ValueError("muonrt.Muon: a param group has both "
                                 "'names' and 'param_names'")
            given = group["param_names"]
        tensors, names = [], []
        for p in params:
            if (isinstance(p, tuple) and len(p) == 2
                    and isinstance(p[0], str)):
                names.append(p[0])
                tensors.append(p[1])
            else:
                names.append(None)
                tensors.append(p)
        if given is not None:
            given = list(given)
            if any(n is not None for n in names):
                raise ValueError("muonrt.Muon: a param group has both "
                                 "(name, tensor) pairs and a names list")
            if len(given) != len(tensors):
                raise ValueError(
                    f"muonrt.Muon: a param group has {len(tensors)} params "
                    f"but {len(given)} names")
            names = [str(n) for n in given]
        offset = sum(len(g["params"]) for g in self.param_groups)
        for i, n in enumerate(names):
            if n is None:
                self._num_unnamed += 1
                names[i] = f"param_{offset + i}"
            else:
                self._num_named += 1
        group["params"] = tensors
        group["param_names"] = names
        super().add_param_group(group)

    # ---- construction --------------------------------------------------------

    def _resolve_row_splits(self, row_splits, num_heads, names):
        """{name: [rows per block]} from the row_splits and num_heads
        keywords (checked against the global shapes by the library)."""
        out = {}
        for what, given in (("row_splits", row_splits),
                            ("num_heads", num_heads)):
            unknown = set(given or {}) - set(names)
            if unknown:
                raise ValueError(f"muonrt.Muon: {what} names unknown "
                                 f"parameters {sorted(unknown)}")
        for name, splits in (row_splits or {}).items():
            out[name] = [int(n) for n in splits]
        for name, heads in (num_heads or {}).items():
            if name in out:
                raise ValueError(f"muonrt.Muon: {name!r} is in both "
                                 f"row_splits and num_heads")
            rows = self._global_rows(name)
            heads = int(heads)
            if heads < 1 or rows % heads != 0:
                raise ValueError(f"muonrt.Muon: num_heads {heads} does not "
                                 f"divide the {rows} rows of {name!r}")
            out[name] = [rows // heads] * heads
        return out

    def _global_rows(self, name):
        for s in self._slots:
            if s.name == name:
                return int(s.global_shape[0]) if s.global_shape else \
                    int(s.local_shape[0])
        raise ValueError(f"muonrt.Muon: unknown parameter {name!r}")

    def _make_slots(self, expert_stacks):
        slots = []
        for gi, group in enumerate(self.param_groups):
            for name, p in zip(group["param_names"], group["params"]):
                s = _Slot()
                s.name, s.param, s.group = name, p, gi
                s.expert_stack = name in expert_stacks
                want = 3 if s.expert_stack else 2
                if p.ndim != want:
                    if s.expert_stack:
                        raise ValueError(
                            f"muonrt.Muon: expert stack {name!r} must be 3-D "
                            f"[experts, rows, cols], found size {p.size()}")
                    raise ValueError(
                        "Muon only supports 2D parameters whereas we found a "
                        f"parameter with size: {p.size()} (parameter "
                        f"{name!r})")
                if torch.is_complex(p):
                    raise RuntimeError(
                        "Muon does not support complex parameters "
                        f"(parameter {name!r})")
                if p.dtype not in _DTYPES:
                    raise TypeError(
                        f"muonrt.Muon supports float32 and bfloat16 "
                        f"parameters; parameter {name!r} is {p.dtype}")
                local = _local(p)
                if local.layout != torch.strided:
                    raise ValueError(f"muonrt.Muon: parameter {name!r} is "
                                     f"{local.layout}, not dense")
                if not local.is_contiguous():
                    raise ValueError(
                        f"muonrt.Muon: parameter {name!r} is not contiguous "
                        f"(size {tuple(local.shape)}, stride "
                        f"{local.stride()}); pass contiguous tensors")
                if local.device.type == "cpu":
                    s.device = (_lib.CPU, 0)
                elif local.device.type == "cuda":
                    s.device = (_lib.CUDA, local.device.index or 0)
                else:
                    raise ValueError(
                        f"muonrt.Muon: parameter {name!r} is on "
                        f"{local.device}; CPU and CUDA tensors only")
                # A view of its own on the same storage: the memory the
                # library writes stays alive even after `p.data = ...`
                # (which the data pointer checks then refuse).
                s.local = local.detach()
                s.data_ptr = local.data_ptr()
                s.dtype = p.dtype
                s.grad_dtype = p.dtype
                s.local_shape = tuple(int(d) for d in local.shape)
                s.global_shape = tuple(int(d) for d in p.shape)
                s.bound_grad = None
                s.grad_ref = None
                slots.append(s)
        return slots

    def _resolve_mesh(self, mesh, world):
        dmeshes = {}
        for s in self._slots:
            if _is_dtensor(s.param):
                m = Mesh.from_device_mesh(s.param.device_mesh)
                dmeshes.setdefault(m, s.name)
        if len(dmeshes) > 1:
            desc = ", ".join(f"{n!r} on {m}" for m, n in dmeshes.items())
            raise ValueError(
                f"muonrt.Muon: DTensor parameters on different meshes "
                f"({desc}); one optimizer takes one mesh")
        if mesh is not None and not isinstance(mesh, Mesh):
            mesh = Mesh.from_device_mesh(mesh)
        if dmeshes:
            dmesh, name = next(iter(dmeshes.items()))
            if mesh is not None and mesh != dmesh:
                raise ValueError(
                    f"muonrt.Muon: mesh={mesh} but DTensor parameter "
                    f"{name!r} is on {dmesh}")
            return dmesh
        if mesh is not None:
            return mesh
        # One process: the library's single-device mesh name (what its
        # checkpoints record), so state_dict and `muonctl checkpoint
        # inspect` agree.
        if world == 1:
            return Mesh(["dp_shard"], [1])
        return Mesh(["dp"], [world])

    def _resolve_layout(self, placements, global_shapes, sub_mesh):
        if isinstance(placements, dict):
            extra = set(placements) - {s.name for s in self._slots}
            if extra:
                raise ValueError(f"muonrt.Muon: placements names unknown "
                                 f"parameters {sorted(extra)}")
        if isinstance(global_shapes, dict):
            extra = set(global_shapes) - {s.name for s in self._slots}
            if extra:
                raise ValueError(f"muonrt.Muon: global_shapes names unknown "
                                 f"parameters {sorted(extra)}")
        ndim = self._mesh.ndim
        for s in self._slots:
            if _is_dtensor(s.param):
                raw = list(s.param.placements)
            else:
                raw = _global_value(placements, s.name, s.param, "placements")
                if raw is None:
                    raw = ["Replicate()"] * ndim
                elif isinstance(raw, str) or not isinstance(raw, (list,
                                                                  tuple)):
                    raw = [raw]
                g = _global_value(global_shapes, s.name, s.param,
                                  "global_shapes")
                if g is not None:
                    s.global_shape = tuple(int(d) for d in g)
            try:
                s.placements = [normalize_placement(p) for p in raw]
            except ValueError as e:
                raise ValueError(f"muonrt.Muon: parameter {s.name!r}: {e}") \
                    from None
            if len(s.placements) != ndim:
                raise ValueError(
                    f"muonrt.Muon: parameter {s.name!r} has "
                    f"{len(s.placements)} placements {s.placements} but the "
                    f"mesh {self._mesh} has {ndim} dims (one placement per "
                    f"mesh dim)")
            if len(s.global_shape) != len(s.local_shape):
                raise ValueError(
                    f"muonrt.Muon: parameter {s.name!r}: global shape "
                    f"{list(s.global_shape)} and local shape "
                    f"{list(s.local_shape)} differ in rank")
            sharded = any(p.startswith("Shard") for p in s.placements)
            if (sharded and not _is_dtensor(s.param)
                    and self._mesh.size() > 1 and global_shapes is None):
                raise ValueError(
                    f"muonrt.Muon: parameter {s.name!r} is sharded "
                    f"({s.placements}) but its global shape is unknown: pass "
                    f"global_shapes={{name: shape}} (the local shard is "
                    f"{list(s.local_shape)})")
            if isinstance(sub_mesh, dict):  # unlisted: no restriction
                sm = sub_mesh.get(s.name)
            else:
                sm = _global_value(sub_mesh, s.name, s.param, "sub_mesh")
            if isinstance(sm, dict):  # {"pp": 1} -> "pp=1"
                sm = ",".join(f"{k}={v}" for k, v in sm.items())
            s.sub_mesh = sm or None

    def _create_args(self, runtime):
        """The arguments of muonrt_optimizer_create after the process
        group and the output (ctypes objects; the list keeps alive what they
        point to). Raises what the integer range checks raise."""
        _lib.lib()
        keep = []  # ctypes objects alive until create returns
        n = len(self._slots)
        params = (_lib.muonrt_param * n)()
        for i, s in enumerate(self._slots):
            self._fill_param(params[i], s, keep)
        opts = _options_struct(self.defaults, runtime)
        mesh_names = [m.encode() for m in self._mesh.names]
        c_names = (ctypes.c_char_p * len(mesh_names))(*mesh_names)
        c_sizes = (ctypes.c_int * self._mesh.ndim)(*self._mesh.sizes)
        keep += [opts, mesh_names]
        return [self._mesh.ndim, c_names, c_sizes, params, n,
                ctypes.byref(opts), keep]

    def _create(self, create_args):
        out = ctypes.c_void_p()
        pg = self._pg.handle if self._pg is not None else None
        _lib.call("muonrt_optimizer_create", pg, *create_args[:-1],
                  ctypes.byref(out))
        self._handle = out.value
        self._created = True
        _live.add(self)
        if self._pg is not None:
            self._pg._register(self)

    def _fill_param(self, c, s, keep):
        """Fills the C muonrt_param `c` for slot `s`, binding the slot's
        current gradient (if any); `keep` receives the ctypes objects that
        must stay alive until muonrt_optimizer_create returns."""
        def i64(values, what):
            arr = (ctypes.c_int64 * len(values))(*[
                _lib.c_int(v, f"parameter {s.name!r}'s {what}", 64)
                for v in values])
            keep.append(arr)
            return arr

        name = s.name.encode("utf-8")
        keep.append(name)
        c.name = name
        c.data = s.data_ptr
        if s.param.grad is not None:
            grad = self._grad_local(s)
            s.grad_dtype = grad.dtype
            s.grad_ref = grad
            s.bound_grad = grad.data_ptr()
        c.grad = s.bound_grad
        c.dtype = _DTYPES[s.dtype]
        c.grad_dtype = _DTYPES[s.grad_dtype]
        c.ndim = len(s.local_shape)
        c.local_shape = i64(s.local_shape, "local shape")
        c.strides = None
        c.global_shape = i64(s.global_shape, "global shape")
        pl = [p.encode() for p in s.placements]
        keep.append(pl)
        arr = (ctypes.c_char_p * len(pl))(*pl)
        keep.append(arr)
        c.placements = arr
        if s.sub_mesh:
            sm = s.sub_mesh.encode()
            keep.append(sm)
            c.sub_mesh = sm
        else:
            c.sub_mesh = None
        c.expert_stack = 1 if s.expert_stack else 0
        c.device_type, c.device_index = s.device
        splits = self._row_splits.get(s.name)
        if splits:
            c.row_splits = i64(splits, "row_splits")
            c.num_row_splits = len(splits)

    # ---- lifecycle -----------------------------------------------------------

    def _destroy(self):
        lock = getattr(self, "_call_lock", None)
        if lock is None:  # __init__ failed before the handle could exist
            return
        with lock:
            self._remove_hooks()
            handle, self._handle = getattr(self, "_handle", None), None
            if handle is not None:
                _lib.lib().muonrt_optimizer_destroy(handle)
                for s in self._slots:
                    s.grad_ref = None

    def __getstate__(self):
        raise TypeError(
            "muonrt.Muon cannot be pickled or deep-copied: it holds the "
            "library's optimizer (its buffers, its place in the job); save "
            "its state_dict() and load it into a new muonrt.Muon")

    def close(self):
        """Frees the library's optimizer (momentum buffers, exchange
        buffers). Further calls raise RuntimeError. Idempotent. Safe from
        another thread: it waits for a call in flight (a step blocked in a
        collective ends at the group's timeout at the latest)."""
        self._destroy()

    def __del__(self):
        try:
            self._destroy()
        except Exception:  # interpreter shutdown
            pass

    @property
    def _h(self):
        if self._handle is None:
            raise RuntimeError("muonrt.Muon: the optimizer was closed (or "
                               "its process group destroyed)")
        return self._handle

    # ---- step ----------------------------------------------------------------

    def _grad_local(self, s):
        g = s.param.grad
        if _is_dtensor(g):
            if _is_dtensor(s.param):
                gp = [normalize_placement(p) for p in g.placements]
                if gp != s.placements:
                    raise RuntimeError(
                        f"muonrt.Muon: the gradient of {s.name!r} has "
                        f"placements {gp}, the parameter {s.placements}")
            g = _local(g)
        if g.dtype not in _DTYPES:
            raise TypeError(
                f"muonrt.Muon: the gradient of {s.name!r} is {g.dtype}; "
                f"float32 or bfloat16 only")
        if tuple(g.shape) != s.local_shape:
            raise RuntimeError(
                f"muonrt.Muon: the gradient of {s.name!r} has size "
                f"{list(g.shape)}, the parameter {list(s.local_shape)}")
        if g.layout != torch.strided or not g.is_contiguous():
            raise RuntimeError(
                f"muonrt.Muon: the gradient of {s.name!r} is not contiguous "
                f"(stride {g.stride()})")
        if g.device != s.local.device:
            raise RuntimeError(
                f"muonrt.Muon: the gradient of {s.name!r} is on {g.device}, "
                f"the parameter on {s.local.device}")
        return g

    @torch.no_grad()
    def step(self, closure=None):
        """One optimizer step over every parameter (collective in
        distributed mode: every rank calls it).

        Reads each group's current lr, weight_decay and momentum. Every
        parameter needs a gradient (see the module docstring); all checks
        run before anything is modified, and a check failed on one rank
        fails the step on every rank (muonrt_optimizer_refuse_step). Raises
        RuntimeError for a missing gradient (naming the parameter), a
        gradient of another size, device or dtype than at construction, or
        a parameter whose storage moved; the library's errors otherwise.
        Returns closure's loss."""
        loss = None
        if closure is not None:
            # Outside the call lock: backward's hooks may call mark_ready
            # from autograd's device threads.
            with torch.enable_grad():
                loss = closure()
        return self._step(loss)

    @_holding_handle
    def _step(self, loss):
        """step() after its closure: the library's step."""
        if self._marking:
            return self._finish_overlapped_step(loss)
        h = self._h
        L = _lib.lib()
        try:
            grads = [self._checked_slot_grad(s) for s in self._slots]
            self._push_hyperparameters()
        except Exception as e:
            # The other ranks wait in this step's agreement: they fail
            # naming this rank instead of waiting out a collective.
            L.muonrt_optimizer_refuse_step(h, str(e).encode())
            raise
        for i, (s, g) in enumerate(zip(self._slots, grads)):
            ptr = g.data_ptr()
            if ptr != s.bound_grad:
                _lib.check(L.muonrt_optimizer_set_grad(h, i, ptr),
                           "muonrt_optimizer_set_grad")
                s.bound_grad = ptr
            s.grad_ref = g  # keeps the memory the library reads alive
        try:
            _lib.check(L.muonrt_optimizer_step(h, self._step_stream()),
                       "muonrt_optimizer_step")
        finally:
            self._release_grads()
            self._record_step_in_groups()
        return loss

    def _release_grads(self):
        """Drops the step's references to the gradients once the library
        step returned: it waited for every stream that read them (the
        caller's stream's later work is ordered after them), so
        zero_grad(set_to_none=True) frees them as with torch's optimizers
        instead of at the next step. The library keeps only their
        addresses, rebound at the next step when they change."""
        for s in self._slots:
            s.grad_ref = None

    def _check_not_moved(self, s):
        """RuntimeError when slot s's parameter storage moved since the
        optimizer was created (the library writes the old memory)."""
        if _local(s.param).data_ptr() != s.data_ptr:
            raise RuntimeError(
                f"muonrt.Muon: parameter {s.name!r} moved (its data "
                f"pointer changed since the optimizer was created, e.g. "
                f"`p.data = ...`): the optimizer writes the parameter in "
                f"place; create it again over the new tensor")

    def _checked_slot_grad(self, s):
        """step()'s checks of slot s: its storage did not move, and its
        gradient (_checked_grad)."""
        self._check_not_moved(s)
        return self._checked_grad(s)

    def _finish_overlapped_step(self, loss):
        """step() after mark_ready began the step: marks the rest and
        finishes it in the library even when a check here fails (the
        buckets already running are collectives every rank must end; the
        library then fails the step, naming what is missing), and refuses
        an lr or weight decay changed since the first mark (buckets may
        already be applied with the old values)."""
        h = self._h
        L = _lib.lib()
        try:
            error = None
            for i, s in enumerate(self._slots):
                if i in self._ready:
                    continue
                try:
                    self._bind_grad(i)
                except Exception as e:  # noqa: BLE001 (re-raised below)
                    # No stale pointer may stay bound: the library then
                    # fails the step for this parameter ("no gradient").
                    _lib.lib().muonrt_optimizer_set_grad(h, i, None)
                    s.bound_grad = None
                    error = error or e
            error = error or self._changed_after_mark()
            try:
                for gi, group in enumerate(self.param_groups):
                    hp = _group_hyperparameters(gi, group)
                    if hp != self._pushed[gi]:
                        raise RuntimeError(
                            f"muonrt.Muon: param group {gi}'s (lr, "
                            f"weight_decay, momentum) changed to {hp} after "
                            f"mark_ready began the step with "
                            f"{self._pushed[gi]}: this step was taken with "
                            f"those; set them before backward")
            except Exception as e:  # noqa: BLE001 (re-raised below)
                error = error or e
            status = L.muonrt_optimizer_step(h, self._step_stream())
            if error is not None:
                raise error
            _lib.check(status, "muonrt_optimizer_step")
        finally:
            self._marking = False
            self._ready = set()
            self._release_grads()
            self._record_step_in_groups()
        return loss

    def _changed_after_mark(self):
        """A RuntimeError naming the first marked parameter whose gradient
        was replaced after mark_ready (`p.grad = ...`: the library reads the
        marked one, kept alive by grad_ref, and would never see the new
        one), else None. A change in place is the library's to see (its
        debug mode compares the contents); the tensor's version counter
        cannot tell, since FSDP2's gradients are views of one buffer that
        its accumulation writes parameter by parameter."""
        for i in sorted(self._ready):
            s = self._slots[i]
            g = s.param.grad
            g = _local(g) if g is not None else None
            if g is None or g.data_ptr() != s.bound_grad:
                return RuntimeError(
                    f"muonrt.Muon: the gradient of {s.name!r} was replaced "
                    f"after mark_ready: the step took its momentum from the "
                    f"marked gradient and does not see the new one. Under "
                    f"overlap_backward the gradient is final at its hook; "
                    f"clip or scale it in the loss, or turn overlap_backward "
                    f"off")
        return None

    def _step_stream(self):
        """The stream the step is ordered on: torch's current stream of the
        parameters' CUDA device (its cudaStream_t), None for CPU tensors."""
        device = self._slots[0].device if self._slots else (_lib.CPU, 0)
        if device[0] != _lib.CUDA:
            return None
        import torch
        return torch.cuda.current_stream(device[1]).cuda_stream

    # ---- state ---------------------------------------------------------------

    @property
    def process_group(self):
        return self._pg

    @property
    def mesh(self):
        return self._mesh

    @property
    def rank(self):
        return self._pg.rank if self._pg is not None else 0

    @property
    def world_size(self):
        return self._pg.world_size if self._pg is not None else 1

    @property
    def param_names(self):
        """Every parameter's name, in optimizer order (the library's
        indices)."""
        return [s.name for s in self._slots]

    @property
    @_holding_handle
    def step_count(self):
        """Steps taken."""
        return int(_lib.lib().muonrt_optimizer_step_count(self._h))

    def _index(self, key):
        if isinstance(key, int):
            return key
        if isinstance(key, str):
            for i, s in enumerate(self._slots):
                if s.name == key:
                    return i
            raise KeyError(key)
        for i, s in enumerate(self._slots):
            if s.param is key:
                return i
        raise KeyError("parameter not in this optimizer")

    @_holding_handle
    def momentum_buffer(self, key):
        """A copy of a parameter's momentum buffer (fp32, the local shard's
        shape, on the parameter's device); `key` is an index, a name or the
        parameter."""
        i = self._index(key)
        s = self._slots[i]
        ptr = ctypes.POINTER(ctypes.c_float)()
        numel = ctypes.c_int64(0)
        _lib.call("muonrt_optimizer_momentum", self._h, i, ctypes.byref(ptr),
                  ctypes.byref(numel))
        out = torch.empty(s.local_shape, dtype=torch.float32)
        if out.numel() != numel.value:
            raise RuntimeError(
                f"muonrt.Muon: the library's momentum buffer of {s.name!r} "
                f"has {numel.value} elements, the local shard "
                f"{out.numel()}")
        if numel.value:
            ctypes.memmove(out.data_ptr(), ptr, 4 * numel.value)
        return out.to(s.local.device)

    def _set_variants(self, normuon, qk_clip, overlap_backward):
        """The options set after the library's optimizer exists: NorMuon's
        state keys, QK-clip's layers, and overlap_backward's state and
        gradient hooks."""
        self._normuon = bool(normuon)
        # The variant's row state key in state_dict ("variance_neuron" with
        # NorMuon), as the library names it; None without a variant.
        name = ctypes.c_char_p()
        _lib.call("muonrt_optimizer_row_state_name", self._h,
                  ctypes.byref(name))
        self._row_state_key = (name.value or b"").decode() or None
        self._qk_layer_heads = []
        if qk_clip:
            self._set_qk_clip(qk_clip)
        # overlap_backward: the step starts during backward (mark_ready).
        self.accumulating = False
        self._marking = False
        self._ready = set()
        self._hooks = []
        self._overlap = bool(overlap_backward)
        if overlap_backward:
            self._register_ready_hooks()
        self._record_step_in_groups()

    def _record_step_in_groups(self):
        """Keeps each live group's "muonrt_step" at the step count:
        torch.distributed.checkpoint's flattened optimizer state
        (StateDictOptions(flatten_optimizer_state_dict=True), as torchtitan
        saves) rebuilds groups from the keys the live groups have, so a
        key only state_dict() added was dropped and a resumed run counted
        from 0."""
        n = self.step_count
        for g in self.param_groups:
            g["muonrt_step"] = n

    def _check_hookable(self, overlap_backward):
        """With overlap_backward, before the library is created: every
        parameter can take the gradient hook that marks it ready (torch
        refuses a hook on a tensor that does not require grad, naming
        neither the parameter nor the option); warns when a
        torch.distributed job of several ranks may average the gradients
        after the hooks (torch DDP: one muonrt rank per torch rank would
        take each rank's own gradient)."""
        dist = getattr(torch, "distributed", None)
        if (overlap_backward and self.world_size == 1 and dist is not None
                and dist.is_available() and dist.is_initialized()
                and dist.get_world_size() > 1):
            # A warning, not an error: a pipeline stage or rank-local
            # experts with an optimizer of their own are fine.
            warnings.warn(
                f"muonrt.Muon: overlap_backward with a muonrt world of one "
                f"inside a torch.distributed job of "
                f"{dist.get_world_size()} ranks: if that job averages the "
                f"gradients after backward (torch DDP), the gradient hooks "
                f"take each rank's own gradient before it and the replicas "
                f"drift apart; join the ranks with "
                f"muonrt.init_process_group() (each matrix then "
                f"orthogonalized once in the job), or leave "
                f"overlap_backward off", RuntimeWarning, stacklevel=3)
        for s in self._slots if overlap_backward else ():
            if not s.param.requires_grad:
                raise ValueError(
                    f"muonrt.Muon: parameter {s.name!r} does not require "
                    f"grad (requires_grad=False), but overlap_backward marks "
                    f"each parameter ready from its gradient's hook and the "
                    f"step needs every gradient: leave frozen parameters "
                    f"out of the optimizer")

    def _register_ready_hooks(self):
        """overlap_backward: a hook that marks a parameter ready once its
        gradient is final (Tensor.register_post_accumulate_grad_hook,
        PyTorch 2.1+; the AccumulateGrad node's post-hook on older
        PyTorch): on FSDP2's sharded DTensor parameters, whose hooks FSDP2
        runs after the layer's reduce-scatter, and on every parameter of a
        single process. Plain tensors of several ranks get none: their
        final gradient comes after what the trainer does with autograd's
        (torch DDP averages it later in backward, a hand-made FSDP cuts
        it): call mark_ready when it is final."""
        single = self.world_size == 1
        # The hooks reach the optimizer through a weak reference (the
        # parameters must not keep it alive) and are removed when it is
        # closed (a closed or replaced optimizer marks nothing).
        ref = weakref.ref(self)
        for i, s in enumerate(self._slots):
            p = s.param
            if not single and not _is_dtensor(p):
                continue
            if hasattr(p, "register_post_accumulate_grad_hook"):
                h = p.register_post_accumulate_grad_hook(
                    lambda _p, i=i: _on_grad_ready(ref, i))
            else:
                node = p.expand_as(p).grad_fn.next_functions[0][0]
                h = node.register_hook(
                    lambda *_, i=i: _on_grad_ready(ref, i))
                self._hooks.append(node)  # keeps the node alive
            self._hooks.append(h)

    def _remove_hooks(self):
        """Removes overlap_backward's gradient hooks (close, destruction)."""
        for h in getattr(self, "_hooks", ()):
            if hasattr(h, "remove"):
                h.remove()
        self._hooks = []

    def _check_group_members(self):
        """RuntimeError when param_groups or a group's "params" changed
        since construction (torch would step the new list; the runtime
        plans over the parameters it was created with)."""
        now = [tuple(id(p) for p in g["params"]) for g in self.param_groups]
        if now == self._group_members:
            return
        if len(now) != len(self._group_members):
            what = (f"{len(now)} param groups, it was created with "
                    f"{len(self._group_members)}")
        else:
            gi = next(i for i, (a, b) in
                      enumerate(zip(now, self._group_members)) if a != b)
            what = (f"param group {gi} holds {len(now[gi])} parameters or "
                    f"others than the {len(self._group_members[gi])} it was "
                    f"created with")
        raise RuntimeError(
            f"muonrt.Muon: the optimizer has {what}: the parameters are "
            f"fixed at construction (the runtime plans over them once); "
            f"create the optimizer again")

    def _push_hyperparameters(self):
        """Each group's current lr, weight_decay and momentum to the library
        (those that changed since the last push), after checking that the
        groups' parameters did not change."""
        self._check_group_members()
        L = _lib.lib()
        for gi, group in enumerate(self.param_groups):
            for key in _GLOBAL_KEYS:
                if _canonical(key, group[key]) != _canonical(
                        key, self.defaults[key]):
                    raise RuntimeError(
                        f"muonrt.Muon: param group {gi}'s {key} changed to "
                        f"{group[key]!r}; only lr, weight_decay and momentum "
                        f"can change after construction")
            hp = _group_hyperparameters(gi, group)
            if hp != self._pushed[gi]:
                for i in self._group_slots[gi]:
                    _lib.check(L.muonrt_optimizer_set_hyperparameters(
                        self._h, i, *hp),
                        "muonrt_optimizer_set_hyperparameters")
                self._pushed[gi] = hp

    def _checked_grad(self, s):
        """Slot s's local gradient, checked: present, of the dtype it had
        at construction (and _grad_local's checks)."""
        if s.param.grad is None:
            raise RuntimeError(
                f"muonrt.Muon: parameter {s.name!r} has no gradient "
                f"(grad is None). torch.optim.Muon skips such parameters, "
                f"but this step is one collective over every parameter "
                f"of every rank: give it a zero gradient, or leave it out "
                f"of the optimizer")
        g = self._grad_local(s)
        if g.dtype != s.grad_dtype:
            raise RuntimeError(
                f"muonrt.Muon: the gradient of {s.name!r} is {g.dtype}, "
                f"it was {s.grad_dtype} when the optimizer was created")
        return g

    def _bind_grad(self, i):
        """Checks parameter i's gradient as step() does and hands its
        pointer to the library."""
        s = self._slots[i]
        g = self._checked_slot_grad(s)
        ptr = g.data_ptr()
        if ptr != s.bound_grad:
            _lib.check(_lib.lib().muonrt_optimizer_set_grad(self._h, i, ptr),
                       "muonrt_optimizer_set_grad")
            s.bound_grad = ptr
        s.grad_ref = g

    @_holding_handle
    def mark_ready(self, key):
        """overlap_backward: marks a parameter's gradient final for the
        coming step (`key`: index, name or the parameter). Its momentum
        runs now (CPU tensors; on CUDA tensors it is ordered on the
        current stream, which a hook gets from autograd), and every bucket
        whose parameters are all ready starts its exchange and
        Newton-Schulz on the library's threads while backward goes on;
        step() finishes the rest. The hooks call it
        after each gradient's accumulation (not while `accumulating` is
        True: set it for every micro-batch's backward but the last). The
        gradient must not change afterwards in this step."""
        i = self._index(key)
        if not self._marking:
            self._push_hyperparameters()
            self._marking = True
        self._bind_grad(i)
        # Ordered on the stream that produced the gradient: in a hook,
        # the current stream autograd runs the node on.
        _lib.call("muonrt_optimizer_mark_ready", self._h, i,
                  self._step_stream())
        self._ready.add(i)

    def _set_qk_clip(self, spec):
        """Hands the qk_clip keyword to the library
        (muonrt_optimizer_set_qk_clip)."""
        known = {"threshold", "alpha", "layers"}
        if not isinstance(spec, dict) or set(spec) - known:
            raise ValueError(f"muonrt.Muon: qk_clip must be a dict with keys "
                             f"{sorted(known)}, got {spec!r}")
        layers = list(spec.get("layers", ()))
        arr = (_lib.muonrt_qk_clip_layer * max(1, len(layers)))()
        self._qk_names = []  # keeps the encoded names alive
        self._qk_layer_heads = []
        for i, layer in enumerate(layers):
            keys = {"q", "k", "num_heads", "num_kv_heads", "head_dim",
                    "q_row_begin", "k_row_begin", "k_head_dim", "q_rope_dim"}
            if set(layer) - keys or not {"q", "k", "num_heads",
                                         "head_dim"} <= set(layer):
                raise ValueError(
                    f"muonrt.Muon: qk_clip layer {i} needs q, k, num_heads "
                    f"and head_dim (optional num_kv_heads, q_row_begin, "
                    f"k_row_begin), got {sorted(layer)}")
            q, k = str(layer["q"]).encode(), str(layer["k"]).encode()
            self._qk_names += [q, k]
            arr[i].q_param, arr[i].k_param = q, k
            for key, bits in (("q_row_begin", 64), ("k_row_begin", 64),
                              ("num_heads", 32), ("num_kv_heads", 32),
                              ("head_dim", 64), ("k_head_dim", 64),
                              ("q_rope_dim", 64)):
                setattr(arr[i], key, _lib.c_int(
                    layer.get(key, 0), f"qk_clip layer {i}'s {key}", bits))
            self._qk_layer_heads.append(arr[i].num_heads)
        _lib.call("muonrt_optimizer_set_qk_clip", self._h,
                  float(spec.get("threshold", 100.0)),
                  float(spec.get("alpha", 0.5)), arr, len(layers))

    @_holding_handle
    def clip_qk(self, max_logits):
        """QK-clip after step() (collective: every rank calls it).
        `max_logits`: one [num_heads] tensor per qk_clip layer (None or
        -inf for heads this rank did not compute), or one flat tensor; the
        ranks' MAX decides. Returns {"groups_clipped", "max_logit"}.
        Raises RuntimeError for a parameter whose storage moved (the
        clipping writes the parameters in place)."""
        for s in self._slots:
            self._check_not_moved(s)
        parts = []
        listed = isinstance(max_logits, (list, tuple))
        for i, m in enumerate(max_logits if listed else [max_logits]):
            if m is None and listed and i < len(self._qk_layer_heads):
                m = torch.full((self._qk_layer_heads[i],), -math.inf)
            parts.append(torch.as_tensor(m, dtype=torch.float32).reshape(-1)
                         .detach().cpu())
        flat = torch.cat(parts) if parts else torch.empty(0)
        flat = flat.contiguous()
        groups = ctypes.c_int64(0)
        top = ctypes.c_float(0)
        _lib.call("muonrt_optimizer_clip_qk", self._h,
                  ctypes.cast(flat.data_ptr(), ctypes.POINTER(ctypes.c_float)),
                  flat.numel(), ctypes.byref(groups), ctypes.byref(top),
                  self._step_stream())
        return {"groups_clipped": groups.value, "max_logit": top.value}

    def variance_neuron(self, key):
        """NorMuon's name for row_state(key) (its state_dict key)."""
        return self.row_state(key)

    @_holding_handle
    def row_state(self, key):
        """A copy of a parameter's row state of the owner-side variant
        (NorMuon's "variance_neuron": fp32, the local shard's shape with
        the last dim 1, on the parameter's device), or None without a
        variant; `key` as momentum_buffer's."""
        if self._row_state_key is None:
            return None
        i = self._index(key)
        s = self._slots[i]
        ptr = ctypes.POINTER(ctypes.c_float)()
        numel = ctypes.c_int64(0)
        _lib.call("muonrt_optimizer_row_state", self._h, i,
                  ctypes.byref(ptr), ctypes.byref(numel))
        out = torch.empty(tuple(s.local_shape[:-1]) + (1,),
                          dtype=torch.float32)
        if out.numel() != numel.value:
            raise RuntimeError(
                f"muonrt.Muon: the library's {self._row_state_key} of "
                f"{s.name!r} "
                f"has {numel.value} elements, expected {out.numel()}")
        if numel.value:
            ctypes.memmove(out.data_ptr(), ptr, 4 * numel.value)
        return out.to(s.local.device)

    @_holding_handle
    def write_spec(self, path, job_id="job"):
        """Writes this optimizer's own job spec to `path` (muonctl's JSON
        format, spec_from_module's fields): its mesh, and every parameter's
        name, global shape, placements and sub-mesh as the optimizer took
        them, so that ``muonctl plan --spec PATH`` or ``muonctl report
        --spec PATH`` describes exactly this job. Returns the spec dict."""
        from .spec import write_spec
        params = []
        for s in self._slots:
            p = {"name": s.name, "shape": [int(d) for d in s.global_shape],
                 "placements": list(s.placements)}
            if s.sub_mesh:
                p["sub_mesh"] = {k: int(v) for k, v in (
                    kv.split("=") for kv in s.sub_mesh.split(","))}
            if self._row_splits.get(s.name):
                p["row_splits"] = list(self._row_splits[s.name])
            params.append(p)
        spec = {"job_id": str(job_id),
                "mesh": {"dims": [{"name": n, "size": int(z)} for n, z in
                                  zip(self._mesh.names, self._mesh.sizes)]},
                "params": params}
        optimizer = {}
        if self._normuon:
            optimizer["normuon"] = True
        # A spec's parameters carry no dtype (float32): the momentum's
        # bytes follow momentum_dtype, the parameters' dtype by default.
        momentum = self._momentum_dtype
        if momentum is None and self._slots and all(
                s.param.dtype == torch.bfloat16 for s in self._slots):
            momentum = "bfloat16"
        if momentum is not None and _momentum_dtype_name(momentum) != "param":
            optimizer["momentum_dtype"] = _momentum_dtype_name(momentum)
        if optimizer:
            spec["optimizer"] = optimizer
        if self._overlap:
            spec["execution"] = {"overlap_backward": True}
        write_spec(spec, path)
        return spec

    def _layout_meta(self):
        return {
            "format": 1,
            "step": self.step_count,
            "rank": self.rank,
            "world_size": self.world_size,
            "mesh": {"names": list(self._mesh.names),
                     "sizes": list(self._mesh.sizes)},
            "names": [s.name for s in self._slots],
            "global_shapes": [list(s.global_shape) for s in self._slots],
            "local_shapes": [list(s.local_shape) for s in self._slots],
            "placements": [list(s.placements) for s in self._slots],
        }

    def _momentum_state(self, i):
        """Parameter i's momentum buffer as torch.optim.Muon's state holds
        it: a copy of the local shard, or, for a DTensor parameter, a
        DTensor with the parameter's mesh, placements and global shape
        (so that torch.distributed.checkpoint reshards it)."""
        buf = self.momentum_buffer(i)
        p = self._slots[i].param
        DTensor = _dtensor_class()
        if not _is_dtensor(p) or DTensor is None or not isinstance(p, DTensor):
            return buf
        return DTensor.from_local(buf, device_mesh=p.device_mesh,
                                  placements=p.placements, run_check=False,
                                  shape=p.shape, stride=p.stride())

    def _param_state(self, i):
        """torch's per-parameter state dict of parameter i: its momentum
        buffer, and with a variant (NorMuon) its row state."""
        st = {"momentum_buffer": self._momentum_state(i)}
        if self._row_state_key is not None:
            st[self._row_state_key] = self._row_state_entry(i)
        return st

    def _row_state_entry(self, i):
        """Parameter i's row state (NorMuon's): a copy of the local rows
        ([..., local rows, 1]), or, for a DTensor parameter, a DTensor of
        global shape [..., rows, 1] with the parameter's placements. A
        Shard of the last dim then chunks a dim of size 1: the rank at
        coordinate 0 on that mesh dim holds the rows' state (it holds
        columns, so its copy is current) and the others an empty [..., 0]
        part, so torch.distributed.checkpoint saves each row once."""
        buf = self.row_state(i)
        p = self._slots[i].param
        DTensor = _dtensor_class()
        if not _is_dtensor(p) or DTensor is None or not isinstance(p, DTensor):
            return buf
        coord = p.device_mesh.get_coordinate()
        last = p.dim() - 1
        for d, pl in enumerate(p.placements):
            dim = getattr(pl, "dim", None)
            if pl.is_shard() and dim in (last, -1) and coord[d] != 0:
                buf = buf[..., :0]
        shape = tuple(p.shape[:-1]) + (1,)
        stride = torch.empty(shape, device="meta").stride()
        return DTensor.from_local(
            buf.contiguous(), device_mesh=p.device_mesh,
            placements=tuple(p.placements), run_check=False, shape=shape,
            stride=stride)

    @_holding_handle
    def state_dict(self):
        """This rank's state in torch's structure:
        ``{"state": {i: {"momentum_buffer": fp32 tensor}}, "param_groups":
        [group options with "params": [indices], "param_names" and
        "muonrt_step"], "muonrt": {"step", "rank", "world_size", "mesh",
        "names", "global_shapes", "local_shapes", "placements"}}``. The
        momentum buffer is a copy of the local shard, or a DTensor on the
        parameter's mesh with its placements for DTensor parameters
        (torch.distributed.checkpoint's get_optimizer_state_dict and
        dcp.save reshard it; "muonrt_step" carries the step count through
        it). torch.save / torch.load round-trip it; load_state_dict restores
        it on the same layout, or from DTensors of any layout. Runs the
        hooks of register_state_dict_pre_hook / _post_hook (PyTorch 2.1+)
        as torch.optim.Optimizer.state_dict does: a post-hook's non-None
        result is returned instead."""
        for hook in _hooks(self, "_optimizer_state_dict_pre_hooks"):
            hook(self)
        state = {i: self._param_state(i) for i in range(len(self._slots))}
        groups = []
        for gi, group in enumerate(self.param_groups):
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["param_names"] = list(group["param_names"])
            packed["params"] = list(self._group_slots[gi])
            packed["muonrt_step"] = self.step_count
            groups.append(packed)
        state_dict = {"state": state, "param_groups": groups,
                      "muonrt": self._layout_meta()}
        for hook in _hooks(self, "_optimizer_state_dict_post_hooks"):
            result = hook(self, state_dict)
            if result is not None:
                state_dict = result
        return state_dict

    @_holding_handle
    def load_state_dict(self, state_dict):
        """Restores a state_dict() of this optimizer's layout (same
        groups, names, shapes and placements, same rank), or a
        torch.optim.Muon state_dict of the same parameters (single process;
        its step count is not recorded there: 0). Every check comes before
        any write (on a check's error nothing changed; a CUDA copy error
        midway leaves the parameters before the failing one loaded).
        Raises ValueError naming the parameter and expected vs actual. Runs
        the hooks of register_load_state_dict_pre_hook / _post_hook
        (PyTorch 2.1+) as torch.optim.Optimizer.load_state_dict does: a
        pre-hook gets a shallow copy, and its non-None result is what is
        loaded."""
        state_dict = dict(state_dict)
        for hook in _hooks(self, "_optimizer_load_state_dict_pre_hooks"):
            result = hook(self, state_dict)
            if result is not None:
                state_dict = result
        self._load_state_dict(state_dict)
        for hook in _hooks(self, "_optimizer_load_state_dict_post_hooks"):
            hook(self)

    def _load_state_dict(self, state_dict):
        """load_state_dict's restore, between its hooks."""
        if "state" not in state_dict or "param_groups" not in state_dict:
            raise ValueError("muonrt.Muon.load_state_dict: expected a dict "
                             "with 'state' and 'param_groups'")
        # Copies, as torch's load_state_dict deep-copies the groups (a
        # tensor lr must not be shared with the state_dict's owner), made
        # before anything is loaded.
        saved_groups = copy.deepcopy(state_dict["param_groups"])
        self._check_saved_groups(saved_groups)
        step = _lib.c_int(self._saved_step(state_dict.get("muonrt"),
                                           saved_groups),
                          "the state_dict's step count", 64)
        buffers = self._saved_buffers(state_dict["state"], saved_groups)
        n = len(buffers)

        def arrays(tensors):
            ptrs = (ctypes.POINTER(ctypes.c_float) * n)(*[
                ctypes.cast(b.data_ptr(), ctypes.POINTER(ctypes.c_float))
                for b in tensors])
            return ptrs, (ctypes.c_int64 * n)(*[b.numel() for b in tensors])

        ptrs, numels = arrays(buffers)
        if self._row_state_key is not None:
            variances = self._saved_buffers(state_dict["state"], saved_groups,
                                            key=self._row_state_key)
            vptrs, vnumels = arrays(variances)
            _lib.call("muonrt_optimizer_load_full_state", self._h, step, ptrs,
                      numels, vptrs, vnumels, n)
        else:
            _lib.call("muonrt_optimizer_load_state", self._h, step, ptrs,
                      numels, n)
        for g, sg in zip(self.param_groups, saved_groups):
            for k, v in sg.items():
                if k not in ("params", "param_names", "muonrt_step"):
                    g[k] = v
        self._pushed = [None] * len(self.param_groups)
        self._record_step_in_groups()

    def _check_saved_groups(self, saved_groups):
        """The saved param groups match this optimizer's: their count and
        sizes (torch's messages), names, and the options fixed at
        construction."""
        groups = self.param_groups
        if len(groups) != len(saved_groups):
            raise ValueError("loaded state dict has a different number of "
                             "parameter groups")
        for g, sg in zip(groups, saved_groups):
            if len(g["params"]) != len(sg["params"]):
                raise ValueError(
                    "loaded state dict contains a parameter group that "
                    "doesn't match the size of optimizer's group")
            if "param_names" in sg and list(sg["param_names"]) != list(
                    g["param_names"]):
                for a, b in zip(sg["param_names"], g["param_names"]):
                    if a != b:
                        raise ValueError(
                            f"muonrt.Muon.load_state_dict: the state_dict has "
                            f"parameter {a!r} where this optimizer has {b!r}")
                raise ValueError(
                    f"muonrt.Muon.load_state_dict: a param group of the "
                    f"state_dict names {len(sg['param_names'])} parameters, "
                    f"this optimizer's {len(g['param_names'])}")
            for key in _GLOBAL_KEYS:
                if key in sg and _canonical(key, sg[key]) != _canonical(
                        key, self.defaults[key]):
                    raise ValueError(
                        f"muonrt.Muon.load_state_dict: the state_dict has "
                        f"{key}={sg[key]!r}, this optimizer {key}="
                        f"{self.defaults[key]!r} (fixed at construction)")

    def _saved_step(self, meta, saved_groups):
        """The step count of a state_dict: from its "muonrt" entry (whose
        rank and layout must be this optimizer's), else its first group's
        "muonrt_step", else 0 (torch.optim.Muon records none)."""
        if meta is None:
            if saved_groups and "muonrt_step" in saved_groups[0]:
                return int(saved_groups[0]["muonrt_step"])
            return 0
        mine = self._layout_meta()
        missing = [k for k in ("step", "names", "global_shapes",
                               "local_shapes", "placements") if k not in meta]
        if missing:
            raise ValueError(
                f"muonrt.Muon.load_state_dict: the state_dict's 'muonrt' "
                f"entry lacks {missing}")
        if (meta.get("rank"), meta.get("world_size")) != (
                mine["rank"], mine["world_size"]):
            raise ValueError(
                f"muonrt.Muon.load_state_dict: the state_dict is rank "
                f"{meta.get('rank')} of {meta.get('world_size')}, this "
                f"optimizer rank {mine['rank']} of {mine['world_size']} "
                f"(state_dict is per rank; load_checkpoint reshards; for "
                f"torch.distributed.checkpoint, which keeps one copy of "
                f"what all ranks name alike, save "
                f"torch.distributed.checkpoint.state_dict."
                f"get_optimizer_state_dict(model, optimizer) over DTensor "
                f"parameters)")
        if list(meta["names"]) != mine["names"]:
            raise ValueError(
                f"muonrt.Muon.load_state_dict: the state_dict's parameters "
                f"are {_short_list(meta['names'])}, this optimizer's "
                f"{_short_list(mine['names'])}")
        for key in ("global_shapes", "local_shapes", "placements"):
            if len(meta[key]) != len(mine[key]):
                raise ValueError(
                    f"muonrt.Muon.load_state_dict: the state_dict's 'muonrt' "
                    f"entry has {len(meta[key])} {key}, this optimizer "
                    f"{len(mine[key])} parameters")
            for name, a, b in zip(mine["names"], meta[key], mine[key]):
                if list(a) != list(b):
                    raise ValueError(
                        f"muonrt.Muon.load_state_dict: parameter "
                        f"{name!r}: {key[:-1].replace('_', ' ')} "
                        f"{list(a)} in the state_dict, {list(b)} here")
        return int(meta["step"])

    def _saved_buffers(self, state, saved_groups, key="momentum_buffer"):
        """The `key` state ("momentum_buffer" or the variant's row state,
        NorMuon's "variance_neuron") of `state`, one per parameter in
        optimizer order, as contiguous float32 CPU tensors of the local
        shard's shape (the last dim 1 for a row state; zeros where torch has
        no state yet)."""
        buffers = []
        for gi, sg in enumerate(saved_groups):
            for j, index in enumerate(sg["params"]):
                s = self._slots[self._group_slots[gi][j]]
                local_shape = tuple(s.local_shape)
                if key != "momentum_buffer":  # a row state
                    local_shape = local_shape[:-1] + (1,)
                entry = state.get(index)
                self._check_state_keys(s, entry)
                buf = entry.get(key) if entry else None
                if buf is None:  # torch: no state yet = zeros at next step
                    buf = torch.zeros(local_shape, dtype=torch.float32)
                if _is_dtensor(buf):
                    buf = self._local_state(s, buf, key)
                if not isinstance(buf, torch.Tensor):
                    raise ValueError(
                        f"muonrt.Muon.load_state_dict: {key} of "
                        f"{s.name!r} is a {type(buf).__name__}, not a tensor")
                if not buf.is_floating_point():
                    raise ValueError(
                        f"muonrt.Muon.load_state_dict: {key} of {s.name!r} "
                        f"has dtype {buf.dtype}, not a floating-point one")
                if tuple(buf.shape) != local_shape:
                    raise ValueError(
                        f"muonrt.Muon.load_state_dict: {key} of "
                        f"{s.name!r} has size {list(buf.shape)}, expected "
                        f"{list(local_shape)} (the parameter's local shard "
                        f"{list(s.local_shape)})")
                buffers.append(buf.detach().to(device="cpu",
                                               dtype=torch.float32)
                               .contiguous())
        return buffers

    def _check_state_keys(self, s, entry):
        """A saved state entry holds only what this optimizer keeps: the
        momentum buffer and its variant's row state. Another key (NorMuon's
        "variance_neuron" into a plain Muon, Adam's "exp_avg") would be
        dropped silently: ValueError naming it."""
        kept = {"momentum_buffer", self._row_state_key}
        extra = sorted(str(k) for k in (entry or {}) if k not in kept)
        if extra:
            variant = ("without a variant such as normuon"
                       if self._row_state_key is None
                       else f"keeping {self._row_state_key!r}")
            raise ValueError(
                f"muonrt.Muon.load_state_dict: the state of {s.name!r} holds "
                f"{extra}, which this optimizer ({variant}) does not keep: "
                f"create it as the optimizer that saved the state")

    def _local_state(self, s, buf, key):
        """This rank's shard of a DTensor state `buf` (`key`: a momentum
        buffer, or a row state of global shape [..., rows, 1]), in the
        parameter's layout (redistributed when the state_dict came from
        another layout on the same mesh)."""
        p = s.param
        shape = tuple(s.global_shape)
        placements = tuple(p.placements) if _is_dtensor(p) else None
        if key != "momentum_buffer":  # a row state
            # Every rank holding part of a row needs its state: a Shard of
            # the last dim is gathered (Replicate) before the local part.
            shape = shape[:-1] + (1,)
            if placements is not None:
                placements = _row_state_placements(placements, len(shape))
        if tuple(buf.shape) != shape:
            raise ValueError(
                f"muonrt.Muon.load_state_dict: {key} of {s.name!r} "
                f"has global shape {list(buf.shape)}, expected {list(shape)}")
        if _is_dtensor(p) and (buf.device_mesh != p.device_mesh or
                               tuple(buf.placements) != placements):
            buf = buf.redistribute(p.device_mesh, placements)
        return _local(buf)

    @_holding_handle
    def save_checkpoint(self, directory, barrier=True):
        """Writes this rank's state (momentum shards, step) to
        `directory` (created if needed): rank_<r>.safetensors per rank and
        metadata.json (checkpoint/checkpoint.h). Every rank calls it; with a
        process group and `barrier`, returns after every rank wrote its
        file. Learning rates are not saved (they are the lr scheduler's
        state)."""
        directory = os.fspath(directory)
        os.makedirs(directory, exist_ok=True)
        _lib.call("muonrt_optimizer_save", self._h, directory.encode())
        if barrier and self._pg is not None:
            self._pg.barrier()

    @_holding_handle
    def load_checkpoint(self, directory):
        """Reads the state of every parameter from a save_checkpoint()
        directory of any layout and world size (resharding). All or
        nothing. Raises FileNotFoundError/KeyError (NOT_FOUND: a missing
        file or parameter), ValueError (another global shape), RuntimeError
        (DATA_LOSS: truncated or corrupted file; FAILED_PRECONDITION:
        unknown format version), each naming the file and parameter."""
        directory = os.fspath(directory)
        _lib.call("muonrt_optimizer_load", self._h, directory.encode())
        self._pushed = [None] * len(self.param_groups)
        self._record_step_in_groups()

    # ---- plan and statistics ---------------------------------------------------

    @_holding_handle
    def plan(self):
        """The plan (owners, buckets, loads, hash): the protobuf JSON
        mapping of muon.v1.Plan, as a dict."""
        return json.loads(_lib.read_json_text("muonrt_optimizer_plan_json",
                                              self._h))

    @_holding_handle
    def assignments(self):
        """{rank: [indices of matrices that rank orthogonalizes]} as this
        rank sees it (parameter indices when every parameter is 2-D), with
        every rank of the world listed (an empty list for a rank that owns
        none of this rank's matrices)."""
        raw = json.loads(_lib.read_json_text(
            "muonrt_optimizer_assignments_json", self._h))
        out = {r: [] for r in range(self.world_size)}
        out.update({int(k): list(v) for k, v in raw.items()})
        return out

    @_holding_handle
    def last_step_stats(self):
        """Counters of the last step on this rank: step,
        matrices_orthogonalized, ns_flops, bytes_sent, bytes_received,
        step_time_s, buffer_bytes."""
        st = _lib.muonrt_step_stats()
        _lib.call("muonrt_optimizer_last_step_stats", self._h,
                  ctypes.byref(st))
        return {name: getattr(st, name) for name, _ in st._fields_}

    @_holding_handle
    def last_step_report(self):
        """The last step on this rank as the muon.v1.StepReport the
        coordinator collects (protobuf JSON mapping, as a dict): the
        counters and "ops", one dict per operation with "op" (OP_KIND_GATHER,
        OP_KIND_ORTHOGONALIZE, OP_KIND_REDISTRIBUTE, OP_KIND_APPLY), "bucket",
        "stream", "start_s" and "end_s" (seconds since the Unix epoch; on CUDA
        tensors the device times of CUDA events around each operation)."""
        return json.loads(_lib.read_json_text(
            "muonrt_optimizer_last_step_report_json", self._h))


class _StateView(collections.abc.Mapping):
    """Muon.state: torch's per-parameter optimizer state (``state[param]
    == {"momentum_buffer": tensor}``), read from the library on access
    (copies: write through load_state_dict)."""

    def __init__(self, opt):
        self._opt = weakref.ref(opt)

    def _params(self):
        opt = self._opt()
        return [] if opt is None else [s.param for s in opt._slots]

    def __getitem__(self, param):
        opt = self._opt()
        for i, p in enumerate(self._params()):
            if p is param:
                return opt._param_state(i)
        raise KeyError("parameter not in this optimizer")

    def __iter__(self):
        return iter(self._params())

    def __len__(self):
        return len(self._params())

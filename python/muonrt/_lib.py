"""ctypes binding of the C ABI in capi/muonrt.h (libmuonrt.so).

The library is found, in this order:
  1. the path in the environment variable MUONRT_LIBRARY;
  2. muonrt/lib/libmuonrt.so inside the package: the self-contained copy
     with its own grafted Gloo, gRPC, protobuf, Abseil and OpenBLAS
     (tools/graft_libs.py; the test command and `pip install` put it
     there);
  3. libmuonrt.so next to the package (inside python/muonrt/, or in the
     directory that holds the package, e.g. site-packages/);
  4. <repo>/bazel-bin/capi/libmuonrt.so, for the first directory above this
     file that has one (the repository checkout; it needs the host's
     libraries and may clash with another PyTorch's Gloo).
It is loaded on first use (``import muonrt`` works without it), once per
process, with RTLD_LOCAL | RTLD_DEEPBIND: the library and the libraries it
needs resolve their symbols in their own scope first, so a Gloo or protobuf
that PyTorch loaded into the process (another version, the same symbol
names) is never bound to ours. Every function gets its argtypes and restype; a call that returns a
non-zero status raises the Python exception of that status with the
library's message (muonrt_last_error()), see ``check``.

Nothing here knows torch: this module only moves integers, pointers and
strings across the ABI.
"""
import ctypes
import numbers
import operator
import os
import threading

# Must equal MUONRT_ABI_VERSION of capi/muonrt.h.
ABI_VERSION = 18

# Status codes (absl::StatusCode values, capi/muonrt.h).
OK = 0
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
ALREADY_EXISTS = 6
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9
ABORTED = 10
OUT_OF_RANGE = 11
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14
DATA_LOSS = 15
UNAUTHENTICATED = 16

CODE_NAMES = {
    CANCELLED: "CANCELLED", UNKNOWN: "UNKNOWN",
    INVALID_ARGUMENT: "INVALID_ARGUMENT",
    DEADLINE_EXCEEDED: "DEADLINE_EXCEEDED", NOT_FOUND: "NOT_FOUND",
    ALREADY_EXISTS: "ALREADY_EXISTS", PERMISSION_DENIED: "PERMISSION_DENIED",
    RESOURCE_EXHAUSTED: "RESOURCE_EXHAUSTED",
    FAILED_PRECONDITION: "FAILED_PRECONDITION", ABORTED: "ABORTED",
    OUT_OF_RANGE: "OUT_OF_RANGE", UNIMPLEMENTED: "UNIMPLEMENTED",
    INTERNAL: "INTERNAL", UNAVAILABLE: "UNAVAILABLE", DATA_LOSS: "DATA_LOSS",
    UNAUTHENTICATED: "UNAUTHENTICATED",
}

# Element types and devices.
FLOAT32 = 0
BFLOAT16 = 1
CPU = 0
CUDA = 1


# ---- Exceptions ------------------------------------------------------------

class MuonRTError(Exception):
    """An error returned by libmuonrt. ``code`` is the absl status code
    (an int), ``code_name`` its name ("INVALID_ARGUMENT", ...); str() is the
    library's message unchanged. Each status raises a subclass that is also
    the matching built-in exception (see ``error_class``), so callers can
    catch ``ValueError`` as they would with torch."""

    code = UNKNOWN

    def __init__(self, message, code=None):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message

    @property
    def code_name(self):
        return CODE_NAMES.get(self.code, str(self.code))

    def __str__(self):
        return self.message


class InvalidArgumentError(MuonRTError, ValueError):
    """INVALID_ARGUMENT: a bad argument (torch's argument errors, shapes,
    placements, sizes)."""
    code = INVALID_ARGUMENT


class NotFoundError(MuonRTError, FileNotFoundError, KeyError):
    """NOT_FOUND: a missing file, or a parameter a checkpoint lacks. Both a
    FileNotFoundError and a KeyError."""
    code = NOT_FOUND

    def __str__(self):  # KeyError would quote the message
        return self.message


class FailedPreconditionError(MuonRTError, RuntimeError):
    """FAILED_PRECONDITION: e.g. a missing gradient at step."""
    code = FAILED_PRECONDITION


class OutOfRangeError(MuonRTError, IndexError):
    """OUT_OF_RANGE: a parameter index outside the optimizer."""
    code = OUT_OF_RANGE


class UnimplementedError(MuonRTError, NotImplementedError):
    """UNIMPLEMENTED: e.g. CUDA tensors before the device-resident step."""
    code = UNIMPLEMENTED


class DeadlineExceededError(MuonRTError, TimeoutError, RuntimeError):
    """DEADLINE_EXCEEDED: peers or the coordinator did not answer in time."""
    code = DEADLINE_EXCEEDED


class LibraryRuntimeError(MuonRTError, RuntimeError):
    """Every other status (UNAVAILABLE, INTERNAL, DATA_LOSS, ...)."""


class UnauthenticatedError(MuonRTError, PermissionError):
    """UNAUTHENTICATED: the coordinator refused the job secret (every rank
    and the coordinator must share MUON_JOB_SECRET / MUON_JOB_SECRET_FILE)."""


_ERROR_CLASSES = {
    UNAUTHENTICATED: UnauthenticatedError,
    INVALID_ARGUMENT: InvalidArgumentError,
    NOT_FOUND: NotFoundError,
    FAILED_PRECONDITION: FailedPreconditionError,
    OUT_OF_RANGE: OutOfRangeError,
    UNIMPLEMENTED: UnimplementedError,
    DEADLINE_EXCEEDED: DeadlineExceededError,
}


def error_class(code):
    """The exception class raised for status `code`."""
    return _ERROR_CLASSES.get(code, LibraryRuntimeError)


class LibraryNotFoundError(OSError):
    """libmuonrt.so was not found (the message lists the paths tried)."""


class AbiVersionError(RuntimeError):
    """The library's MUONRT_ABI_VERSION differs from this package's."""


# ---- C types ---------------------------------------------------------------

class muonrt_param(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("data", ctypes.c_void_p),
        ("grad", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("grad_dtype", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("local_shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("global_shape", ctypes.POINTER(ctypes.c_int64)),
        ("placements", ctypes.POINTER(ctypes.c_char_p)),
        ("sub_mesh", ctypes.c_char_p),
        ("expert_stack", ctypes.c_int),
        ("device_type", ctypes.c_int),
        ("device_index", ctypes.c_int),
        ("row_splits", ctypes.POINTER(ctypes.c_int64)),
        ("num_row_splits", ctypes.c_int),
    ]


class muonrt_options(ctypes.Structure):
    _fields_ = [
        ("lr", ctypes.c_double),
        ("weight_decay", ctypes.c_double),
        ("momentum", ctypes.c_double),
        ("nesterov", ctypes.c_int),
        ("ns_a", ctypes.c_double),
        ("ns_b", ctypes.c_double),
        ("ns_c", ctypes.c_double),
        ("eps", ctypes.c_double),
        ("ns_steps", ctypes.c_int),
        ("adjust_lr_fn", ctypes.c_char_p),
        ("ns_schedule", ctypes.c_char_p),
        ("async_gpu_parallelism", ctypes.c_int),
        ("prefetch_count", ctypes.c_int),
        ("assignment_policy", ctypes.c_char_p),
        ("bucket_size_bytes", ctypes.c_int64),
        ("transactional_step", ctypes.c_int),
        ("replan_every_steps", ctypes.c_int),
        ("ns_method", ctypes.c_char_p),
        ("exchange_dtype", ctypes.c_char_p),
        ("normuon", ctypes.c_int),
        ("normuon_beta2", ctypes.c_double),
        ("normuon_eps", ctypes.c_double),
        ("overlap_backward", ctypes.c_int),
        ("momentum_dtype", ctypes.c_char_p),
        ("check_finite", ctypes.c_int),
        ("gpu_precision", ctypes.c_char_p),
    ]


class muonrt_qk_clip_layer(ctypes.Structure):
    _fields_ = [
        ("q_param", ctypes.c_char_p),
        ("q_row_begin", ctypes.c_int64),
        ("k_param", ctypes.c_char_p),
        ("k_row_begin", ctypes.c_int64),
        ("num_heads", ctypes.c_int),
        ("num_kv_heads", ctypes.c_int),
        ("head_dim", ctypes.c_int64),
        ("k_head_dim", ctypes.c_int64),
        ("q_rope_dim", ctypes.c_int64),
    ]


class muonrt_step_stats(ctypes.Structure):
    _fields_ = [
        ("step", ctypes.c_int64),
        ("matrices_orthogonalized", ctypes.c_int32),
        ("ns_flops", ctypes.c_double),
        ("bytes_sent", ctypes.c_int64),
        ("bytes_received", ctypes.c_int64),
        ("step_time_s", ctypes.c_double),
        ("buffer_bytes", ctypes.c_int64),
    ]


_pg_p = ctypes.c_void_p   # muonrt_process_group*
# muonrt_publish_fn / muonrt_lookup_fn (capi/muonrt.h).
PUBLISH_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)
LOOKUP_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_double,
                             ctypes.c_void_p, ctypes.c_int)
_opt_p = ctypes.c_void_p  # muonrt_optimizer*
_c_int = ctypes.c_int
_c_size_p = ctypes.POINTER(ctypes.c_size_t)

# name: (restype, argtypes)
_SIGNATURES = {
    "muonrt_abi_version": (_c_int, []),
    "muonrt_last_error": (ctypes.c_char_p, []),
    "muonrt_compute_threads": (_c_int, []),
    "muonrt_set_compute_threads": (_c_int, [_c_int]),
    "muonrt_cpu_kernels": (ctypes.c_char_p, []),
    "muonrt_pg_init_from_env": (_c_int, [ctypes.c_double, ctypes.POINTER(_pg_p)]),
    "muonrt_pg_init_backend_from_env": (_c_int, [
        ctypes.c_char_p, _c_int, ctypes.c_double, ctypes.POINTER(_pg_p)]),
    "muonrt_pg_init_with_store": (_c_int, [
        ctypes.c_char_p, _c_int, ctypes.c_double, PUBLISH_FN, LOOKUP_FN,
        ctypes.c_void_p, ctypes.POINTER(_pg_p)]),
    "muonrt_pg_rank": (_c_int, [_pg_p]),
    "muonrt_pg_world_size": (_c_int, [_pg_p]),
    "muonrt_pg_coordinator_address": (ctypes.c_char_p, [_pg_p]),
    "muonrt_pg_barrier": (_c_int, [_pg_p]),
    "muonrt_pg_report_create_failure": (_c_int, [_pg_p, ctypes.c_char_p]),
    "muonrt_pg_destroy": (None, [_pg_p]),
    "muonrt_options_default": (None, [ctypes.POINTER(muonrt_options)]),
    "muonrt_options_validate": (_c_int, [ctypes.POINTER(muonrt_options)]),
    "muonrt_optimizer_create": (_c_int, [
        _pg_p, _c_int, ctypes.POINTER(ctypes.c_char_p),
        ctypes.POINTER(_c_int), ctypes.POINTER(muonrt_param), _c_int,
        ctypes.POINTER(muonrt_options), ctypes.POINTER(_opt_p)]),
    "muonrt_optimizer_destroy": (None, [_opt_p]),
    "muonrt_optimizer_step": (_c_int, [_opt_p, ctypes.c_void_p]),
    "muonrt_optimizer_set_grad": (_c_int, [_opt_p, _c_int, ctypes.c_void_p]),
    "muonrt_optimizer_refuse_step": (_c_int, [_opt_p, ctypes.c_char_p]),
    "muonrt_optimizer_set_hyperparameters": (
        _c_int, [_opt_p, _c_int, ctypes.c_double, ctypes.c_double,
                 ctypes.c_double]),
    "muonrt_optimizer_step_count": (ctypes.c_int64, [_opt_p]),
    "muonrt_optimizer_momentum": (_c_int, [
        _opt_p, _c_int, ctypes.POINTER(ctypes.POINTER(ctypes.c_float)),
        ctypes.POINTER(ctypes.c_int64)]),
    "muonrt_optimizer_load_state": (_c_int, [
        _opt_p, ctypes.c_int64, ctypes.POINTER(ctypes.POINTER(ctypes.c_float)),
        ctypes.POINTER(ctypes.c_int64), _c_int]),
    "muonrt_optimizer_mark_ready": (_c_int, [_opt_p, _c_int,
                                     ctypes.c_void_p]),
    "muonrt_optimizer_set_qk_clip": (_c_int, [
        _opt_p, ctypes.c_double, ctypes.c_double,
        ctypes.POINTER(muonrt_qk_clip_layer), _c_int]),
    "muonrt_optimizer_clip_qk": (_c_int, [
        _opt_p, ctypes.POINTER(ctypes.c_float), ctypes.c_int64,
        ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_float),
        ctypes.c_void_p]),
    "muonrt_optimizer_row_state_name": (_c_int, [
        _opt_p, ctypes.POINTER(ctypes.c_char_p)]),
    "muonrt_optimizer_row_state": (_c_int, [
        _opt_p, _c_int, ctypes.POINTER(ctypes.POINTER(ctypes.c_float)),
        ctypes.POINTER(ctypes.c_int64)]),
    "muonrt_optimizer_load_full_state": (_c_int, [
        _opt_p, ctypes.c_int64, ctypes.POINTER(ctypes.POINTER(ctypes.c_float)),
        ctypes.POINTER(ctypes.c_int64),
        ctypes.POINTER(ctypes.POINTER(ctypes.c_float)),
        ctypes.POINTER(ctypes.c_int64), _c_int]),
    "muonrt_optimizer_save": (_c_int, [_opt_p, ctypes.c_char_p]),
    "muonrt_optimizer_load": (_c_int, [_opt_p, ctypes.c_char_p]),
    "muonrt_optimizer_plan_json": (
        _c_int, [_opt_p, ctypes.c_char_p, ctypes.c_size_t, _c_size_p]),
    "muonrt_optimizer_assignments_json": (
        _c_int, [_opt_p, ctypes.c_char_p, ctypes.c_size_t, _c_size_p]),
    "muonrt_optimizer_last_step_report_json": (
        _c_int, [_opt_p, ctypes.c_char_p, ctypes.c_size_t, _c_size_p]),
    "muonrt_optimizer_last_step_stats": (
        _c_int, [_opt_p, ctypes.POINTER(muonrt_step_stats)]),
}

LIBRARY_NAME = "libmuonrt.so"
# dlopen flags: our own scope before the process's (see the docstring).
_LOAD_MODE = os.RTLD_LOCAL | getattr(os, "RTLD_DEEPBIND", 0)
_lock = threading.Lock()
_lib = None
_lib_path = None


def candidate_paths():
    """The paths tried, in order (see the module docstring)."""
    paths = []
    env = os.environ.get("MUONRT_LIBRARY")
    if env:
        paths.append(env)
    package_dir = os.path.dirname(os.path.abspath(__file__))
    paths.append(os.path.join(package_dir, "lib", LIBRARY_NAME))
    paths.append(os.path.join(package_dir, LIBRARY_NAME))
    paths.append(os.path.join(os.path.dirname(package_dir), LIBRARY_NAME))
    d = package_dir
    while True:
        paths.append(os.path.join(d, "bazel-bin", "capi", LIBRARY_NAME))
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    return paths


def _find():
    paths = candidate_paths()
    env = os.environ.get("MUONRT_LIBRARY")
    if env:
        # An explicit choice is not silently replaced by another library.
        if not os.path.isfile(env):
            raise LibraryNotFoundError(
                f"MUONRT_LIBRARY={env!r}: no such file (build it with "
                f"`bazel build //capi:libmuonrt.so`)")
        return env
    for p in paths:
        if os.path.isfile(p):
            return p
    raise LibraryNotFoundError(
        f"{LIBRARY_NAME} not found; tried: " + ", ".join(paths) +
        ". Build it with `bazel build //capi:libmuonrt.so` or set "
        "MUONRT_LIBRARY to its path.")


def lib():
    """The loaded library (loads it on first call).

    Raises LibraryNotFoundError when it is nowhere to be found, OSError when
    it does not load, AbiVersionError when its ABI version differs."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        path = _find()
        handle = ctypes.CDLL(os.path.abspath(path), mode=_LOAD_MODE)
        for name, (restype, argtypes) in _SIGNATURES.items():
            try:
                fn = getattr(handle, name)
            except AttributeError:
                raise OSError(f"{path}: symbol {name} missing (a library "
                              f"older than capi/muonrt.h?)") from None
            fn.restype = restype
            fn.argtypes = argtypes
        version = handle.muonrt_abi_version()
        if version != ABI_VERSION:
            raise AbiVersionError(
                f"{path}: MUONRT_ABI_VERSION {version}, this package was "
                f"written for {ABI_VERSION}")
        _lib_path = os.path.abspath(path)
        _lib = handle
        return _lib


def library_path():
    """The path of the loaded library (loads it)."""
    lib()
    return _lib_path


def last_error():
    msg = lib().muonrt_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def c_int(value, what, bits=32):
    """`value` as a Python int for a C int (bits 32) or int64_t (bits 64)
    argument or field: TypeError naming `what` when it is not an integer
    (an integer-valued real such as 4.0 is taken; 5.5 or "5" are not,
    where int() would truncate or parse them), ValueError when it does not
    fit
    (ctypes would wrap it silently: 2**32 + 2 reaching C as 2)."""
    try:  # ints, numpy and 0-dim torch integers (__index__)
        v = operator.index(value)
    except TypeError:
        # An integral real (4.0, numpy.float32(4.0), a float tensor's
        # item()), never a truncated one or a string.
        if not (isinstance(value, numbers.Real) and
                float(value).is_integer()):
            raise TypeError(f"muonrt: {what} must be an integer, got "
                            f"{value!r}") from None
        v = int(value)
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if not low <= v <= high:
        raise ValueError(f"muonrt: {what} is {v}, outside a C int{bits}'s "
                         f"range [{low}, {high}]")
    return v


def check(status, what=None):
    """Raises the exception of `status` (non-zero) with the library's
    message; `what` (e.g. the function) prefixes it only when the library
    gave no message."""
    if status == OK:
        return
    msg = last_error()
    if not msg:
        msg = f"{what or 'libmuonrt'} failed with {CODE_NAMES.get(status, status)}"
    raise error_class(status)(msg, status)


def call(name, *args):
    """Calls function `name` and raises on a non-zero status."""
    check(getattr(lib(), name)(*args), name)


def read_json_text(fn_name, handle):
    """Calls one of the *_json functions (grow-and-retry) and returns the
    text."""
    f = getattr(lib(), fn_name)
    n = ctypes.c_size_t(0)
    cap = 4096
    while True:
        buf = ctypes.create_string_buffer(cap)
        status = f(handle, buf, cap, ctypes.byref(n))
        if status == OUT_OF_RANGE and n.value + 1 > cap:
            cap = n.value + 1
            continue
        check(status, fn_name)
        return buf.raw[:n.value].decode("utf-8")

"""Triton's interpreter held to the launch's own tensors.

Under the interpreter a kernel's pointers are host addresses and its loads and stores are
raw reads and writes of the process that runs it, which is the judge's (the benchmark worker
of the sim backend, and of the cuda backend's `interpret` option): a kernel given an integer,
or adding one to its pointer, read and wrote any memory there (the references of the
verification sets, the judge's own objects). On a device the same kernel faults or lands in
device memory that the history, guard-band and memory checks watch.

`bound_interpreter()` (idempotent; call before a kernel is launched interpreted) makes every
lane of every load, store and atomic that is on (its mask true) lie inside the storage of one
of the tensors the launch passed (a descriptor's base included): that is all a kernel is
given. One outside raises OutsideBuffers, naming the access and the address; the kernel
fails there (the interpreter reports it as the kernel's error), and nothing was read or
written. The check sits under the interpreter's builder, on its native load, store and
atomic entry points, so every path to memory (masked or not, descriptors, gathers, polls)
passes it.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from tuner.backends.base import BackendUnavailable


class OutsideBuffers(RuntimeError):
    """A kernel's load, store or atomic reached memory outside the tensors its launch passed."""


class InterpreterUnbounded(BackendUnavailable):
    """This Triton's interpreter has not the entry points the bound is placed on: the tool's
    failure, never the kernel's."""


_state = threading.local()  # ranges: (starts, ends) of the current launch's storages, or None


def bound_interpreter() -> None:
    from triton.runtime import interpreter as tri
    if getattr(tri, "_tuner_bounded", False):
        return
    native = getattr(tri, "_interpreter", None)
    executor = getattr(tri, "GridExecutor", None)
    missing = [n for n in ("load", "store", "atomic_cas", "atomic_rmw") if not hasattr(native, n)]
    if native is None or executor is None or missing or not hasattr(executor, "_init_args_hst"):
        raise InterpreterUnbounded("Triton's interpreter lacks the entry points a kernel's memory "
                                   "accesses are bounded at (_interpreter.load/store/atomic_*, "
                                   "GridExecutor._init_args_hst)")
    tri._interpreter = _Bounded(native)
    init_args, call = executor._init_args_hst, executor.__call__

    def init_args_bounded(self, args_dev, kwargs):
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        _state.ranges = _ranges([*args_hst, *kwargs_hst.values()])
        return args_hst, kwargs_hst

    def call_bounded(self, *args, **kwargs):
        try:
            return call(self, *args, **kwargs)
        finally:
            _state.ranges = None

    executor._init_args_hst = init_args_bounded
    executor.__call__ = call_bounded
    tri._tuner_bounded = True


def _ranges(args: list) -> tuple[np.ndarray, np.ndarray]:
    spans = set()

    def visit(a: Any) -> None:
        if isinstance(a, (tuple, list)):
            for x in a:
                visit(x)
        elif hasattr(a, "base") and hasattr(a, "block_shape"):  # a TensorDescriptor
            visit(a.base)
        elif hasattr(a, "untyped_storage"):
            s = a.untyped_storage()
            if s.nbytes():
                spans.add((s.data_ptr(), s.data_ptr() + s.nbytes()))
        elif hasattr(a, "base") and hasattr(a.base, "untyped_storage"):  # a dtype-reinterpreting wrapper
            visit(a.base)
    visit(args)
    ordered = sorted(spans)
    return (np.array([s for s, _ in ordered], dtype=np.uint64),
            np.array([e for _, e in ordered], dtype=np.uint64))


def _check(what: str, ptrs: Any, mask: Any, itemsize: int) -> None:
    addr = np.asarray(ptrs, dtype=np.uint64).reshape(-1)
    if mask is not None:
        addr = addr[np.broadcast_to(np.asarray(mask, dtype=bool), np.shape(ptrs)).reshape(-1)]
    if addr.size == 0:
        return
    ranges = getattr(_state, "ranges", None)
    if ranges is None:
        raise OutsideBuffers(f"a {what} outside any launch of a kernel")
    starts, ends = ranges
    # The storage that starts at or below each address, and the address inside it with the
    # access's bytes (compared as a difference: addr + itemsize could wrap past 2**64).
    i = np.searchsorted(starts, addr, side="right").astype(np.int64) - 1
    if starts.size:
        end = ends[np.maximum(i, 0)]
        inside = (i >= 0) & (addr < end) & (end - np.minimum(addr, end) >= np.uint64(itemsize))
    else:
        inside = np.zeros(addr.shape, dtype=bool)
    if not inside.all():
        bad = addr[~inside]
        raise OutsideBuffers(f"a {what} outside the tensors the launch passed: {bad.size} of its "
                             f"{addr.size} lanes that are on, the first at address {int(bad[0]):#x}; "
                             f"a kernel reads and writes only the buffers it is given")


class _Bounded:
    """The interpreter's native module, its memory entry points checked first."""

    def __init__(self, native: Any) -> None:
        self._native = native

    def __getattr__(self, name: str) -> Any:
        return getattr(self._native, name)

    def load(self, ptrs, mask, other, dtype):
        _check("load", ptrs, mask, np.dtype(dtype).itemsize)
        return self._native.load(ptrs, mask, other, dtype)

    def store(self, ptrs, value, mask):
        _check("store", ptrs, mask, np.asarray(value).dtype.itemsize)
        return self._native.store(ptrs, value, mask)

    def atomic_cas(self, ptrs, cmp, val, sem):
        _check("atomic", ptrs, None, np.asarray(val).dtype.itemsize)
        return self._native.atomic_cas(ptrs, cmp, val, sem)

    def atomic_rmw(self, op, ptrs, val, mask, sem):
        _check("atomic", ptrs, mask, np.asarray(val).dtype.itemsize)
        return self._native.atomic_rmw(op, ptrs, val, mask, sem)

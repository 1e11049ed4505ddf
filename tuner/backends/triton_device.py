"""The device side that the cuda and npu backends share: Triton launch modules on torch device
tensors, through torch's device module (`torch.cuda` or `torch.npu`) and its events.

A subclass names `torch_device` ("cuda", "npu"), `module_prefix` (the name its kernel modules
are imported under) and `flush_factor` (the cache-flush buffer is this many times the L2, at
least 256 MiB), and says its L2 size (`_l2_bytes`). With the `interpret` option kernels run
through Triton's interpreter on host tensors (CI), timed by the host clock.

Timing (`time_calls`): per repetition, a buffer larger than the L2 is read (`evict`; enqueued
before the start event, so it also hides the host's launch latency), then events around one
call. Read, not zeroed as `triton.testing.do_bench` does: a memset leaves the L2 full of dirty
lines, and the timed kernel then pays for writing back tens of MiB that are not its own, more
for some load styles than others (bench/RESULTS.md, "A memset before each call charged the
kernel for its write-back"). A read leaves clean lines of a buffer no kernel knows. The n repetitions are queued back to back and waited for
once: with a wait after each, the device idled while Python launched the next flush and
kernel (tens of microseconds, as long as a small kernel itself).
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any, Callable

from tuner.backends.base import Backend, HostCompute
from tuner.backends.interpreter_bounds import bound_interpreter
from tuner.backends.triton_source import load_module, use_cache


_LAUNCH_LATENCY_S = 10e-6    # from the host's launch to the device able to start the kernel
_MAX_HOLD_S = 5e-3           # the most time_call holds the device for a slow host
# The least time_call holds the device before a lone call. The host's recent launch time does
# not bound this one's: a launch on buffers never seen before does host work the calls before
# it skipped (TMA descriptors encoded for new addresses), and the device idles meanwhile, which
# made honest kernels look slower on buffers they had not seen (the measurements:
# bench/RESULTS.md, "The history check's false verdict on TMA attention found").
_MIN_HOLD_S = 2e-3


class TritonDevice(Backend):
    torch_device: str = ""    # the attribute of torch that is the device module: "cuda", "npu"
    module_prefix: str = ""   # kernel modules are imported as <prefix>_<digest>
    flush_factor: int = 4     # the flush buffer: this many times the L2 (at least 256 MiB)

    def __init__(self, device: int = 0, **options: Any) -> None:
        super().__init__(device, **options)
        self.interpret = bool(options.get("interpret"))
        self._flush_buf = None
        self._events: list = []
        self._single: list = []  # time_call's three events
        self._spin_hz: float | None = None
        self._host_launch_s = 0.0  # the host's recent launch time in time_call
        # The least time time_call holds the device busy before the start event (`_MIN_HOLD_S`
        # unless told; 0: only twice the host's recent launch time). bench/lone_calls.py
        # --min-hold-ms sets it.
        hold = options.get("min_hold_s")
        self.min_hold_s = _MIN_HOLD_S if hold is None else float(hold)
        self.last_call_clean = True  # see time_call
        self._used_device = False  # whether this process has touched the device (a context)

    def _module(self):
        import torch
        return getattr(torch, self.torch_device)

    def _l2_bytes(self) -> int:
        raise NotImplementedError

    def _bind(self) -> None:
        """Make this backend's device the current one in this process."""
        self._module().set_device(self.device)
        self._used_device = True

    # ---- load and run -------------------------------------------------------------------

    def load(self, artifact: str, op) -> Any:
        if self.interpret:
            os.environ["TRITON_INTERPRET"] = "1"
            interpreter_fixed()
            bound_interpreter()
        else:
            self._bind()
        use_cache(Path(artifact))
        self._before_import(artifact)
        digest = hashlib.sha256(Path(artifact).read_bytes()).hexdigest()[:16]
        return load_module(artifact, f"{self.module_prefix}_{digest}", self.language).launch

    def _before_import(self, artifact: str) -> None:
        """A hook between pointing Triton at the run's cache and importing the kernel."""

    def to_device(self, tensor):
        return tensor if self.interpret else tensor.to(f"{self.torch_device}:{self.device}")

    def to_host(self, tensor):
        return tensor.cpu()

    def data_device(self):
        return None if self.interpret else f"{self.torch_device}:{self.device}"

    def launch(self, kernel: Any, args: list) -> None:
        kernel(*args)

    def launch_checked(self, kernel: Any, args: list) -> None:
        """The launch function may allocate, view and fill tensors, and launch kernels; any
        other torch operation it runs (arithmetic, a reduction, a copy, a library call,
        however the code reached it) is the op's work done by torch, not by the kernel. Seen
        by a dispatch mode around the call, so it holds whatever the source looks like. (Not
        under Triton's interpreter, which computes with torch itself.)"""
        if self.interpret:
            return self.launch(kernel, args)
        without_host_compute(lambda: kernel(*args))

    def sync(self) -> None:
        if not self.interpret:
            self._module().synchronize(self.device)

    def context_lost(self) -> bool:
        """True once a kernel fault (an illegal address, an AI Core exception) has poisoned this
        process's device context: a synchronize then fails, and goes on failing."""
        if self.interpret or not self._used_device:
            return False
        try:
            self._module().synchronize(self.device)
            return False
        except Exception:  # noqa: BLE001 - any error here is a sticky one: the context is gone
            return True

    # ---- timing -------------------------------------------------------------------------

    def time_call(self, fn: Callable[[], None], before: Callable[[], None] | None = None) -> float:
        """One call, as one repetition of `time_calls`. A lone call has no queue ahead of it:
        if the host takes longer to launch it than the device takes to flush (a busy machine's
        compile processes preempt it, a launch path that runs cold after a wait), the device
        idles between the start event and the kernel, and a 5 us kernel reads 30-60 us; that
        made honest short kernels fail the history check (`history.check_history`). So the device
        is held busy after the flush for twice the host's recent launch time and at least
        `min_hold_s` (a spin kernel, where the device module has one), and `last_call_clean` says whether the host's launch
        time stayed under what the device had ahead of the start event, which bounds any wait
        inside the pair. Never a second call here: a call made again on the same buffers is
        one a kernel could answer from what it kept of the first."""
        if self.interpret:
            return self.time_calls(fn, 1, before)[0]
        dev = self._module()
        flush = self._flush()
        if len(self._single) < 3:
            self._single = [dev.Event(enable_timing=True) for _ in range(3)]
        mark, start, end = self._single
        stream = dev.current_stream(self.device)
        spin = getattr(dev, "_sleep", None)
        hold = max(min(2 * self._host_launch_s, _MAX_HOLD_S), self.min_hold_s) if spin is not None else 0.0
        if before is not None:
            before()  # queued ahead of the flush: its lines leave the cache with the flush's
        t0 = time.perf_counter()
        mark.record(stream)
        evict(flush)
        if hold:
            spin(int(hold * self._spin_rate(dev, stream)))
        start.record(stream)
        fn()
        end.record(stream)
        host = time.perf_counter() - t0
        end.synchronize()
        ahead = mark.elapsed_time(start) * 1e-3  # the device's work before the start event
        self.last_call_clean = host + _LAUNCH_LATENCY_S <= ahead
        self._host_launch_s = max(host, 0.5 * self._host_launch_s)  # decays after a slow one
        return start.elapsed_time(end) * 1e-3

    def _flush(self):
        """The buffer `evict` reads: larger than the L2, written once here."""
        if self._flush_buf is None:
            import torch
            self._flush_buf = torch.zeros(max(256 * 2**20, self.flush_factor * self._l2_bytes()) // 4,
                                          dtype=torch.int32, device=f"{self.torch_device}:{self.device}")
        return self._flush_buf

    def _spin_rate(self, dev, stream) -> float:
        """Cycles per second of the device module's spin kernel (`_sleep(cycles)`), measured once:
        the fastest of three spins back to back, so that a device still at idle clocks for the
        first does not make every later hold shorter than asked (too fast a rate only holds longer)."""
        if self._spin_hz is None:
            rates = []
            for _ in range(3):
                a, b = dev.Event(enable_timing=True), dev.Event(enable_timing=True)
                a.record(stream)
                dev._sleep(1_000_000)
                b.record(stream)
                b.synchronize()
                rates.append(1_000_000 / max(a.elapsed_time(b) * 1e-3, 1e-6))
            self._spin_hz = max(rates)
        return self._spin_hz

    def time_calls(self, fn: Callable[[], None], n: int,
                   before: Callable[[], None] | None = None) -> list[float]:
        if self.interpret:
            out = []
            for _ in range(n):
                if before is not None:
                    before()
                t0 = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t0)
            return out
        dev = self._module()
        flush = self._flush()
        while len(self._events) < n:
            self._events.append((dev.Event(enable_timing=True), dev.Event(enable_timing=True)))
        pairs = self._events[:n]
        stream = dev.current_stream(self.device)  # looked up once: tens of us a time
        for start, end in pairs:
            if before is not None:
                before()
            evict(flush)
            start.record(stream)
            fn()
            end.record(stream)
        pairs[-1][1].synchronize()
        return [start.elapsed_time(end) * 1e-3 for start, end in pairs]


def evict(buf) -> None:
    """Read every byte of `buf` (a device tensor larger than the L2) and write nothing back to
    it: the cache is left holding clean lines of a buffer no kernel is given, so the next call
    reads its inputs from memory and writes back nothing of anyone else's."""
    buf.max()


# What a launch function may ask of torch: allocation, views and metadata, fills of what it
# allocates. Named by the aten overload packet.
_HOST_OK = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like",
    "new_zeros", "full", "full_like", "new_full", "fill", "fill_", "zero_", "view", "_unsafe_view",
    "reshape", "as_strided", "t", "transpose", "permute", "unsqueeze", "squeeze", "select", "slice",
    "expand", "detach", "alias", "lift_fresh", "sym_size", "sym_stride", "sym_numel",
    "sym_storage_offset", "is_contiguous", "unbind", "split", "chunk", "narrow", "_to_copy_meta",
})


# Builder operations the interpreter computes on bfloat16's raw bits, and whether the result
# goes back to bfloat16 (arithmetic) or stays as computed (compares: booleans; tl.dot: its
# accumulator's type).
_BF16_ARITHMETIC = ("create_fadd", "create_fsub", "create_fmul", "create_fdiv", "create_frem", "create_fma",
                    "create_fneg", "create_fabs", "create_precise_divf", "create_maximumf", "create_minimumf",
                    "create_maxnumf", "create_minnumf", "create_clampf")
_BF16_AS_COMPUTED = ("create_dot", "create_fcmpOEQ", "create_fcmpOGE", "create_fcmpOGT", "create_fcmpOLE",
                     "create_fcmpOLT", "create_fcmpONE", "create_fcmpUEQ", "create_fcmpUGE", "create_fcmpUGT",
                     "create_fcmpULE", "create_fcmpULT", "create_fcmpUNE")


def interpreter_fixed() -> None:
    """Make Triton's interpreter compute with bfloat16 operands (idempotent; call before a
    kernel is launched interpreted). The interpreter keeps bfloat16 data as its uint16 bits and
    its arithmetic, compares and tl.dot worked on those bits as integers (Triton 3.9: `a + b`
    of two bf16 blocks came out NaN, a library bf16 matmul ~1e11 where the reference is tens,
    `a > b` wrong wherever a sign differs, `tl.sum` of a bf16 block ~1e22), where a GPU computes
    them in float32: the bf16 operands are widened to float32 (exactly), and arithmetic,
    reduction and scan results rounded back to bf16."""
    from triton.runtime import interpreter as tri
    cls = type(tri.interpreter_builder)
    bf16, f32 = tri.tl.bfloat16, tri.tl.float32

    def widened(method, back: bool):
        def run(self, *args, **kw):
            if not any(isinstance(x, tri.TensorHandle) and x.dtype.scalar == bf16 for x in args):
                return method(self, *args, **kw)
            wide = [self.cast_impl(x, f32) if isinstance(x, tri.TensorHandle) and x.dtype.scalar == bf16 else x
                    for x in args]
            out = method(self, *wide, **kw)
            return self.cast_impl(out, bf16) if back and out.dtype.scalar == f32 else out
        run._tuner_bf16 = True
        return run
    for names, back in ((_BF16_ARITHMETIC, True), (_BF16_AS_COMPUTED, False)):
        for name in names:
            method = getattr(cls, name, None)
            if method is not None and not getattr(method, "_tuner_bf16", False):
                setattr(cls, name, widened(method, back))
    # Reductions and scans: numpy's sum, max, cumsum on the bits, in the same way.
    import numpy as np
    builder = tri.interpreter_builder

    def narrow(t):
        if isinstance(t, (list, tuple)):
            return type(t)(narrow(x) for x in t)
        if isinstance(t, tri.tl.core.tensor) and t.dtype.scalar == f32:
            data = np.asarray(t.handle.data, np.float32)
            bits = builder.cast_impl(tri.TensorHandle(np.atleast_1d(data), f32), bf16).data.reshape(data.shape)
            return t.__class__(tri.TensorHandle(bits, bf16), tri.tl.block_type(bf16, list(bits.shape))
                               if bits.shape else bf16)
        return t

    def on_float32(method):
        def run(self, input, *args, **kw):
            if input.dtype.scalar != bf16:
                return method(self, input, *args, **kw)
            bits = np.asarray(input.handle.data)
            wide = self.to_tensor((bits.astype(np.uint32) << 16).view(np.float32), f32)
            return narrow(method(self, wide, *args, **kw))
        run._tuner_bf16 = True
        return run
    for owner, name in ((tri.ReduceOps, "sum"), (tri.ReduceOps, "min_max"), (tri.ScanOps, "cumsum"),
                        (tri.ScanOps, "cumprod")):
        method = getattr(owner, name, None)
        if method is not None and not getattr(method, "_tuner_bf16", False):
            setattr(owner, name, on_float32(method))


# What Triton's interpreter itself runs with torch around a launch: it moves each argument to a
# host array and back (copy_, set_). Allowed where a launch runs interpreted (the sim backend).
INTERPRETER_OK = frozenset({"copy_", "set_"})


def without_host_compute(run: Callable[[], None], also: frozenset[str] = frozenset()) -> None:
    """`run()` under a dispatch mode; raises HostCompute naming the torch ops it ran besides
    allocation, views and fills (_HOST_OK) and `also`."""
    with _NoHostCompute(also) as mode:
        run()
    if mode.seen:
        raise HostCompute(f"forbidden: the launch function computed with torch on the host "
                          f"({', '.join(sorted(mode.seen)[:5])}); do the op's work in the "
                          f"@triton.jit kernel")


def _NoHostCompute(also: frozenset[str] = frozenset()):
    """A dispatch mode that records (`seen`) every torch op run inside it other than
    allocation, views and fills (_HOST_OK) and `also`."""
    from torch.utils._python_dispatch import TorchDispatchMode
    allowed = _HOST_OK | also

    class NoHostCompute(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name not in allowed:
                self.seen.add(f"aten.{name}")
            return func(*args, **(kwargs or {}))

    return NoHostCompute()

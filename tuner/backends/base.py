"""The Backend contract: one implementation per target, in two roles (after TVM's
builder/runner split), written down as the `Compiler` and `Device` protocols below.

* **Compiler** (the parent and the compile workers, which never touch a device): `language`,
  `render_context(op)`, `limits()`, `compile_options()`, `compile(source, op, workdir,
  timeout_s) -> Build`, `warm()`.
* **Device** (one benchmark worker per device): `device_info()`, `load(artifact, op)`,
  `data_device()`, `to_device`/`to_host`, `host_buffer`, `launch`, `sync`,
  `time_call`/`time_calls`, `evict`, `context_lost()`, `sandbox()`.

A `Backend` is both (a target's two sides share its facts: the cuda compiler needs the GPU's
architecture and shared-memory limit, told by the parent through `compile_options`); cuda and
npu share their device side (`triton_device.TritonDevice`). A backend is created inside
worker processes and, for the compile side's facts, once in the parent.

Contract for implementers:

* `compile` never raises for a candidate's fault: a compiler error is a `Build` with status
  COMPILE_ERROR and a short excerpt. Only faults of the tool itself (no compiler, a bug)
  raise, as `BackendUnavailable` or any other exception. Compile timeouts are enforced by
  the caller killing the worker; a backend that shells out should also pass `timeout_s` on.
* `launch(kernel, args)` runs the kernel once on device tensors: inputs first, then the
  outputs that the harness allocated and poisoned. Crashes and hangs are the worker's
  problem (the parent kills and replaces it), not the backend's.
* `time_call(fn, before=None)` returns the seconds of one call of `fn`, with the caches
  flushed before it and the flush itself not timed (device events on accelerators, a
  monotonic clock on the CPU); `before()`, when given, runs ahead of the flush and is not
  timed either (the harness poisons the call's outputs there). `time_calls(fn, n, before)`
  returns n such samples, `before` ahead of each call; an accelerator may queue them all
  and wait once, so the device does not idle while the host launches the next repetition.
  After `time_call`, `last_call_clean` (default True) is False when the sample may include
  the device waiting for the host's launch (a lone call on a slow host): a check that
  compares single calls with queued ones uses the clean samples.
* `evict(tensors)` takes the tensors' memory out of the caches, for code timed in the judge's
  own process (the torch reference), whose caller passes it in `before`. A backend whose
  `time_call` flushes the whole cache anyway does nothing here.
* `context_lost()` says, cheaply, whether a kernel fault poisoned the process's device
  context; the worker then answers and exits, and a fresh one takes its place.
"""


from __future__ import annotations

import abc
import functools
import json
import os
import re
import signal
from pathlib import Path
from typing import Any, Callable, Protocol

from tuner.core.values import Build, DeviceInfo, OpSpec


class Compiler(Protocol):
    """The compile side of a target (see the module docstring)."""
    language: str

    def render_context(self, op) -> dict[str, Any]: ...
    def limits(self) -> dict[str, float]: ...
    def compile_options(self) -> dict[str, Any]: ...
    def compile(self, source: str, op: OpSpec, workdir: str, timeout_s: float) -> Build: ...
    def warm(self, op: OpSpec | None = None) -> None: ...


class Device(Protocol):
    """The device side of a target (see the module docstring)."""

    def device_info(self, peaks: bool = True) -> DeviceInfo: ...
    def load(self, artifact: str, op) -> Any: ...
    def data_device(self): ...
    def to_device(self, tensor): ...
    def to_host(self, tensor): ...
    def host_buffer(self, nbytes: int): ...
    def launch(self, kernel: Any, args: list) -> None: ...
    def memcheck(self, artifact: str, op: OpSpec, timeout_s: float) -> str: ...
    def memcheck_ahead(self, op: OpSpec) -> None: ...
    def launch_checked(self, kernel: Any, args: list) -> None: ...
    def sync(self) -> None: ...
    def time_call(self, fn: Callable[[], None], before: Callable[[], None] | None = None) -> float: ...
    def time_calls(self, fn: Callable[[], None], n: int,
                   before: Callable[[], None] | None = None) -> list[float]: ...
    def evict(self, tensors: list) -> None: ...
    def context_lost(self) -> bool: ...


class Refused(RuntimeError):
    """A checked launch (`Backend.launch_checked`) that the backend refuses to count: its
    message is the record's reason (the kernel's failure, never the tool's)."""


class HostCompute(Refused):
    """A launch computed with torch on the host side instead of in its kernel."""


# Signals only the outside sends to a process that runs candidate code (the OOM killer, an
# operator, a shutdown): a kernel cannot signal anything (the cpu host's filter, the code checks).
OUTSIDE_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT})


class OutsideKill(RuntimeError):
    """The process running a kernel was killed from outside (the OOM killer, an operator): the
    machine's failure, not the candidate's. Raised through measurement to the worker, which
    reports it so that the request is sent once more (tuner/exec/evaluate.py)."""


class ClockMismatch(RuntimeError):
    """A kernel's process reported a time that the judge's own clock contradicts."""


class BackendUnavailable(RuntimeError):
    """The backend cannot run here (missing toolchain, device or package). Says what to fix."""


class Backend(abc.ABC):
    name: str = ""
    language: str = ""  # the language of its skeletons; with option `language`, one of `languages`
    languages: tuple[str, ...] = ()
    # Whether candidate timing must not overlap compilation on the same machine (true for
    # the CPU backend, whose timing runs on the cores that a compile would steal).
    exclusive_timing: bool = False
    # Whether workers may cap their address space (breaks CUDA's large virtual reservations).
    limit_memory: bool = True
    # Whether kernels run in a process of their own that maps nothing of the harness's but their
    # buffers (cpu): the harness's copies of inputs and references are then out of their reach
    # and need no digest (tuner/exec/checks.py).
    isolated_kernels: bool = False
    last_call_clean: bool = True  # see `time_call` in the module docstring
    # The history check (tuner/exec/history.py): a kernel whose fastest lone call on buffers it
    # has never seen is more than `history_factor` times its timed median, and slower by more
    # than `history_slack_s`, keeps something between calls. A kernel that keeps part of its
    # result and gains less than the factor goes unseen, so a backend whose honest lone calls
    # read close to their median says so with a smaller factor. The slack: what a lone call
    # can add here beyond that (a thread pool waking, a launch that no queue hides); a backend
    # whose lone calls are as fast as its queued ones says so with a smaller figure.
    history_factor: float = 2.0
    history_slack_s: float = 20e-6
    # Whether a verification's float64 references stay on the host and outputs come over to be
    # compared there (npu: CANN's aclnn ops list no DOUBLE for NanToNum, abs and friends on
    # A2/A3, so float64 arithmetic on the device may fail every candidate).
    verify_on_host: bool = False

    def __init__(self, device: int = 0, **options: Any) -> None:
        self.device = device
        self.options = options
        lang = options.get("language")
        if lang and lang != self.language:
            if lang not in self.languages:
                raise BackendUnavailable(f"the {self.name} backend compiles "
                                         f"{' or '.join(self.languages or (self.language,))}, not {lang!r}")
            self.language = lang

    @classmethod
    def check_available(cls) -> None:
        """Raise BackendUnavailable with a fix-it message if this backend cannot run here."""

    @classmethod
    def bench_env(cls, env: dict[str, str]) -> dict[str, str]:
        """The environment of this backend's benchmark workers, given the allowlisted one."""
        return env

    def render_context(self, op) -> dict[str, Any]:
        """Names the backend adds to a template's render context (e.g. `ctype`, `CORES`)."""
        return {}

    def limits(self) -> dict[str, float]:
        """Resource caps (by resource name) that a space's resource formulas must respect.
        Cheap: no device needed (used by the parent's feasibility filter)."""
        return {}

    def compile_options(self) -> dict[str, Any]:
        """Options the compile workers get on top of the run's: what they would otherwise ask
        the device for themselves (see the cuda backend). Called in the parent."""
        return {}

    @abc.abstractmethod
    def compile(self, source: str, op: OpSpec, workdir: str, timeout_s: float) -> Build:
        """Build `source` (a rendered kernel of `op`) under `workdir`. Never touches a device."""

    @abc.abstractmethod
    def device_info(self, peaks: bool = True) -> DeviceInfo:
        """The device's name, cores, limits and toolchain, and with `peaks` its measured ceilings
        (a copy and a matmul benchmark: `tuner.runtime`, which runs in the user's process and
        needs only the name and toolchain, passes False)."""

    @abc.abstractmethod
    def load(self, artifact: str, op) -> Any: ...

    def to_device(self, tensor):
        return tensor

    def warm(self, op: OpSpec | None = None) -> None:
        """Import what compiling needs, and with `op` what compiling its kernels needs (a
        compile worker started ahead of its first request, while the model writes)."""

    def compiler_notes(self, source: str, workdir: str, timeout_s: float = 60.0) -> list[tuple[int, str]]:
        """What the compiler says about how it compiled `source`'s loops, as (line of
        `source`, message): for a kernel far below its roofline, the reasons its loops were not
        vectorised. `source` already compiled as a candidate (same compiler, same flags), so
        this is bounded as that was. None where the compiler has no such report."""
        return []

    def data_device(self):
        """Where verification inputs and their float64 references are made and kept: a torch
        device that makes them fast (a GPU), or None to make them on the host and copy them
        over (the host, or a device without fast float64)."""
        return None

    def to_host(self, tensor):
        return tensor

    def load_for_serving(self, artifact: str, op) -> Any:
        """`load`, for a kernel served in the caller's own process (tuner.runtime): already
        verified, launched on the caller's tensors. The same as `load` where the harness runs
        kernels in-process anyway."""
        return self.load(artifact, op)

    def host_buffer(self, nbytes: int):
        """Host memory for a buffer the harness hands a kernel on this device's host: an object
        with `raw` (a writable buffer of at least BAND_BYTES + nbytes + BAND_BYTES bytes) and
        `read_only()`. Here: fenced pages of this process (kernels that run in it)."""
        from tuner.backends.fence import FencedBuffer
        return FencedBuffer(nbytes)

    def sandbox(self) -> str:
        """What confines this device's candidate code beyond the worker's own sandbox, in words
        (a record's toolchain, the run summary; "MISSING" marks what does not hold). Here: the
        candidate's launch code runs in the worker itself, under the Python code check."""
        import os
        user = "root (MISSING: a Python worker is not dropped to nobody)" if os.geteuid() == 0 else str(os.geteuid())
        return ("kernel process: the worker (Python; candidate code only through the code check); "
                f"exec, fork: MISSING (refused by the code check only, no seccomp filter); user: {user}")

    @abc.abstractmethod
    def launch(self, kernel: Any, args: list) -> None: ...

    def memcheck(self, artifact: str, op: OpSpec, timeout_s: float) -> str:
        """One checked launch of `artifact` under this device's memory checker, for the winner:
        "clean", "errors: <what it found>", or "not run: <why>" (recorded either way)."""
        return "not run: no memory checker for this backend"

    def memcheck_ahead(self, op: OpSpec) -> None:
        """Start what `memcheck` of a kernel of `op` needs before the kernel is known (a
        checker's process with its imports and the op loaded, waiting), so that the winner's
        check costs its launch, not a process's start. Nothing where there is no checker."""

    def launch_checked(self, kernel: Any, args: list) -> None:
        """`launch`, on verification buffers (never timed), with whatever this backend can
        check about how the kernel ran; raises Refused (HostCompute: it did the op's work
        outside the kernel) with the reason. Timed calls cannot be told from checked ones by their buffers, so a
        kernel that behaves here behaves there (tuner/exec/measure.py)."""
        self.launch(kernel, args)

    def sync(self) -> None:
        pass

    def context_lost(self) -> bool:
        """Whether a kernel fault has poisoned this process's device context (an illegal
        address on a GPU): the worker then answers its last request and exits, and a fresh one
        takes its place. Asked after every request, so it must be cheap."""
        return False

    @abc.abstractmethod
    def time_call(self, fn: Callable[[], None], before: Callable[[], None] | None = None) -> float:
        """Seconds of one call of `fn` (its kernel's time, the caches flushed first). `before`,
        when given, runs first, ahead of the flush, and is never part of the time: the harness
        refills the outputs there (tuner/exec/measure.py), so its work must not sit in the
        caches for the timed call either."""

    def time_calls(self, fn: Callable[[], None], n: int,
                   before: Callable[[], None] | None = None) -> list[float]:
        """`n` calls as `time_call` times one, `before` ahead of each; a backend may queue them
        and wait once."""
        return [self.time_call(fn, before) for _ in range(n)]

    def evict(self, tensors: list) -> None:
        """Take `tensors`' memory out of the caches (see the module docstring); nothing here."""


def meta_args(op: OpSpec):
    """Meta tensors with the shapes and dtypes the harness passes `op`'s kernel (inputs, then
    outputs): what a backend that compiles ahead launches `launch` on, without a device."""
    import torch
    ins, outs = _arg_specs(op)
    return ([torch.empty(s, dtype=d, device="meta") for s, d in ins],
            [torch.empty(s, dtype=d, device="meta") for s, d in outs])


@functools.lru_cache(maxsize=16)
def _arg_specs(op: OpSpec):
    """Per op, once per process: a compile worker serves every config (and a sweep's ops). A
    problem file's from its shapes alone where its Model runs on meta tensors: building the
    live op draws its inputs and runs its Model in float64 twice on the host, seconds per
    compile worker at 8192x8192, which fell on a model's first candidate (7-8 s of its first
    compile on an H200)."""
    from tuner.core.ops import arg_specs, load_op
    if op.kind == "kernelbench":
        from tuner.core.problem import shape_only_arg_specs
        specs = shape_only_arg_specs(op)
        if specs is not None:
            return specs
    return arg_specs(load_op(op))


# A compiler stage that died by a signal: triton-ascend's triton-adapter-opt aborts now and then
# on heap corruption of its own ("corrupted size vs. prev_size") on a TTIR that it lowers the
# next time. Such a compile is tried again, up to COMPILER_CRASH_TRIES times in all, before it
# is the config's compile error: a good config is not lost to the compiler's bad luck.
_CRASH = re.compile(r"died with <Signals\.(SIG(?:ABRT|SEGV|BUS|ILL|FPE))")
_FRAME = re.compile(r"^\s*#\d+ 0x[0-9a-fA-F]+ ")
COMPILER_CRASH_TRIES = 3


def compiler_crash(text: str) -> str | None:
    """The signal that killed a compiler subprocess, as its Python error says it; None when the
    compile failed with a message (the kernel's fault) instead."""
    m = _CRASH.search(text or "")
    return m.group(1) if m else None


def retrying_compiler_crashes(compile_once: Callable[[int], Any]) -> Any:
    """compile_once(attempt) for attempt 1, 2, ...: its result, or its exception once it failed
    with a message or COMPILER_CRASH_TRIES times by a compiler's crash (the text of an exception
    and of its causes names the signal)."""
    for attempt in range(1, COMPILER_CRASH_TRIES + 1):
        try:
            return compile_once(attempt)
        except Exception as e:
            text, cur = [], e
            while cur is not None and len(text) < 8:
                text.append(str(cur))
                cur = cur.__cause__ or cur.__context__
            if attempt == COMPILER_CRASH_TRIES or compiler_crash("\n".join(text)) is None:
                raise


def without_stack_frames(text: str) -> str:
    """A crashed LLVM tool's message without its backtrace's frames (addresses in a binary:
    nothing an engineer or a model acts on, and long enough to push the reason out of a
    truncated message)."""
    lines = (text or "").splitlines()
    kept = [ln for ln in lines if not _FRAME.match(ln)]
    if len(kept) < len(lines):
        kept.append(f"({len(lines) - len(kept)} backtrace frames left out)")
    return "\n".join(kept)


class CapturedStderr:
    """What native code wrote to this process's stderr (fd 2) inside the `with` block: MLIR's
    diagnostics (the failing op, with its location in the kernel's source) go there, not into
    the Python exception, which only says "PassManager::run failed". The text is also passed
    on to the real stderr (the workers' log) afterwards. `diagnostics()`: its lines that name
    an error or a location, for a compile error's excerpt."""

    LIMIT = 1 << 20  # bytes kept

    def __init__(self):
        self.text = ""

    def __enter__(self) -> "CapturedStderr":
        import sys
        import tempfile
        sys.stderr.flush()
        self._file = tempfile.TemporaryFile()
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        return self

    def __exit__(self, *exc) -> None:
        import sys
        sys.stderr.flush()
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._file.seek(0)
        data = self._file.read(self.LIMIT)
        self._file.close()
        if data:
            os.write(2, data)
        self.text = data.decode(errors="replace")

    def diagnostics(self, lines: int = 12) -> str:
        keep = [ln.rstrip() for ln in self.text.splitlines()
                if re.search(r"error|:\d+:\d+|^\s*\^|note:", ln, re.I) and "Warning" not in ln]
        return "\n".join(keep[:lines])


def with_diagnostics(excerpt: str, captured: "CapturedStderr", limit: int = 2000) -> str:
    """A compile error's excerpt with the compiler's own diagnostics after it, when it printed any."""
    diag = captured.diagnostics()
    return (f"{excerpt}\ncompiler diagnostics:\n{diag}" if diag else excerpt)[:limit]


_DISK_FULL = ("No space left on device", "Disk quota exceeded")


def raise_if_disk_full(failure: BaseException | str, where: str) -> None:
    """A compile that failed because the disk is full is not the config's failure: raise
    OSError(ENOSPC) so that the run stops and says so, instead of recording a COMPILE_ERROR
    that a resume would never try again."""
    import errno
    if isinstance(failure, OSError) and failure.errno in (errno.ENOSPC, errno.EDQUOT):
        raise OSError(errno.ENOSPC, f"{failure.strerror} ({where})")
    text = str(failure)
    for full in _DISK_FULL:
        if full in text:
            raise OSError(errno.ENOSPC, f"{full} ({where})")


_MEASURED: dict[tuple[str, str], dict[str, float]] = {}  # (cache file, device key) -> this process's


def measured_peaks(file: str, key: str, cache_dir: str | None,
                   measure: Callable[[], dict[str, float]], every_call: bool = False) -> dict[str, float]:
    """A device's ceilings (copy bandwidth, matmul rate), measured once per process (a run's
    benchmark worker, a sweep's device actor; `every_call`: at each call), not once for ever:
    a ceiling measured while another job shared the device is too low and would stay so.
    `file` under the cache folder keeps the highest rate seen for each figure and device,
    since load only lowers them."""
    path = Path(cache_dir or Path.home() / ".cache" / "tuner") / file
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    old = cache.get(key) if isinstance(cache.get(key), dict) else {}
    if every_call or (file, key) not in _MEASURED:
        _MEASURED[(file, key)] = measure()
        cache[key] = {k: max(v, float(old.get(k) or 0.0)) for k, v in _MEASURED[(file, key)].items()}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(cache, indent=1))
        except OSError:
            pass  # an unwritable cache only loses the highest rate seen
        return cache[key]
    return {k: max(v, float(old.get(k) or 0.0)) for k, v in _MEASURED[(file, key)].items()}

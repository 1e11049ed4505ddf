"""The `cpu` backend: C with OpenMP, compiled by the system C compiler.

Under the harness a kernel runs in a native host process of its own (cpu_host.c, driven by
cpu_host.py), never in the Python process that judges it: its buffers are shared memory, its
time is the host's monotonic clock around the call, checked against the judge's. Before each
timed call the caches are evicted by writing a buffer twice the size of the last-level cache.
A served kernel (tuner.runtime) is loaded into the caller's process with ctypes (`load_for_serving`).
Peaks (copy bandwidth, fp32 matmul rate) are measured with torch, per machine.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

from tuner.backends.base import Backend, BackendUnavailable, measured_peaks, raise_if_disk_full
from tuner.core.values import Build, DeviceInfo, OpSpec, Status

# An undeclared function is an error with its line, not a warning lost before the object check
# reports the symbol it left behind ("calls 'max'").
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-std=gnu11", "-shared", "-fPIC", "-Werror=implicit-function-declaration"]
CTYPES = {"fp32": "float", "fp64": "double"}


def compiler() -> str | None:
    if os.environ.get("CC"):
        return shutil.which(os.environ["CC"])  # a CC that does not exist means no compiler
    return shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def _llc_bytes() -> int:
    best = 0
    for p in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        m = re.match(r"(\d+)([KMG]?)", p.read_text().strip())
        if m:
            best = max(best, int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2)])
    return best or 32 * 2**20


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class CpuBackend(Backend):
    name = "cpu"
    language = "c"
    exclusive_timing = True
    isolated_kernels = True  # cpu_host: a process of its own
    # Lone calls here run in the same host, on buffers mapped and faulted in ahead (MAP_POPULATE)
    # and after the same eviction: honest library kernels' fastest of three read at most 0.98x
    # their median idle (1.21x under the earlier flush, idle or loaded; bench/RESULTS.md), and a
    # kernel that keeps half its rows in a freed heap block between calls gains 1.9x, which 2x
    # let through.
    history_factor = 1.4

    def __init__(self, device: int = 0, **options: Any) -> None:
        super().__init__(device, **options)
        self._flush_buf = None
        self._wake_buf = None  # see _wake
        self._buffers = None  # cpu_host.Buffers, made at the first host_buffer
        self._timed: list[float] | None = None  # host times of the launches inside a time_call

    @classmethod
    def check_available(cls) -> None:
        import sys
        if not sys.platform.startswith("linux"):
            raise BackendUnavailable(
                f"the cpu backend runs each kernel in a sandboxed host process that needs Linux "
                f"(shared memory files, seccomp); this is {sys.platform}. Run it on a Linux machine "
                f"(a container or VM will do)")
        if compiler() is None:
            cc = os.environ.get("CC")
            raise BackendUnavailable(
                (f"CC={cc} is not an executable C compiler. " if cc else "no C compiler found. ")
                + "The cpu backend needs a C compiler with OpenMP: install gcc (e.g. "
                "`apt-get install gcc`) or set CC to one")

    @classmethod
    def bench_env(cls, env: dict[str, str]) -> dict[str, str]:
        """The judge's own OpenMP threads (torch's: references, checks) spin only briefly after
        their work (`_JUDGE_SPINS`), not on the cores a kernel is timed on next (the host's
        flush comes between), yet long enough that the team `_wake` rouses is still awake when
        the torch reference's timed call begins. The kernel's host gets the user's settings
        back (cpu_host._host_env)."""
        from tuner.backends.cpu_host import WAIT_SETTINGS
        env = dict(env)
        for name in WAIT_SETTINGS:
            if name in env:
                env["TUNER_KERNEL_" + name] = env.pop(name)
        env["GOMP_SPINCOUNT"] = str(_JUDGE_SPINS)
        return env

    def render_context(self, op) -> dict[str, Any]:
        if op.spec.dtype not in CTYPES:
            raise BackendUnavailable(f"the cpu backend supports dtypes {', '.join(CTYPES)}, "
                                     f"not {op.spec.dtype}; pass --dtype fp32 (in a sweep file: dtypes: [fp32])")
        return {"ctype": CTYPES[op.spec.dtype], "CORES": os.cpu_count() or 1}

    def compile(self, source: str, op: OpSpec, workdir: str, timeout_s: float) -> Build:
        from tuner.codecheck import Forbidden, check_object, require_clean
        cc = compiler()
        if cc is None:
            raise BackendUnavailable("no C compiler found; install gcc or set CC")
        try:  # every config's source, not only the ones the skeleton writer rendered
            require_clean("c", source)
        except Forbidden as e:
            return Build(Status.COMPILE_ERROR, error=str(e))
        wd = Path(workdir)
        wd.mkdir(parents=True, exist_ok=True)
        src, lib = wd / "kernel.c", wd / "kernel.so"
        src.write_text(source)
        t0 = time.monotonic()
        try:
            # In the build folder, by name, in the C locale: messages say "kernel.c:3:12: error:
            # implicit declaration of function 'max'", with plain quotes and no temporary path.
            proc = subprocess.run([cc, *CFLAGS, src.name, "-o", lib.name, "-lm"], cwd=wd,
                                  env={**os.environ, "LC_ALL": "C"}, capture_output=True, text=True,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return Build(Status.COMPILE_TIMEOUT, error=f"{Path(cc).name} ran past {timeout_s:g} s",
                         compile_s=time.monotonic() - t0)
        dt = time.monotonic() - t0
        if proc.returncode != 0:
            raise_if_disk_full(proc.stderr, f"the compiler, writing {lib}")  # the disk, not the config
            return Build(Status.COMPILE_ERROR, error=_excerpt(proc.stderr), compile_s=dt)
        # Judged by what was built, before anything loads it (a constructor would run on load).
        try:
            findings = check_object(str(lib))
        except FileNotFoundError as e:
            raise BackendUnavailable(str(e)) from None
        if findings:
            return Build(Status.COMPILE_ERROR, compile_s=dt, error="forbidden: " + "; ".join(
                f.why for f in findings) + " (in the compiled object)")
        # Hash the code section, not the file: two configs that compile to the same machine
        # code are the same candidate.
        digest = hashlib.sha256(lib.read_bytes()).hexdigest()[:16]
        return Build(Status.OK, artifact=str(lib), compile_s=dt, binary_hash=digest)

    def compiler_notes(self, source: str, workdir: str, timeout_s: float = 60.0) -> list[tuple[int, str]]:
        """gcc's -fopt-info-vec-missed (clang's -Rpass-missed/-analysis=loop-vectorize) for
        the kernel's own loops, one or two reasons per loop line, at most 12 lines."""
        cc = compiler()
        if cc is None:
            return []
        wd = Path(workdir)
        wd.mkdir(parents=True, exist_ok=True)
        (wd / "kernel.c").write_text(source)
        try:
            version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=10).stdout
            clang = "clang" in version.lower()
            report = (["-Rpass-missed=loop-vectorize", "-Rpass-analysis=loop-vectorize"] if clang
                      else ["-fopt-info-vec-missed=vec.txt"])
            flags = [f for f in CFLAGS if f != "-shared"]
            proc = subprocess.run([cc, *flags, *report, "-c", "kernel.c", "-o", "kernel.o"], cwd=wd,
                                  env={**os.environ, "LC_ALL": "C"}, capture_output=True, text=True,
                                  timeout=timeout_s)
            text = proc.stderr if clang else (wd / "vec.txt").read_text(errors="replace")
        except (OSError, subprocess.TimeoutExpired):
            return []
        by_line: dict[int, list[str]] = {}
        for m in re.finditer(r"^kernel\.c:(\d+):\d+: (?:missed|remark): (.*)$", text, re.M):
            line, why = int(m.group(1)), m.group(2).strip()
            why = re.sub(r"\s*\[-Rpass[^\]]*\]$", "", why)
            seen = by_line.setdefault(line, [])
            if why not in seen and len(seen) < 2:
                seen.append(why)
        return [(line, "; ".join(whys)) for line, whys in sorted(by_line.items())[:12]]

    def limits(self) -> dict[str, float]:
        return {}

    def device_info(self, peaks: bool = True) -> DeviceInfo:
        name = cpu_name()
        cores = os.cpu_count() or 1
        peaks = _cached_peaks(name, cores, self.options.get("cache_dir")) if peaks else {}
        cc = compiler() or "none"
        try:
            ccv = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=10).stdout
            ccv = ccv.splitlines()[0] if ccv else cc
        except (OSError, subprocess.TimeoutExpired):
            ccv = cc
        import torch
        return DeviceInfo(
            backend="cpu", name=f"{name} ({cores} cores)", cores=cores,
            limits=tuple(sorted(self.limits().items())), peaks=tuple(sorted(peaks.items())),
            toolchain=(("cc", ccv), ("python", platform.python_version()), ("torch", torch.__version__)))

    def _host(self) -> tuple[str, str]:
        """(the kernel host's path, "" or why it lacks seccomp): cpu_host.host_binary."""
        from tuner.backends.cpu_host import host_binary
        cc = compiler()
        if cc is None:
            raise BackendUnavailable("no C compiler found; install gcc or set CC")
        return host_binary(cc, self.options.get("cache_dir"))

    def load(self, artifact: str, op) -> Any:
        """The kernel in a host process of its own (cpu_host.HostKernel); `launch` it on
        buffers from `host_buffer`. An object that does not load raises LoadError."""
        from tuner.backends.cpu_host import Buffers, HostKernel
        if self._buffers is None:
            self._buffers = Buffers()
        # The host evicts a call's buffers line by line; the byte count is its fallback (cpu_host.c).
        return HostKernel(self._host()[0], str(Path(artifact).resolve()), self._buffers, 2 * _llc_bytes())

    def load_for_serving(self, artifact: str, op) -> Any:
        fn = ctypes.CDLL(artifact).tuner_kernel
        fn.restype = None
        return fn

    def host_buffer(self, nbytes: int):
        from tuner.backends.cpu_host import Buffers
        if self._buffers is None:
            self._buffers = Buffers()
        return self._buffers.new(nbytes)

    def sandbox(self) -> str:
        from tuner.backends.cpu_host import HostUnavailable, probe
        try:
            binary, note = self._host()
            return probe(binary) + (f"; {note}" if note else "")
        except (HostUnavailable, OSError, subprocess.SubprocessError) as e:
            return f"kernel process: MISSING ({e})"

    def launch(self, kernel: Any, args: list) -> None:
        from tuner.backends.cpu_host import HostKernel
        if isinstance(kernel, HostKernel):
            took = kernel.call(args, flush=self._timed is not None)  # timed: flushed in the host first
            if self._timed is not None:
                self._timed.append(took)
        else:  # a served kernel, in this process
            kernel(*[ctypes.c_void_p(t.data_ptr()) for t in args])

    def time_call(self, fn: Callable[[], None], before: Callable[[], None] | None = None) -> float:
        """`fn` once, the caches flushed first: the seconds its kernel launches took by their
        host's clock (each flushed in its host, which checks the judge's clock: cpu_host), or,
        when `fn` launched nothing on a host (the torch reference runs here), `fn` once more,
        flushed and timed here. `before` runs here first (the host flushes after it); for code
        timed here it is the caller's eviction of what that code reads (`evict`), and runs again
        ahead of the timed call."""
        if before is not None:
            before()
        self._timed = []
        try:
            fn()
            if self._timed:
                return sum(self._timed)
        finally:
            self._timed = None
        if before is not None:
            before()  # again: the untimed call above read the inputs (an eviction is undone)
        if self._evictor() is None:
            self._flush()
        self._wake()
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    def _wake(self) -> None:
        """Wake torch's OpenMP team, untimed, as the kernel's host wakes its own before each
        call (cpu_host.c): after the flush its threads sleep, and a sleeping thread can take
        milliseconds to get a core back on a virtual machine. A fill large enough that torch
        splits it over every thread."""
        import torch
        if self._wake_buf is None:
            self._wake_buf = torch.empty(max(1, torch.get_num_threads()) * 2**16)
        self._wake_buf.fill_(0.0)

    def evict(self, tensors: list) -> None:
        """The tensors' bytes out of every cache level, as the kernel host evicts a call's
        buffers (cpu_host.c); where this CPU has no eviction by line, the time_call that follows
        writes a buffer twice the last-level cache instead."""
        evict = self._evictor()
        if evict is not None:
            for t in tensors:
                storage = t.untyped_storage()  # all of it: a view's kernel may read around it
                evict(storage.data_ptr(), storage.nbytes())

    def _evictor(self):
        from tuner.backends.cpu_host import evictor
        cc = compiler()
        return evictor(cc, self.options.get("cache_dir")) if cc else None

    def _flush(self) -> None:
        import numpy as np
        if self._flush_buf is None:
            self._flush_buf = np.empty(2 * _llc_bytes() // 8, dtype=np.float64)
        self._flush_buf.fill(1.0)


_JUDGE_SPINS = 10_000  # 10 us to 0.5 ms (a pause instruction takes 10 to 150 cycles)

def _excerpt(stderr: str, lines: int = 12) -> str:
    """The first errors of a compiler log: what a person or a model needs to fix it."""
    keep = [ln for ln in stderr.splitlines() if "error" in ln or "^" in ln or ln.startswith(" ")]
    return "\n".join((keep or stderr.splitlines())[:lines])[:2000]


def _cached_peaks(name: str, cores: int, cache_dir: str | None) -> dict[str, float]:
    """Ceilings of this machine, per CPU model and core count. A ceiling measured while the
    machine was busy is too low, and a cached one would stay too low (a kernel then shows
    140 % of "copy bandwidth"): each run measures again (~0.5 s) and the cache keeps the
    highest rate seen for each figure, since load only ever lowers them."""
    from tuner.backends.cpu_host import evictor
    cc = compiler()
    evict = evictor(cc, cache_dir) if cc else None
    return measured_peaks("cpu_peaks.json", f"{name}|{cores}", cache_dir, lambda: measure_peaks(evict),
                          every_call=True)


def measure_peaks(evict=None) -> dict[str, float]:
    """Copy bandwidth (read + write bytes per second) and the fp32 matmul rate, via torch.
    With `evict` (cpu_host.evictor) each copy starts with both buffers out of the caches, as a
    timed kernel's call does, at 64 MiB and at 1 MiB (small transfers from memory ran 20-25 %
    faster, and a small honest kernel read faster than the floor the large copy set); without
    it the buffers are made larger than the caches."""
    import torch
    sizes = (64 * 2**20, 2**20) if evict else (max(64 * 2**20, 4 * _llc_bytes()),)
    copy_gbps = 0.0
    for nbytes in sizes:
        n = nbytes // 4  # fp32 elements per buffer
        src, dst = torch.ones(n), torch.empty(n)
        dst.copy_(src)
        best = float("inf")
        for _ in range(5 if nbytes > 2**24 else 20):  # a small copy is cheap: more tries at its best
            if evict:
                evict(src.data_ptr(), 4 * n)
                evict(dst.data_ptr(), 4 * n)
            t0 = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - t0)
        copy_gbps = max(copy_gbps, 2 * n * 4 / best / 1e9)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return {"copy_gbps": round(copy_gbps, 2), "fp32_gflops": round(2 * 2048**3 / best / 1e9, 1)}

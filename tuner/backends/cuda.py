"""The `cuda` backend: Triton kernels on torch CUDA tensors.

Skeleton contract (language `triton`): the template renders a Python module that defines its
@triton.jit kernel(s) and `def launch(<inputs>, <outputs>)` with the op's names (softmax:
`launch(x, y)`), which computes the grid and launches into the outputs the harness allocated
and poisoned. The module's AST is checked before anything in it runs (`tuner.codecheck`): a
violation is a COMPILE_ERROR "forbidden: ...".

Compile (in the compile pool, on the CPU cores; it reads the device's properties through torch
but launches nothing, and Triton is pointed at a stand-in driver): the module is imported and
`launch` is called on meta tensors of the op's real shapes with every kernel launch turned
into a Triton warm-up, so Triton compiles exactly the specializations the benchmark worker
will launch. The cubins land in a Triton cache shared by the run (`<run>/build/triton_cache`),
so the benchmark worker's first launch is a disk-cache hit. Kernels whose shared memory
exceeds the device's per-block limit become COMPILE_ERROR "out of resource: shared memory".

Timing (in the one benchmark worker per GPU): CUDA events around one call, after a read of a
buffer larger than the L2 (`triton_device.evict`: enqueued before the start event, so it also
hides the host's launch latency, and it leaves clean lines, so the call writes back nothing of
anyone else's). An illegal memory access poisons the CUDA context: the measurement says
RUNTIME_ERROR with the reason and `context_lost` tells the worker to hand its reply back and be
replaced. The winner's memory check: `cuda_memcheck`.

Language `cuda` (option `language="cuda"`; `tuner tune --language cuda`, or a space that says
`language: cuda`): CUDA C++ kernels launched from a checked Python launch module through
`tuner.cuda.launch` (contract there). Compile: the module's `launch` runs on meta tensors with
the launches recorded; each (source, options) unit is checked, compiled to a cubin and its PTX
checked (`cuda_source`), and every launch checked against what was compiled (kernel name,
argument types, block, grid, shared memory, registers); `kernel.cuda.json` beside the module
names the cubins. Load: the cubins through the CUDA driver, then the module. Timing, checks and
fault isolation are the Triton path's.

Options: `arch` (e.g. 90) compiles for that target without asking the device; `interpret`
runs kernels through Triton's interpreter on CPU tensors (`TRITON_INTERPRET=1`), for CI;
`language` ("triton", the default, or "cuda").
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from tuner.backends.base import (BackendUnavailable, CapturedStderr, measured_peaks, meta_args, raise_if_disk_full,
                                 with_diagnostics)
from tuner.backends.cuda_memcheck import Memcheck
from tuner.backends.cuda_source import check_ptx
from tuner.backends.triton_device import TritonDevice
from tuner.backends.triton_source import compile_only, load_module, use_cache, warm_launch
from tuner.codecheck import Forbidden, require_clean
from tuner.core.values import Build, DeviceInfo, OpSpec, Status

# Shared memory per block (opt-in maximum) by compute capability, for when no device is asked.
SMEM_OPTIN = {70: 98304, 75: 65536, 80: 166912, 86: 101376, 87: 166912, 89: 101376,
              90: 232448, 100: 232448, 103: 232448, 120: 101376}


MANIFEST = "kernel.cuda.json"  # beside a `cuda` launch module: its compiled units


class CudaBackend(TritonDevice):
    name = "cuda"
    language = "triton"
    languages = ("triton", "cuda")
    torch_device = "cuda"
    module_prefix = "tuner_triton"
    flush_factor = 4
    limit_memory = False  # CUDA reserves far more virtual memory than RLIMIT_AS would allow
    # A lone call holds the device busy for the host's launch and its clean samples alone are
    # compared (time_call): on a loaded H200 host honest 6-21 us kernels' lone calls read at
    # most 1.04x their queued median, so a few us cover it, and a result cache in a kernel
    # of 10 us is seen (the default 20 us let it be).
    history_slack_s = 5e-6
    # Honest library Triton kernels' fastest lone call read at most 1.013x their median on an
    # H200 (36 kernels, 12 cases; 1.000 for 10 with every host core busy) and 1.015x on an H100
    # (24 kernels); the library's CUDA C++ kernels at most 1.024x on an H100 (20 kernels, 10
    # cases; `--language cuda`): bench/lone_calls.py. A matmul keeping one output tile in four in an
    # allocator-recycled scratch passed 1.3x and is caught here (tests/test_redteam.py); what a
    # kernel gains unseen is now under 15 %.
    history_factor = 1.15

    def __init__(self, device: int = 0, **options: Any) -> None:
        super().__init__(device, **options)
        self._props = None
        self._seen_cache_dirs: dict[str, set[str]] = {}  # run cache -> its folders looked at
        self._last_cache: str | None = None  # the run cache of the kernel loaded last
        self._memcheck = Memcheck(device)

    # ---- availability and facts -------------------------------------------------------

    @classmethod
    def check_available(cls) -> None:
        try:
            import triton  # noqa: F401
        except ImportError:
            raise BackendUnavailable("the cuda backend needs Triton: pip install 'tuner[cuda]' "
                                     "(or pip install triton)") from None
        import torch
        if not torch.cuda.is_available():
            raise BackendUnavailable(
                "no CUDA device: torch.cuda.is_available() is False (a CPU build of torch, "
                "no NVIDIA driver, or CUDA_VISIBLE_DEVICES hides the GPUs)")

    def _properties(self):
        if self._props is None:
            import torch
            self._props = torch.cuda.get_device_properties(self.device)
        return self._props

    def _arch(self) -> int:
        if self.options.get("arch"):
            return int(self.options["arch"])
        if self.interpret:
            return 90
        p = self._properties()
        return p.major * 10 + p.minor

    def render_context(self, op) -> dict[str, Any]:
        cores = self.options.get("cores") or (4 if self.interpret else
                                               self._properties().multi_processor_count)
        # ARCH: the compute capability as one number (90: sm_90), for spaces whose kernels
        # need an architecture's instructions (a constraint such as `ARCH >= 90`).
        return {"CORES": int(cores), "ARCH": self._arch()}

    def limits(self) -> dict[str, float]:
        if self.options.get("smem_bytes"):  # told by the parent (compile_options)
            return {"smem_bytes": float(self.options["smem_bytes"])}
        if self.interpret or self.options.get("arch"):
            return {"smem_bytes": float(SMEM_OPTIN.get(self._arch(), 101376))}
        p = self._properties()
        smem = getattr(p, "shared_memory_per_block_optin", 0) or SMEM_OPTIN.get(self._arch(), 49152)
        return {"smem_bytes": float(smem)}

    def compile_options(self) -> dict[str, Any]:
        # The compile processes compile for the architecture without a GPU (`_compile_only`);
        # told it and the shared-memory limit, none of them initializes CUDA to ask (a run
        # starts one per core, beside the benchmark process's own start), and a Ray compile
        # task may run on a node without a GPU.
        if self.interpret or self.options.get("arch"):
            return {}
        return {"arch": self._arch(), "smem_bytes": self.limits()["smem_bytes"]}

    def memcheck_ahead(self, op: OpSpec) -> None:
        if not self.interpret:
            self._memcheck.start_ahead(op)

    def memcheck(self, artifact: str, op: OpSpec, timeout_s: float) -> str:
        if self.interpret:
            return "not run: Triton's interpreter runs on the host"
        return self._memcheck.run(artifact, op, timeout_s)

    def device_info(self, peaks: bool = True) -> DeviceInfo:
        import torch
        import triton
        tools = (("python", platform.python_version()), ("torch", torch.__version__),
                 ("triton", triton.__version__))
        if self.interpret:
            return DeviceInfo(backend="cuda", name="Triton interpreter (CPU)", cores=4,
                              limits=tuple(sorted(self.limits().items())), toolchain=tools,
                              simulated=True)
        self._bind()
        p = self._properties()
        smi = _nvidia_smi(self.device)
        limits = {**self.limits(), "l2_bytes": float(p.L2_cache_size)}
        peaks = _cached_peaks(f"{p.name}|{p.multi_processor_count}|{smi.get('driver', '')}",
                              self.options.get("cache_dir"), self) if peaks else {}
        tools += (("cuda", str(torch.version.cuda)), ("driver", smi.get("driver", "?")),
                  ("sm_clock_max_mhz", smi.get("clock", "?")), ("arch", f"sm_{self._arch()}"))
        return DeviceInfo(backend="cuda", name=p.name, cores=p.multi_processor_count,
                          limits=tuple(sorted(limits.items())), peaks=tuple(sorted(peaks.items())),
                          toolchain=tuple(sorted(tools)))

    # ---- compile ------------------------------------------------------------------------

    def compile(self, source: str, op: OpSpec, workdir: str, timeout_s: float) -> Build:
        if self.language == "cuda":
            return self._compile_cuda(source, op, workdir, timeout_s)
        t0 = time.monotonic()
        try:
            require_clean("triton", source)
        except SyntaxError as e:
            return Build(Status.COMPILE_ERROR, error=f"SyntaxError: {e.msg} (line {e.lineno})",
                         compile_s=time.monotonic() - t0)
        except Forbidden as e:
            return Build(Status.COMPILE_ERROR, error=str(e), compile_s=time.monotonic() - t0)
        wd = Path(workdir)
        wd.mkdir(parents=True, exist_ok=True)
        path = wd / "kernel.py"
        path.write_text(source)
        digest = hashlib.sha256(source.encode()).hexdigest()[:16]
        if self.interpret:  # nothing to compile ahead: the interpreter runs the Python
            return Build(Status.OK, artifact=str(path), compile_s=time.monotonic() - t0,
                         binary_hash=digest)
        use_cache(path)
        try:
            with CapturedStderr() as captured:  # MLIR's diagnostics: the op and line that failed
                module = load_module(path, f"tuner_triton_{digest}")
                kernels = self._warm(module, op)
        except Exception as e:
            raise_if_disk_full(e, "Triton's compile and cache")  # the disk, not the config
            return Build(Status.COMPILE_ERROR, error=with_diagnostics(_excerpt(e), captured),
                         compile_s=time.monotonic() - t0)
        dt = time.monotonic() - t0
        if not kernels:
            return Build(Status.COMPILE_ERROR, compile_s=dt,
                         error="launch() launched no @triton.jit kernel")
        # The PTX read by meaning, as a CUDA C++ unit's is: Triton's `tl.device_print` is a
        # device printf, and `tl.inline_asm_elementwise` places any PTX in the kernel (a
        # `.global` variable declared there keeps state from one launch to the next).
        for k in kernels:
            bad = check_ptx(str(k.asm.get("ptx", "")))
            if bad:
                return Build(Status.COMPILE_ERROR, compile_s=dt,
                             error=f"kernel {getattr(k, 'name', '?')}: " + "; ".join(bad))
        limit = int(self.limits()["smem_bytes"])
        h = hashlib.sha256()
        for k in kernels:
            shared = int(getattr(k.metadata, "shared", 0))
            if shared > limit:
                return Build(Status.COMPILE_ERROR, compile_s=dt,
                             error=f"out of resource: shared memory, Required: {shared}, "
                                   f"Hardware limit: {limit}")
            h.update(k.asm.get("cubin", b"") if isinstance(k.asm.get("cubin"), bytes)
                     else str(k.asm.get("ptx", "")).encode())
        return Build(Status.OK, artifact=str(path), compile_s=dt, binary_hash=h.hexdigest()[:16])

    def _compile_cuda(self, source: str, op: OpSpec, workdir: str, timeout_s: float) -> Build:
        """A `cuda` launch module: its launches recorded on meta tensors, each unit compiled
        and checked, each launch checked against what was compiled (module docstring)."""
        import torch

        from tuner import cuda
        from tuner.backends import cuda_source
        t0 = time.monotonic()

        def failed(why: str) -> Build:
            return Build(Status.COMPILE_ERROR, error=why[:2000], compile_s=time.monotonic() - t0)

        if self.interpret:
            return failed("CUDA C++ kernels need a GPU: Triton's interpreter runs only Triton kernels")
        try:
            require_clean("cuda", source)
        except SyntaxError as e:
            return failed(f"SyntaxError: {e.msg} (line {e.lineno})")
        except Forbidden as e:
            return failed(str(e))
        wd = Path(workdir)
        wd.mkdir(parents=True, exist_ok=True)
        path = wd / "kernel.py"
        path.write_text(source)
        digest = hashlib.sha256(source.encode()).hexdigest()[:16]
        try:
            module = load_module(path, f"tuner_cuda_{digest}", "cuda")
            with cuda.recording() as launches, torch.no_grad():
                module.launch(*[a for group in meta_args(op) for a in group])
        except Exception as e:  # noqa: BLE001 - the launch module's own error: the config's
            return failed(f"launch() failed on the op's shapes: {type(e).__name__}: {e}")
        if not launches:
            return failed("launch() launched no kernel (call cuda.launch(SOURCE, name, grid, block, *args))")
        units: dict[str, dict] = {}
        budget = time.monotonic() + timeout_s
        for ln in launches:
            if ln.key in units:
                continue
            try:
                units[ln.key] = cuda_source.compile_unit(ln.source, ln.options, self._arch(), wd / ln.key,
                                                         max(1.0, budget - time.monotonic()))
            except cuda_source.CudaCompileError as e:
                raise_if_disk_full(str(e), "the CUDA compiler")
                return failed(str(e))
        why = cuda_source.check_launches(launches, units, int(self.limits()["smem_bytes"]))
        if why:
            return failed(why)
        h = hashlib.sha256()
        for key in sorted(units):
            h.update((wd / key / "unit.cubin").read_bytes())
        (wd / MANIFEST).write_text(json.dumps({"arch": self._arch(), "units": units}, indent=1))
        return Build(Status.OK, artifact=str(path), compile_s=time.monotonic() - t0,
                     binary_hash=h.hexdigest()[:16])

    def load(self, artifact: str, op) -> Any:
        manifest = Path(artifact).with_name(MANIFEST)
        if not manifest.is_file():
            return super().load(artifact, op)
        # A `cuda` launch module (whatever this backend's language option: the memory checker
        # and the runtime load artifacts by what they are).
        from tuner import cuda
        self._bind()
        units = json.loads(manifest.read_text())["units"]
        cuda.load_units(units, lambda key: (manifest.parent / key / "unit.cubin").read_bytes())
        digest = hashlib.sha256(Path(artifact).read_bytes()).hexdigest()[:16]
        return load_module(artifact, f"tuner_cuda_{digest}", "cuda").launch

    def _warm(self, module, op: OpSpec) -> list:
        """Compile-only launches on meta tensors, for this device's architecture."""
        with _compile_only(self._arch()):
            return warm_launch(module, *meta_args(op))

    # ---- run (the rest: TritonDevice) ---------------------------------------------------

    def _l2_bytes(self) -> int:
        return int(self._properties().L2_cache_size)

    def _before_import(self, artifact: str) -> None:
        if self.options.get("cache_dir"):
            shared = Path(self.options["cache_dir"]) / "triton_launchers"
            run_cache = os.environ["TRITON_CACHE_DIR"]
            # The last kernel's run first: a launcher its launches built goes out before this
            # run's come in (in a sweep, that is often another run's).
            for c in dict.fromkeys([self._last_cache, run_cache]):
                if c:
                    _share_launchers(Path(c), shared, self._seen_cache_dirs.setdefault(c, set()))
            self._last_cache = run_cache

    def warm(self, op: OpSpec | None = None) -> None:
        import torch  # noqa: F401 - the imports are the warm-up: seconds of a compile's start
        import triton.compiler  # noqa: F401
        import triton.language  # noqa: F401
        if self.interpret or self.language == "cuda":
            return
        if op is not None:  # the shapes its kernels are compiled for (a failure: the compile says)
            with contextlib.suppress(Exception):
                meta_args(op)
        # And one tiny kernel compiled for real: a process's first compile also sets up
        # Triton's back end (LLVM, ptxas found and asked its version), seconds that otherwise
        # fall on a run's first candidates, all compile processes at once. In a scratch
        # folder with its own cache: nothing of a run's is touched. Never fatal: a real
        # compile says what is wrong.
        try:
            self._warm_compile()
        except Exception:  # noqa: BLE001
            pass

    def _warm_compile(self) -> list:
        import torch
        old_cache = os.environ.get("TRITON_CACHE_DIR")
        try:
            with tempfile.TemporaryDirectory(prefix="tuner-warm-") as d:
                path = Path(d) / "warm" / "kernel.py"
                path.parent.mkdir()
                path.write_text(_WARM_SOURCE)
                use_cache(path)
                module = load_module(path, "tuner_triton_warm")
                x = torch.empty(4096, dtype=torch.float32, device="meta")
                with _compile_only(self._arch()):
                    return warm_launch(module, [x], [torch.empty_like(x)])
        finally:
            if old_cache is None:
                os.environ.pop("TRITON_CACHE_DIR", None)
            else:
                os.environ["TRITON_CACHE_DIR"] = old_cache


def _compile_only(arch: int):
    return compile_only("cuda", arch, 32)



_LAUNCHER = "__triton_launcher"


def _share_launchers(run_cache: Path, shared: Path, seen: set[str]) -> None:
    """Triton builds a small C module per kernel signature (its launcher) with the host's C
    compiler, a third of a second each, into the kernel cache at a kernel's first launch. Each
    run has its own cache, so every run's benchmark Worker built them again: 17 builds, 6 s of
    a GPU's 37 s in a 16-task sweep. A launcher depends on the signature (and Triton's version)
    alone, under the key Triton looks it up by; so the ones built here are kept in one folder
    per machine, and copied into a run's cache before its kernels launch. Best effort: a
    missing launcher is built as before. `seen`: this run cache's folders already looked at."""
    try:
        shared.mkdir(parents=True, exist_ok=True)
        for folder in shared.iterdir():  # in: the ones built by earlier runs
            if folder.name in seen or folder.name.startswith("."):
                continue
            if not (run_cache / folder.name).exists():
                _copy_folder(folder, run_cache / folder.name)
            seen.add(folder.name)
        for folder in run_cache.iterdir():  # out: the ones built here since the last call
            if folder.name in seen or folder.name.startswith(".") or not folder.is_dir():
                continue
            files = [f.name for f in folder.iterdir()]
            if not files:
                continue  # being written by a compile: looked at again next time
            seen.add(folder.name)
            if any(f.startswith(_LAUNCHER) for f in files) and not (shared / folder.name).exists():
                _copy_folder(folder, shared / folder.name)
    except OSError:
        pass


def _copy_folder(src: Path, dst: Path) -> None:
    """Copied beside `dst`, then renamed into place: a reader never sees half a folder."""
    tmp = dst.parent / f".{dst.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    try:
        tmp.rename(dst)
    except OSError:  # another process put it there first
        shutil.rmtree(tmp, ignore_errors=True)


def _excerpt(e: BaseException) -> str:
    """The reason first (Triton chains it as the cause), then the source around the error."""
    text = "".join(traceback.format_exception_only(type(e), e)).strip()
    m = re.search(r"out of resource: \w+.*", text)
    if m:
        return m.group(0)[:2000]
    cause = e.__cause__ or e.__context__
    reason = "".join(traceback.format_exception_only(type(cause), cause)).strip() if cause else ""
    head = f"compile error: {reason.splitlines()[-1] if reason else text.splitlines()[0]}"
    return "\n".join([head, *text.splitlines()[:30]])[:2000]


_WARM_SOURCE = """
import triton
import triton.language as tl


@triton.jit
def tuner_warm_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2.0, mask=offs < n)


def launch(x, y):
    tuner_warm_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
"""


@functools.lru_cache(maxsize=None)
def _nvidia_smi(device: int) -> dict[str, str]:
    """Driver version and maximum SM clock: fixed for a process's life. Asked once per
    process: nvidia-smi takes a few hundred ms, and a sweep's device actor answers device_info
    for every task it serves."""
    try:
        out = subprocess.run(["nvidia-smi", "-i", str(device), "--query-gpu=driver_version,clocks.max.sm",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        driver, clock = [s.strip() for s in out.split(",")[:2]]
        return {"driver": driver, "clock": clock}
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {}


def _cached_peaks(key: str, cache_dir: str | None, backend: CudaBackend) -> dict[str, float]:
    """Copy bandwidth and bf16 matmul rate of this GPU (see measured_peaks)."""
    return measured_peaks("cuda_peaks.json", key, cache_dir, lambda: measure_peaks(backend))


def measure_peaks(backend: CudaBackend) -> dict[str, float]:
    """Device-to-device copy (bytes read + written per second) and the bf16 cuBLAS rate on
    random data, timed like candidates (events, L2 flushed), median of several."""
    import statistics

    import torch
    dev = f"cuda:{backend.device}"
    n = 2**29  # 1 GiB of bf16 per buffer
    src = torch.randn(n, device=dev, dtype=torch.float32).to(torch.bfloat16)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t = statistics.median(backend.time_call(lambda: dst.copy_(src)) for _ in range(15))
    copy_gbps = 2 * n * 2 / t / 1e9
    src = dst = None  # free 2 GiB before the matmul
    s = 8192
    a = torch.randn(s, s, device=dev, dtype=torch.bfloat16)
    b = torch.randn(s, s, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    t = statistics.median(backend.time_call(lambda: a @ b) for _ in range(10))
    a = b = None
    torch.cuda.empty_cache()  # the 2 GiB buffers go back to the device, not to this process's pool
    return {"copy_gbps": round(copy_gbps, 1), "bf16_gflops": round(2 * s**3 / t / 1e9, 1)}

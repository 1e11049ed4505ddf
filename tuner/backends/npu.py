"""The `npu` backend: triton-ascend kernels on Huawei Ascend NPUs through torch_npu.

Written against the documented APIs of triton-ascend 3.2 (Triton 3.2 based), torch_npu 2.7 and
CANN 8.5; **it has never run on an NPU** (see README, "Ascend"). What runs without one is the
part that does not need the device, and it is tested: the compile-option table and its checks,
the UB-overflow error parser, grid and core planning (tuner/backends/ascend_source.py, shared
with the sim backend), and every triton_ascend skeleton through
Triton's interpreter on CPU tensors (`interpret=True`: options stripped, since the upstream
interpreter knows none of them).

Skeleton contract (language `triton_ascend`): as for `triton` (a module with @triton.jit kernels
and `def launch(<inputs>, <outputs>)`, AST-checked by `tuner.codecheck`), plus:

* the grid binds to physical cores: launch `CORES` programs (num_vectorcore; `AIC` =
  num_aicore for kernels that use tl.dot) scaled by a core-split tunable, and loop over tiles
  inside the kernel (`for t in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0))`);
* Ascend compile options are keyword arguments of the launch (`multibuffer=True`, `unit_flag=...`;
  see tuner/backends/ascend_source.py: ASCEND_OPTIONS), constants only; `num_warps`/`num_stages` are ignored on A2/A3, so the
  library passes neither;
* a module-level `ASCEND_COST` tuple describes the kernel for the simulator (`sim.py`); the NPU
  ignores it.

Render context: `CORES` (= `AIV`, the vector cores), `AIC` (the cube cores), `UB_BYTES`.
`limits()` gives `ub_bytes` (192 KB per AIV on A2/A3), `l1_bytes`, `l0a/l0b/l0c_bytes` from the
chip profile (tuner/backends/chips) of the device's SoC, so spaces' multibuffer-aware UB formulas keep
configs that cannot fit away from the compiler.

Devices are `npu:N`; one benchmark worker per NPU, pinned with `torch.npu.set_device(N)` (not
ASCEND_RT_VISIBLE_DEVICES, which CANN documents as unsupported together with profiling). Core
counts come from the triton NPU driver's `get_device_properties` (`num_aicore`,
`num_vectorcore`). Timing: `torch.npu.Event` pairs around one call with the L2 flushed first
(a buffer larger than L2 zeroed), as triton's `do_bench` does on the NPU; or, with option
`timer="do_bench_npu"`, triton-ascend's profiler-based device-only time (`do_bench_npu`, which
requires exactly one kernel per call): one profiler session per candidate whose mean is repeated
as that candidate's samples. Compile errors are parsed: `ub overflow, requires N bits while M
bits available` leads the Build's error so feedback groups them (required vs available).

Options: `interpret` (CPU interpreter, CI), `chip` (a chip profile for interpret mode, default
910B2), `timer` ("events" or "do_bench_npu"), `compile_ahead` (default true: compile in the
compile pool by a warm-up launch on meta tensors; false: at the first launch).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from tuner.backends.ascend_source import (bishengir_accepts, check_launch_options, compile_excerpt, core_counts,
                                           strip_options, triton_ascend_version)
from tuner.backends.base import (COMPILER_CRASH_TRIES, BackendUnavailable, CapturedStderr, compiler_crash,
                                 retrying_compiler_crashes,
                                 measured_peaks, meta_args, raise_if_disk_full, with_diagnostics,
                                 without_stack_frames)
from tuner.backends.triton_device import TritonDevice
from tuner.backends.triton_source import compile_only, load_module, use_cache, warm_launch
from tuner.codecheck import Forbidden, require_clean
from tuner.core.values import Build, DeviceInfo, OpSpec, Status

# ---- the backend ---------------------------------------------------------------------------------

class NpuBackend(TritonDevice):
    name = "npu"
    language = "triton_ascend"
    torch_device = "npu"
    verify_on_host = True  # see Backend.verify_on_host
    module_prefix = "tuner_ascend"
    flush_factor = 2
    limit_memory = False  # the NPU runtime reserves large virtual ranges, as CUDA does

    def __init__(self, device: int = 0, **options: Any) -> None:
        super().__init__(device, **options)
        self.timer = options.get("timer", "events")
        if self.timer not in ("events", "do_bench_npu"):
            raise BackendUnavailable(f"npu: timer {self.timer!r}: one of events, do_bench_npu")
        if self.timer == "do_bench_npu" and not self.interpret:
            import importlib.util
            if importlib.util.find_spec("pandas") is None:
                raise BackendUnavailable("npu: timer do_bench_npu reads the profiler's CSV with pandas, "
                                         "which is not installed: pip install pandas (or use the "
                                         "default timer, events)")
        self._props: dict | None = None
        self._profile = None
        self._profile_note = "given" if options.get("chip") else ""
        self._bench_cache: tuple[Any, float] | None = None

    # ---- availability and facts ---------------------------------------------------------

    @classmethod
    def check_available(cls) -> None:
        try:
            import torch
            import torch_npu  # noqa: F401
        except ImportError as e:
            raise BackendUnavailable(
                f"the npu backend needs torch_npu and triton-ascend, which come with a CANN install "
                f"(see README, 'Ascend'): {e}. Without an NPU, try --backend sim") from None
        if not (hasattr(torch, "npu") and torch.npu.is_available()):
            raise BackendUnavailable("no Ascend NPU: torch.npu.is_available() is False (no driver, "
                                     "or ASCEND_RT_VISIBLE_DEVICES hides the devices). Try --backend sim")
        try:
            import triton  # noqa: F401
            import triton.backends.ascend.compiler  # noqa: F401 - the Ascend back end itself
        except ImportError as e:
            if "pybind11" in str(e):
                raise BackendUnavailable(f"triton-ascend is installed but cannot import pybind11, which "
                                         f"its 3.2.0 wheel needs without declaring it: pip install "
                                         f"pybind11 ({e})") from None
            raise BackendUnavailable(f"the npu backend needs triton-ascend, which replaces triton (pip "
                                     f"uninstall triton; pip install triton-ascend): {e}") from None

    def profile(self):
        """The chip profile: the `chip` option's (`--chip`: interpret mode, or an NPU whose
        SoC has no built-in profile), else the one of this device's SoC (chips.profile_for_soc),
        else BackendUnavailable that says what to pass."""
        if self._profile is None:
            from tuner.backends.chips import ChipError, load_profile, profile_for_soc
            try:
                if self.interpret or self.options.get("chip"):
                    self._profile = load_profile(self.options.get("chip") or "910B2")
                else:
                    self._profile, self._profile_note = profile_for_soc(self.soc())
            except ChipError as e:
                raise BackendUnavailable(f"npu: {e}") from None
        return self._profile

    def _properties(self) -> dict:
        if self._props is None:
            if self.interpret:
                p = self.profile()
                self._props = {"num_aicore": p.cube_cores, "num_vectorcore": p.vector_cores}
            else:
                import torch
                import triton.runtime.driver as driver
                self._bind()
                self._props = dict(driver.active.utils.get_device_properties(torch.npu.current_device()))
        return self._props

    def soc(self) -> str:
        if self.interpret:
            return self.profile().soc
        import torch
        return str(torch.npu.get_device_name(self.device))

    def render_context(self, op) -> dict[str, Any]:
        aic, aiv = core_counts(self._properties())
        return {"CORES": aiv, "AIV": aiv, "AIC": aic, "UB_BYTES": self.limits()["ub_bytes"]}

    def limits(self) -> dict[str, float]:
        return self.profile().limits()

    def device_info(self, peaks: bool = True) -> DeviceInfo:
        import torch
        aic, aiv = core_counts(self._properties())
        tools = {"python": platform.python_version(), "torch": torch.__version__,
                 "num_aicore": str(aic), "num_vectorcore": str(aiv), "timer": self.timer,
                 "chip_profile": self.profile().name + (f" ({self._profile_note})" if self._profile_note else "")}
        if self.interpret:
            import triton
            tools.update({"triton": triton.__version__, "soc": self.profile().soc,
                          "mode": "Triton interpreter on the CPU: no NPU, times are host times"})
            return DeviceInfo(backend="npu", name=f"Triton interpreter (CPU), {self.profile().soc} layout",
                              cores=aiv, limits=tuple(sorted(self.limits().items())),
                              toolchain=tuple(sorted(tools.items())), simulated=True)
        import torch_npu
        tools.update({"torch_npu": getattr(torch_npu, "__version__", "?"), "triton_ascend": triton_ascend_version(),
                      "cann": cann_version(), "soc": self.soc()})
        props = torch.npu.get_device_properties(self.device)
        limits = dict(self.limits())
        l2 = getattr(props, "L2_cache_size", 0)
        if l2:
            limits["l2_bytes"] = float(l2)
        peaks = _cached_peaks(f"{self.soc()}|{aiv}|{tools['cann']}|{tools['torch_npu']}",
                              self.options.get("cache_dir"), self) if peaks else {}
        return DeviceInfo(backend="npu", name=self.soc(), cores=aiv, limits=tuple(sorted(limits.items())),
                          peaks=tuple(sorted(peaks.items())), toolchain=tuple(sorted(tools.items())))

    # ---- compile ------------------------------------------------------------------------

    def warm(self, op: OpSpec | None = None) -> None:
        if op is not None:  # the shapes its kernels are compiled for (a failure: the compile says)
            try:
                meta_args(op)
            except Exception:  # noqa: BLE001
                pass

    def compile(self, source: str, op: OpSpec, workdir: str, timeout_s: float) -> Build:
        t0 = time.monotonic()
        try:
            require_clean("triton_ascend", source)
            why = check_launch_options(source)
        except SyntaxError as e:
            return Build(Status.COMPILE_ERROR, error=f"SyntaxError: {e.msg} (line {e.lineno})",
                         compile_s=time.monotonic() - t0)
        except Forbidden as e:
            return Build(Status.COMPILE_ERROR, error=str(e), compile_s=time.monotonic() - t0)
        if why:
            return Build(Status.COMPILE_ERROR, error=why, compile_s=time.monotonic() - t0)
        wd = Path(workdir)
        wd.mkdir(parents=True, exist_ok=True)
        path = wd / "kernel.py"
        digest = hashlib.sha256(source.encode()).hexdigest()[:16]
        if self.interpret:
            path.write_text(strip_options(source))
            (wd / "kernel.ascend.py").write_text(source)  # what an NPU would compile
            return Build(Status.OK, artifact=str(path), compile_s=time.monotonic() - t0, binary_hash=digest)
        path.write_text(source)
        if not self.options.get("compile_ahead", True):
            return Build(Status.OK, artifact=str(path), compile_s=time.monotonic() - t0, binary_hash=digest)
        use_cache(path)
        if bishengir_accepts("--enable-print-memory-allocated-size"):
            # The back end then records metadata["required_ub_bits"]; an older bishengir (CANN
            # 8.3 and before) rejects the flag, and every compile with it.
            os.environ.setdefault("ENABLE_PRINT_UB_BITS", "1")
        captured = CapturedStderr()  # MLIR's and bishengir's diagnostics, of the last attempt

        def once(attempt: int):
            with captured:
                module = load_module(path, f"tuner_ascend_{digest}_{attempt}", "triton_ascend")
                return self._warm(module, op)
        try:
            kernels = retrying_compiler_crashes(once)
        except Exception as e:  # MLIRCompilationError and any other compile failure
            raise_if_disk_full(e, "Triton's compile and cache")  # the disk, not the config
            text = _exc_text(e)
            signal = compiler_crash(text)
            said = (f"the compiler itself crashed ({signal}) {COMPILER_CRASH_TRIES} times in a row: a fault "
                    "in triton-ascend, not a message about the kernel\n") if signal else ""
            return Build(Status.COMPILE_ERROR, error=said + with_diagnostics(
                compile_excerpt(without_stack_frames(text)), captured),
                compile_s=time.monotonic() - t0)
        dt = time.monotonic() - t0
        if not kernels:
            return Build(Status.COMPILE_ERROR, compile_s=dt, error="launch() launched no @triton.jit kernel")
        h = hashlib.sha256()
        meta = []
        for k in kernels:
            asm = getattr(k, "asm", {}) or {}
            for v in asm.values():
                h.update(v if isinstance(v, bytes) else str(v).encode())
            md = getattr(k, "metadata", None)
            ub = md.get("required_ub_bits") if isinstance(md, dict) else getattr(md, "required_ub_bits", None)
            meta.append({"required_ub_bits": ub})
        (wd / "kernel.meta.json").write_text(json.dumps(meta))
        return Build(Status.OK, artifact=str(path), compile_s=dt, binary_hash=h.hexdigest()[:16] or digest)

    def _warm(self, module, op: OpSpec) -> list:
        """Compile-only launches on meta tensors: the bishengir compile happens here, against a
        stand-in driver that names the target SoC and owns no NPU context (a compile worker
        never opens a device), and each kernel's launcher is built here too, into the cache
        the benchmark worker loads it from: not on the timing worker's clock."""
        with _compile_only(self.options.get("soc") or self.soc()):
            kernels = warm_launch(module, *meta_args(op))
            for k in kernels:
                _prebuild_launcher(k)
        return kernels

    def compile_options(self) -> dict[str, Any]:
        # The compile workers compile for the SoC without asking the device (`_compile_only`).
        if self.interpret or self.options.get("soc"):
            return {}
        return {"soc": self.soc()}

    # ---- run (the rest: TritonDevice) ---------------------------------------------------

    def data_device(self):
        return None  # references on the host: float64 on an NPU is slow or missing in CANN's ops

    def _l2_bytes(self) -> int:
        import torch
        return int(getattr(torch.npu.get_device_properties(self.device), "L2_cache_size", 0) or 192 * 2**20)

    def time_calls(self, fn: Callable[[], None], n: int,
                   before: Callable[[], None] | None = None) -> list[float]:
        if self.timer == "do_bench_npu" and not self.interpret:
            # One profiler session calls `fn` back to back: `before` runs once, ahead of it (the
            # outputs are not poisoned between the session's own calls; the history check, which
            # times lone calls on fresh buffers by events, is what stands there).
            if before is not None:
                before()
            return [self._time_profiled(fn) for _ in range(n)]
        return super().time_calls(fn, n, before)

    def _time_profiled(self, fn: Callable[[], None]) -> float:
        """Device-only time from triton-ascend's profiler-based do_bench_npu (one kernel per
        call; L2 cleared before each where the release can). One profiler session per callable:
        its mean is returned for every later call of the same callable, since a session costs
        seconds. The result's unit differs by release (profiler_timer); it is checked against
        an event timing of the same call, and a figure off by orders is refused, not used."""
        if self._bench_cache is not None and self._bench_cache[0] is fn:
            return self._bench_cache[1]
        timer = profiler_timer()
        if timer is None:
            raise BackendUnavailable("npu: timer do_bench_npu: this triton-ascend has no do_bench_npu "
                                     "(neither triton.backends.ascend.testing nor triton.testing)")
        bench, unit_s, clears_l2 = timer
        kw = {"clear_l2_cache": True} if clears_l2 else {}
        value = bench(fn, warmup=5, active=int(self.options.get("active", 30)), **kw)
        if isinstance(value, (list, tuple)):
            value = value[0]
        seconds = float(value) * unit_s
        wall = super().time_calls(fn, 3)
        events = sorted(wall)[1]
        if not (0 < seconds <= 20 * events):
            raise BackendUnavailable(f"npu: do_bench_npu gave {value!r}, read as {seconds:.3g} s, but "
                                     f"the same call takes {events:.3g} s by events: its unit is not "
                                     f"what this triton-ascend's release should return; use timer=events")
        self._bench_cache = (fn, seconds)
        return seconds


def profiler_timer() -> tuple[Callable, float, bool] | None:
    """(triton-ascend's do_bench_npu, seconds per unit of its result, whether it takes
    clear_l2_cache), or None. 3.3 and later: triton.backends.ascend.testing.do_bench_npu,
    milliseconds (the kernels' Duration(us) averaged / 1e3), clear_l2_cache. 3.2.0: in
    triton.testing, the op statistic's Avg Time(us) as it is (microseconds), no clear_l2_cache."""
    import inspect
    try:
        from triton.backends.ascend.testing import do_bench_npu
        unit = 1e-3
    except ImportError:
        try:
            from triton.testing import do_bench_npu
        except ImportError:
            return None
        unit = 1e-6
    try:
        clears = "clear_l2_cache" in inspect.signature(do_bench_npu).parameters
    except (TypeError, ValueError):
        clears = False
    return do_bench_npu, unit, clears


def _compile_only(soc: str):
    return compile_only("npu", soc, 0)  # as triton-ascend's NPUDriver names it


def _prebuild_launcher(kernel) -> None:
    """Build a compiled kernel's launcher (g++, cached by its wrapper's source in Triton's
    cache) now, in the compile worker. Never fatal: the benchmark worker builds it otherwise."""
    try:
        from triton.backends.ascend.driver import NPULauncher
        NPULauncher(kernel.src, kernel.metadata)
    except Exception:  # noqa: BLE001
        pass


def _exc_text(e: BaseException) -> str:
    parts = []
    cur: BaseException | None = e
    while cur is not None and len(parts) < 4:
        parts.append("".join(traceback.format_exception_only(type(cur), cur)))
        cur = cur.__cause__ or cur.__context__
    return "\n".join(parts)


def cann_version() -> str:
    """The CANN version as releases name it ("8.3.RC1", "8.0.0"): torch_npu's
    get_cann_version (CANN 8.1.RC1 and later), else the files a CANN install keeps
    (ASCEND_HOME_PATH, else /usr/local/Ascend/ascend-toolkit/latest): the install info's
    `version=`, or version.cfg's `[internal:public]` pair's public half (its first half is a
    build number, 7.6.0.1.220 for CANN 8.0.0); '?' when none can be read."""
    try:
        from torch_npu.utils import get_cann_version
        v = get_cann_version(module="CANN")
        if v:
            return str(v)
    except Exception:  # noqa: BLE001 - no torch_npu, or one older than the API
        pass
    homes = [os.environ.get(k) for k in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")]
    homes.append("/usr/local/Ascend/ascend-toolkit/latest")
    for home in filter(None, homes):
        root = Path(home)
        for f in [*root.glob("*-linux/ascend_toolkit_install.info"), root / "version.cfg",
                  root / "compiler" / "version.info"]:
            try:
                text = f.read_text()
            except OSError:
                continue
            v = parse_cann_version(text)
            if v:
                return v
    return "?"


def parse_cann_version(text: str) -> str:
    """The public CANN version in a version file's text, or ''."""
    m = re.search(r"^\s*(?:toolkit_installed_version|toolkit_running_version|version)\s*=\s*"
                  r"\[?([\w.\-]+)(?::([\w.\-]+))?\]?", text, re.I | re.M)
    if not m:
        return ""
    return m.group(2) or m.group(1)


def _cached_peaks(key: str, cache_dir: str | None, backend: NpuBackend) -> dict[str, float]:
    """Copy bandwidth and fp16 matmul rate of this NPU (see measured_peaks)."""
    return measured_peaks("npu_peaks.json", key, cache_dir, lambda: measure_peaks(backend))


def measure_peaks(backend: NpuBackend) -> dict[str, float]:
    """Device copy bandwidth (bytes read + written per second) and the fp16 matmul rate of
    torch_npu, timed like candidates (events, L2 flushed), median of several."""
    import statistics

    import torch
    dev = f"npu:{backend.device}"
    n = 2**28  # 512 MiB of fp16 per buffer
    src = torch.ones(n, device=dev, dtype=torch.float16)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t = statistics.median(backend.time_call(lambda: dst.copy_(src)) for _ in range(10))
    copy_gbps = 2 * n * 2 / t / 1e9
    src = dst = None
    s = 8192
    a = torch.randn(s, s, device=dev, dtype=torch.float16)
    b = torch.randn(s, s, device=dev, dtype=torch.float16)
    for _ in range(3):
        a @ b
    t = statistics.median(backend.time_call(lambda: a @ b) for _ in range(10))
    return {"copy_gbps": round(copy_gbps, 1), "fp16_gflops": round(2 * s**3 / t / 1e9, 1)}

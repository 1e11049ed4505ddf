"""The `npu` backend: triton-ascend kernels on Huawei Ascend NPUs through torch_npu.

Written against the documented APIs of triton-ascend 3.2 (Triton 3.2 based), torch_npu 2.7 and
CANN 8.5; **it has never run on an NPU** (see README, "Ascend"). What runs without one is the
part that does not need the device, and it is tested: the compile-option table and its checks,
the UB-overflow error parser, grid and core planning, and every triton_ascend skeleton through
Triton's interpreter on CPU tensors (`interpret=True`: options stripped, since the upstream
interpreter knows none of them).

Skeleton contract (language `triton_ascend`): as for `triton` (a module with @triton.jit kernels
and `def launch(<inputs>, <outputs>)`, AST-checked by `tuner.codecheck`), plus:

* the grid binds to physical cores: launch `CORES` programs (num_vectorcore; `AIC` =
  num_aicore for kernels that use tl.dot) scaled by a core-split tunable, and loop over tiles
  inside the kernel (`for t in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0))`);
* Ascend compile options are keyword arguments of the launch (`multibuffer=True`, `unit_flag=...`;
  see ASCEND_OPTIONS), constants only; `num_warps`/`num_stages` are ignored on A2/A3, so the
  library passes neither;
* a module-level `ASCEND_COST` tuple describes the kernel for the simulator (`sim.py`); the NPU
  ignores it.

Render context: `CORES` (= `AIV`, the vector cores), `AIC` (the cube cores), `UB_BYTES`.
`limits()` gives `ub_bytes` (192 KB per AIV on A2/A3), `l1_bytes`, `l0a/l0b/l0c_bytes` from the
chip profile (tuner/chips) of the device's SoC, so spaces' multibuffer-aware UB formulas keep
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

import ast
import hashlib
import json
import os
import platform
import re
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tuner.backends.base import (BackendUnavailable, CapturedStderr, measured_peaks, meta_args, raise_if_disk_full,
                                 with_diagnostics)
from tuner.backends.triton_device import TritonDevice
from tuner.backends.triton_source import load_module, use_cache, warm_launch
from tuner.codecheck import Forbidden, require_clean
from tuner.core.values import Build, DeviceInfo, OpSpec, Status

# ---- Ascend compile options ------------------------------------------------------------------

@dataclass(frozen=True)
class AscendOption:
    """One triton-ascend compile option (NPUOptions): the values it takes, the bishengir flag
    it becomes (as documented; None where the docs give no flag name), and whether it only
    means something for mixed cube/vector kernels."""

    name: str
    kind: str  # "bool" | "int" | "str"
    flags: tuple[str, ...] = ()
    choices: tuple[Any, ...] = ()
    cv_only: bool = False
    doc: str = ""


def _opt(name, kind, flags=(), choices=(), cv_only=False, doc=""):
    return name, AscendOption(name, kind, tuple(flags), tuple(choices), cv_only, doc)


ASCEND_OPTIONS: dict[str, AscendOption] = dict([
    _opt("multibuffer", "bool", ["--enable-auto-multi-buffer"],
         doc="ping-pong (double) buffering of loop loads/stores; halves the usable UB. Default True on A2/A3"),
    _opt("enable_ubuf_saving", "bool", ["--enable-ubuf-saving"]),
    _opt("enable_auto_bind_sub_block", "bool", ["--enable-auto-bind-sub-block"], cv_only=True,
         doc="bind a CV kernel's vector tiles to the 2 AIV sub-blocks of each AIC (default on)"),
    _opt("enable_hivm_auto_cv_balance", "bool", ["--enable-hivm-auto-cv-balance"], cv_only=True),
    _opt("sync_solver", "bool", ["--enable-hivm-graph-sync-solver", "--enable-hivm-cross-core-gss"],
         cv_only=True, doc="graph sync solver for cube<->vector synchronisation"),
    _opt("unit_flag", "bool", ["--enable-hivm-unit-flag-sync"], cv_only=True,
         doc="fine-grained L0C->GM sync with mmad ('cube-out')"),
    _opt("inject_barrier_all", "bool", ["--enable-hivm-inject-barrier-all-sync"]),
    _opt("inject_block_all", "bool", ["--enable-hivm-inject-block-all-sync"]),
    _opt("limit_auto_multi_buffer_only_for_local_buffer", "bool", cv_only=True),
    _opt("limit_auto_multi_buffer_of_local_buffer", "str", choices=("no-limit", "no-l0c"), cv_only=True),
    _opt("set_workspace_multibuffer", "int", choices=(2, 4), cv_only=True),
    _opt("tile_mix_vector_loop", "int", choices=(2, 4, 8), cv_only=True,
         doc="segments the vector part of a CV kernel is split into"),
    _opt("tile_mix_cube_loop", "int", choices=(2, 4, 8), cv_only=True,
         doc="segments the cube part of a CV kernel is split into"),
    _opt("auto_blockify_size", "int", doc="only with TRITON_ALL_BLOCKS_PARALLEL"),
    _opt("disable_auto_inject_block_sync", "bool", doc="deprecated on triton-ascend main"),
    _opt("enable_drop_unit_dims", "bool"), _opt("enable_flatten", "bool"),
    _opt("enable_auto_vectorize_v2", "bool"), _opt("disable_size_align_for_cast", "bool"),
    _opt("enable_nd2nz_on_vector", "bool"), _opt("enable_linearize", "bool"),
    _opt("compile_mode", "str", choices=("simd", "unstructured_in_simt", "simt_only")),
])
# Launch options every Triton accepts; on A2/A3 triton-ascend ignores num_warps/num_stages.
GENERIC_LAUNCH_OPTIONS = {"num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion",
                          "debug", "stream", "warmup", "grid"}
MULTIBUFFER_DEFAULT = True  # triton-ascend's default on A2/A3 (False on 910_95)


def check_option(name: str, value: Any) -> str | None:
    """Why `name=value` is not a valid triton-ascend compile option, or None."""
    opt = ASCEND_OPTIONS.get(name)
    if opt is None:
        return f"unknown NPU compile option {name!r}"
    if value is None:
        return None  # left to the compiler's default; not forwarded
    if opt.kind == "bool" and not isinstance(value, bool):
        return f"{name} takes True or False, not {value!r}"
    if opt.kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        return f"{name} takes an integer, not {value!r}"
    if opt.kind == "str" and not isinstance(value, str):
        return f"{name} takes a string, not {value!r}"
    if opt.choices and value not in opt.choices:
        return f"{name}={value!r}: one of {list(opt.choices)}"
    return None


def bishengir_flags(options: dict[str, Any]) -> list[str]:
    """The bishengir-compile flags that triton-ascend derives from these options (as its
    compiler.py documents them); options whose flag the docs do not name are left out."""
    out = []
    for name, value in sorted(options.items()):
        opt = ASCEND_OPTIONS.get(name)
        if opt is None or value is None or not opt.flags:
            continue
        v = str(value).lower() if isinstance(value, bool) else str(value)
        out.extend(f"{flag}={v}" for flag in opt.flags)
    return out


# ---- reading a rendered module ----------------------------------------------------------------

@dataclass(frozen=True)
class Launch:
    """One `kernel[grid](...)` call in a module's `launch`: the kernel, the grid expression
    (and its value when it is a literal), and the constant keyword arguments."""

    kernel: str
    grid_text: str
    grid: tuple[int, ...] | None
    kwargs: tuple[tuple[str, Any], ...]

    @property
    def ascend_options(self) -> dict[str, Any]:
        return {k: v for k, v in self.kwargs if k in ASCEND_OPTIONS}


def _jit_params(tree: ast.Module) -> dict[str, set[str]]:
    """The module's @triton.jit functions and their parameter names."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any(
                ast.unparse(d.func if isinstance(d, ast.Call) else d) in ("triton.jit", "jit")
                for d in node.decorator_list):
            a = node.args
            out[node.name] = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
    return out


def launches(source: str) -> list[Launch]:
    """Every kernel launch of a module, read from its AST (nothing runs)."""
    tree = ast.parse(source)
    kernels = _jit_params(tree)
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
                and isinstance(node.func.value, ast.Name) and node.func.value.id in kernels):
            kw = []
            for k in node.keywords:
                try:
                    kw.append((k.arg, ast.literal_eval(k.value)))
                except ValueError:
                    kw.append((k.arg, ast.unparse(k.value)))  # not a constant: kept as text
            try:
                grid = ast.literal_eval(node.func.slice)
                grid = tuple(int(g) for g in (grid if isinstance(grid, tuple) else (grid,)))
            except (ValueError, TypeError):
                grid = None
            out.append(Launch(node.func.value.id, ast.unparse(node.func.slice), grid, tuple(kw)))
    return out


def check_launch_options(source: str) -> str | None:
    """Why the module's launches pass options triton-ascend would reject (its `parse_options`
    raises KeyError on an unknown key), or None. A keyword that is neither a parameter of the
    kernel, a generic launch option, nor an Ascend option is unknown."""
    tree = ast.parse(source)
    params = _jit_params(tree)
    for la in launches(source):
        for k, v in la.kwargs:
            if k in params.get(la.kernel, set()) or k in GENERIC_LAUNCH_OPTIONS:
                continue
            if k not in ASCEND_OPTIONS:
                return (f"KeyError: {k!r}: {la.kernel}[...] got a keyword that is neither a kernel "
                        f"parameter nor an NPU compile option (known: {', '.join(sorted(ASCEND_OPTIONS))})")
            if isinstance(v, str) and ASCEND_OPTIONS[k].kind != "str":
                return f"{la.kernel}[...]: compile option {k} must be a constant, got {v!r}"
            why = check_option(k, v)
            if why:
                return f"{la.kernel}[...]: {why}"
    return None


class _StripOptions(ast.NodeTransformer):
    def __init__(self, kernels: set[str]):
        self.kernels = kernels

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if (isinstance(node.func, ast.Subscript) and isinstance(node.func.value, ast.Name)
                and node.func.value.id in self.kernels):
            node.keywords = [k for k in node.keywords if k.arg not in ASCEND_OPTIONS]
        return node


def strip_options(source: str) -> str:
    """The module with every Ascend compile option removed from its kernel launches, for
    Triton's upstream interpreter (which knows none of them)."""
    tree = ast.parse(source)
    tree = _StripOptions(set(_jit_params(tree))).visit(tree)
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def read_cost(source: str) -> dict[str, Any] | None:
    """The module-level `ASCEND_COST = ((name, value), ...)` description, or None if absent.
    Raises ValueError if it is present but not a tuple of (name, literal) pairs."""
    tree = ast.parse(source)
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "ASCEND_COST"):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                raise ValueError(f"ASCEND_COST (line {node.lineno}) must be a literal: numbers, strings "
                                 f"and tuples, no names or arithmetic (render them in the template)") from None
            if not isinstance(value, tuple) or not all(
                    isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) for p in value):
                raise ValueError("ASCEND_COST must be a tuple of (name, value) pairs")
            return dict(value)
    return None


# ---- compile errors ----------------------------------------------------------------------------

UB_OVERFLOW = re.compile(r"ub overflow, requires (\d+) bits while (\d+) bits available", re.I)


@dataclass(frozen=True)
class UBOverflow:
    required_bits: int
    available_bits: int

    @property
    def required_bytes(self) -> float:
        return self.required_bits / 8

    @property
    def available_bytes(self) -> float:
        return self.available_bits / 8

    def summary(self) -> str:
        """The error's first line as the tuner records it: the compiler's own words, then bytes."""
        return (f"ub overflow, requires {self.required_bits} bits while {self.available_bits} bits "
                f"available ({self.required_bytes:g} bytes needed, {self.available_bytes:g} bytes of UB)")


def parse_ub_overflow(text: str) -> UBOverflow | None:
    """The bishengir 'ub overflow' error in a compile log (e.g. an MLIRCompilationError)."""
    m = UB_OVERFLOW.search(text or "")
    return UBOverflow(int(m.group(1)), int(m.group(2))) if m else None


def compile_excerpt(text: str, limit: int = 2000) -> str:
    """A compile failure as a Build keeps it: a UB overflow leads with its figures (so feedback
    groups them, required vs available); otherwise the first error lines."""
    ub = parse_ub_overflow(text)
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    errs = [ln.strip() for ln in lines if "error" in ln.lower()]
    head = ub.summary() if ub else (errs[0] if errs else (lines[0] if lines else "compile error"))
    rest = [ln for ln in (errs or lines) if ln.strip() != head][:12]
    return "\n".join([head, *rest])[:limit]


# ---- cores and grids ---------------------------------------------------------------------------

def core_counts(props: dict[str, Any]) -> tuple[int, int]:
    """(num_aicore, num_vectorcore) from the triton NPU driver's device properties. triton-ascend
    computes num_vectorcore as 2 x num_aicore; an older driver without it gets the same."""
    try:
        aic = int(props["num_aicore"])
    except (KeyError, TypeError, ValueError):
        raise BackendUnavailable(f"the triton NPU driver's device properties have no num_aicore "
                                 f"({sorted(props) if isinstance(props, dict) else props!r}): is "
                                 f"triton-ascend (not upstream triton) installed?") from None
    aiv = int(props.get("num_vectorcore") or 2 * aic)
    return aic, aiv


@dataclass(frozen=True)
class GridPlan:
    programs: int  # the grid (1-D; triton-ascend flattens any grid)
    waves: int  # rounds of programs per core
    idle_cores: int
    tiles_per_program: int  # on the busiest program


MAX_BLOCKS = 65535  # coreDim is a uint16 without TRITON_ALL_BLOCKS_PARALLEL


def plan_grid(tiles: int, cores: int, programs_per_core: float) -> GridPlan:
    """Programs to launch for `tiles` work items on `cores` physical cores when the core split
    asks for `programs_per_core` (0.5: half the cores; 2: two rounds). Never more programs than
    tiles, never fewer than one. Templates compute the same in Jinja:
    `[tiles, [1, (PROGS_PER_CORE * CORES) | int] | max] | min`."""
    programs = min(tiles, max(1, int(programs_per_core * cores)), MAX_BLOCKS)
    programs = max(1, programs)
    return GridPlan(programs, -(-programs // cores), max(0, cores - programs), -(-tiles // programs))


# ---- the backend ---------------------------------------------------------------------------------

class NpuBackend(TritonDevice):
    name = "npu"
    language = "triton_ascend"
    torch_device = "npu"
    module_prefix = "tuner_ascend"
    flush_factor = 2
    limit_memory = False  # the NPU runtime reserves large virtual ranges, as CUDA does

    def __init__(self, device: int = 0, **options: Any) -> None:
        super().__init__(device, **options)
        self.timer = options.get("timer", "events")
        if self.timer not in ("events", "do_bench_npu"):
            raise BackendUnavailable(f"npu: timer {self.timer!r}: one of events, do_bench_npu")
        self._props: dict | None = None
        self._profile = None
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
            from triton.backends.ascend.testing import do_bench_npu  # noqa: F401
        except ImportError as e:
            raise BackendUnavailable(f"the npu backend needs triton-ascend (pip uninstall triton; "
                                     f"pip install triton-ascend): {e}") from None

    def profile(self):
        """The chip profile of this device's SoC (interpret mode: the `chip` option)."""
        if self._profile is None:
            from tuner.backends.chips import ChipError, load_profile
            if self.interpret or self.options.get("chip"):
                self._profile = load_profile(self.options.get("chip") or "910B2")
            else:
                try:
                    self._profile = load_profile(self.soc())
                except ChipError:
                    self._profile = load_profile("910B2")  # A2/A3 limits: UB 192 KB, L1 512 KB
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
                 "chip_profile": self.profile().name}
        if self.interpret:
            import triton
            tools.update({"triton": triton.__version__, "soc": self.profile().soc,
                          "mode": "Triton interpreter on the CPU: no NPU, times are host times"})
            return DeviceInfo(backend="npu", name=f"Triton interpreter (CPU), {self.profile().soc} layout",
                              cores=aiv, limits=tuple(sorted(self.limits().items())),
                              toolchain=tuple(sorted(tools.items())), simulated=True)
        import torch_npu
        tools.update({"torch_npu": getattr(torch_npu, "__version__", "?"), "triton_ascend": _triton_ascend_version(),
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
        os.environ.setdefault("ENABLE_PRINT_UB_BITS", "1")  # the backend records metadata["required_ub_bits"]
        try:
            with CapturedStderr() as captured:  # MLIR's and bishengir's diagnostics
                module = load_module(path, f"tuner_ascend_{digest}", "triton_ascend")
                kernels = self._warm(module, op)
        except Exception as e:  # MLIRCompilationError and any other compile failure
            raise_if_disk_full(e, "Triton's compile and cache")  # the disk, not the config
            return Build(Status.COMPILE_ERROR, error=with_diagnostics(compile_excerpt(_exc_text(e)), captured),
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
        """Compile-only launches on meta tensors: the bishengir compile happens here."""
        return warm_launch(module, *meta_args(op))

    # ---- run (the rest: TritonDevice) ---------------------------------------------------

    def data_device(self):
        return None  # references on the host: float64 on an NPU is slow or missing in CANN's ops

    def _l2_bytes(self) -> int:
        import torch
        return int(getattr(torch.npu.get_device_properties(self.device), "L2_cache_size", 0) or 192 * 2**20)

    def time_calls(self, fn: Callable[[], None], n: int) -> list[float]:
        if self.timer == "do_bench_npu" and not self.interpret:
            return [self._time_profiled(fn) for _ in range(n)]
        return super().time_calls(fn, n)

    def _time_profiled(self, fn: Callable[[], None]) -> float:
        """Device-only time from triton-ascend's profiler-based do_bench_npu (one kernel per
        call; L2 cleared before each). One profiler session per callable: its mean is returned
        for every later call of the same callable, since a session costs seconds."""
        if self._bench_cache is not None and self._bench_cache[0] is fn:
            return self._bench_cache[1]
        from triton.backends.ascend.testing import do_bench_npu
        ms = do_bench_npu(fn, warmup=5, active=int(self.options.get("active", 30)), clear_l2_cache=True)
        if isinstance(ms, (list, tuple)):
            ms = ms[0]
        seconds = float(ms) * 1e-3
        self._bench_cache = (fn, seconds)
        return seconds




def _exc_text(e: BaseException) -> str:
    parts = []
    cur: BaseException | None = e
    while cur is not None and len(parts) < 4:
        parts.append("".join(traceback.format_exception_only(type(cur), cur)))
        cur = cur.__cause__ or cur.__context__
    return "\n".join(parts)


def _triton_ascend_version() -> str:
    from importlib import metadata
    for dist in ("triton-ascend", "triton_ascend"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    try:
        import triton
        return f"triton {triton.__version__}"
    except ImportError:
        return "?"


def cann_version() -> str:
    """The CANN toolkit version, from the files a CANN install keeps (ASCEND_HOME_PATH, else the
    default /usr/local/Ascend/ascend-toolkit/latest); '?' when none can be read."""
    homes = [os.environ.get(k) for k in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")]
    homes.append("/usr/local/Ascend/ascend-toolkit/latest")
    for home in filter(None, homes):
        root = Path(home)
        candidates = [root / "version.cfg", root / "compiler" / "version.info",
                      *root.glob("*-linux/ascend_toolkit_install.info")]
        for f in candidates:
            try:
                text = f.read_text()
            except OSError:
                continue
            m = re.search(r"^\s*(?:toolkit_installed_version|version)\s*=\s*\[?([\w.\-]+)", text, re.I | re.M)
            if m:
                return m.group(1)
    return "?"


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

"""What a triton_ascend module is and says, read without a device (the `npu` backend compiles
and runs it; the `sim` backend models it): the Ascend compile options a launch may pass per
triton-ascend release (ASCEND_OPTIONS, `check_option`, `accepted_options`), the launches a
rendered module makes and their options (`launches`, `check_launch_options`, `strip_options`
for Triton's interpreter), its declared `ASCEND_COST` (`read_cost`, for the simulator), the
compiler's UB-overflow error (`parse_ub_overflow`), and how a grid binds to the physical cores
(`core_counts`, `plan_grid`). Tested on this machine without CANN; see the npu backend's
docstring for the skeleton contract.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from typing import Any

from tuner.backends.base import BackendUnavailable

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
# (`maxnreg` is not one: no triton-ascend release has it in NPUOptions, and a launch that
# passes it fails with "Keyword argument maxnreg was specified but unrecognised".)
GENERIC_LAUNCH_OPTIONS = {"num_warps", "num_stages", "num_ctas", "enable_fp_fusion",
                          "debug", "stream", "warmup", "grid"}

# The NPUOptions fields each triton-ascend release accepts as launch keywords (any other
# keyword is a KeyError "... specified but unrecognised" at the launch), read from the
# sources: the 3.2.0 wheel on PyPI (the only release there), and the release/3.3.x ...
# release/3.6.x branches and main of the repository (December 2026). Where triton-ascend is
# installed, its own NPUOptions decides instead (`accepted_options`).
_COMMON = {"multibuffer", "enable_auto_bind_sub_block", "enable_hivm_auto_cv_balance", "sync_solver",
           "unit_flag", "inject_barrier_all", "inject_block_all",
           "limit_auto_multi_buffer_only_for_local_buffer", "limit_auto_multi_buffer_of_local_buffer",
           "set_workspace_multibuffer", "tile_mix_vector_loop", "tile_mix_cube_loop",
           "disable_auto_inject_block_sync", "enable_nd2nz_on_vector", "compile_mode"}
RELEASE_OPTIONS: dict[str, frozenset[str]] = {
    "3.2.0": frozenset(_COMMON | {"enable_linearize"}),
    "3.3": frozenset(_COMMON),  # also 3.4 and 3.6: enable_linearize gone
    "3.5": frozenset(_COMMON | {"enable_ubuf_saving", "auto_blockify_size", "enable_drop_unit_dims",
                                "enable_flatten", "enable_auto_vectorize_v2", "disable_size_align_for_cast"}),
}
RELEASE_OPTIONS["main"] = RELEASE_OPTIONS["3.5"]
DEFAULT_RELEASE = "3.2.0"  # what `pip install triton-ascend` gives


def release_key(version: str) -> str:
    """The RELEASE_OPTIONS key for a triton-ascend version string ("3.2.0", "3.4.1+git...")."""
    m = re.match(r"(\d+)\.(\d+)", version or "")
    if not m:
        return DEFAULT_RELEASE
    major, minor = int(m.group(1)), int(m.group(2))
    if (major, minor) <= (3, 2):
        return "3.2.0"
    return "3.5" if (major, minor) == (3, 5) or (major, minor) > (3, 6) else "3.3"


def accepted_options(release: str | None = None) -> frozenset[str]:
    """The Ascend compile options a launch may pass: the installed triton-ascend's NPUOptions
    fields that this table knows, else the table's for `release` (default: the installed
    version, else DEFAULT_RELEASE)."""
    if release is None:
        installed = _installed_npu_options()
        if installed is not None:
            return frozenset(n for n in ASCEND_OPTIONS if n in installed)
        release = DEFAULT_RELEASE
    return RELEASE_OPTIONS.get(release_key(release) if release not in RELEASE_OPTIONS else release,
                               RELEASE_OPTIONS[DEFAULT_RELEASE])


def _installed_npu_options() -> frozenset[str] | None:
    """The installed triton-ascend's NPUOptions field names, or None without triton-ascend."""
    import dataclasses
    import importlib.util
    try:
        if importlib.util.find_spec("triton.backends.ascend") is None:
            return None
        from triton.backends.ascend.compiler import NPUOptions
    except Exception:  # noqa: BLE001 - no triton, another triton, a broken install: the table decides
        return None
    return frozenset(f.name for f in dataclasses.fields(NPUOptions))
MULTIBUFFER_DEFAULT = True  # triton-ascend's default on A2/A3 (False on 910_95)


def check_option(name: str, value: Any, release: str | None = None) -> str | None:
    """Why `name=value` is not a valid triton-ascend compile option (for `release`, default the
    installed triton-ascend, else DEFAULT_RELEASE), or None."""
    opt = ASCEND_OPTIONS.get(name)
    if opt is None:
        return f"unknown NPU compile option {name!r}"
    accepted = accepted_options(release)
    if name not in accepted:
        which = release or _triton_ascend_version_or(DEFAULT_RELEASE)
        return (f"NPU compile option {name!r} is not accepted by triton-ascend {which} (a launch with "
                f"it fails: 'Keyword argument {name} was specified but unrecognised'); it accepts "
                f"{', '.join(sorted(accepted))}")
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


def check_launch_options(source: str, release: str | None = None) -> str | None:
    """Why the module's launches pass options triton-ascend would reject (its `parse_options`
    raises KeyError on an unknown key), or None. A keyword that is neither a parameter of the
    kernel, a generic launch option, nor an Ascend option that `release` accepts (see
    check_option) is unknown."""
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
            why = check_option(k, v, release)
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


@functools.lru_cache(maxsize=None)
def bishengir_accepts(flag: str) -> bool:
    """Whether the installed bishengir-compile lists `flag` in its --help (False without one)."""
    import shutil
    import subprocess
    exe = shutil.which("bishengir-compile")
    if exe is None:
        return False
    try:
        out = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return flag in (out.stdout + out.stderr)


def _triton_ascend_version_or(default: str) -> str:
    v = triton_ascend_version()
    return default if v.startswith(("triton ", "?")) else v


def triton_ascend_version() -> str:
    """The installed triton-ascend's version, else 'triton X' (upstream Triton) or '?'."""
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

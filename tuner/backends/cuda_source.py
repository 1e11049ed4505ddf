"""CUDA C++ device code for the cuda backend's `cuda` language: checked, compiled to a cubin,
described for the launcher (`tuner.cuda`).

One compiled unit is a (source, options) pair from a launch module's `cuda.launch` calls. Its
checks, all before anything of it runs:

* the source (`check_source`): `#include` only of CUDA's own device headers and a few C
  headers, by name in angle brackets (a quoted or computed include could read any file into a
  compile error);
* the options (`check_options`): only code-generation flags from `OPTIONS` (an output path, a
  host compiler or a preprocessor include passed as an "option" would reach outside);
* the PTX, by meaning whatever the source looked like (`check_ptx`; the backend reads Triton
  kernels' PTX with it too): no call of a function the PTX does not define, however it is
  declared, and no indirect call (device printf is `vprintf`, device malloc is `malloc`:
  nothing is linked to a kernel), and no writable `.global` variables, whether
  declared at namespace scope or in inline PTX inside a kernel (state kept from one launch to
  the next: a kernel could return a result it stored during an earlier call instead of
  computing it);
* each launch against what was compiled (`check_launches`): the kernel exists, its arguments
  fit its parameters, the block and grid fit the device, the shared memory (static + dynamic)
  and the registers (per thread x threads) fit an SM. Each is a COMPILE_ERROR with a reason.

Compilers: NVRTC (libnvrtc, which CUDA builds of torch install) when found, else `nvcc` (the
CUDA toolkit: PATH, CUDA_HOME); `TUNER_CUDA_COMPILER=nvcc|nvrtc` picks one. Host code in a
source is never compiled into anything that runs: only the device code becomes a cubin.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tuner.codecheck.findings import Finding

HEADERS = {"cuda_bf16.h", "cuda_fp16.h", "cuda_fp8.h", "cuda_runtime.h", "cuda.h", "mma.h",
           "cuda_pipeline.h", "cuda_pipeline_primitives.h", "cuda_awbarrier.h", "cuda_awbarrier_primitives.h",
           "cooperative_groups.h", "stdint.h", "cstdint", "math.h", "cmath", "float.h", "cfloat",
           "limits.h", "climits", "stddef.h", "cstddef", "assert.h", "type_traits"}
HEADER_PREFIXES = ("cuda/", "cub/", "cooperative_groups/")

# Compile options a unit may ask for, as patterns of the whole option.
OPTIONS = (r"-maxrregcount=\d{1,3}", r"--?use_fast_math", r"--ftz=(true|false)", r"--prec-div=(true|false)",
           r"--prec-sqrt=(true|false)", r"--fmad=(true|false)", r"-O[0-3]", r"-lineinfo",
           r"--extra-device-vectorization", r"-std=c\+\+(17|20)", r"-D[A-Za-z_]\w*(=[\w.+-]{0,64})?",
           r"--restrict")
_OPTIONS = re.compile("|".join(f"(?:{p})" for p in OPTIONS))
# assert(): a trap with a message, no host round trip (its message strings are writable
# variables all the same: `check_ptx` refuses them, and says -DNDEBUG compiles the asserts out).
ALLOWED_EXTERNS = {"__assertfail"}

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


class CudaCompileError(RuntimeError):
    """The unit does not compile or breaks a check; the message says why (a COMPILE_ERROR)."""


def check_source(source: str) -> list[Finding]:
    """What is wrong with a unit's CUDA C++ source before it is compiled."""
    out: list[Finding] = []
    original = source.splitlines()
    # Comments out (newlines kept), then backslash-continued lines joined as the preprocessor
    # joins them: `#incl\<newline>ude` is an include. Each logical line keeps its first line.
    stripped = _COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), source)
    logical, line_no = [], 1
    for chunk in re.split(r"(?<!\\)\n", stripped):
        logical.append((line_no, chunk.replace("\\\n", "")))
        line_no += chunk.count("\n") + 1
    for n, ln in logical:
        s = ln.strip()
        # Probes of the compiling machine's files (whose answers would reach the compile error).
        if re.search(r"__has_include|_Pragma", s):
            out.append(Finding(n, original[n - 1] if n <= len(original) else "",
                               "__has_include and _Pragma are not allowed: a kernel asks nothing of "
                               "the machine's files (write #pragma for a pragma)"))
        if not s.startswith(("#", "%:")):  # `%:` is the digraph of `#`
            continue
        directive = s[2:].strip() if s.startswith("%:") else s[1:].strip()
        if re.match(r"pragma\s+(GCC\s+)?dependency\b", directive):
            out.append(Finding(n, original[n - 1] if n <= len(original) else "",
                               "#pragma dependency reads another file; a kernel reads no files"))
        if directive.startswith(("include", "import", "include_next", "embed")):
            m = re.match(r"(include|include_next)\s*<([\w./-]+)>\s*$", directive)
            text = original[n - 1] if n <= len(original) else ""
            if not m or m.group(1) != "include":
                out.append(Finding(n, text, "#include of a header by name in angle brackets only "
                                            "(no quoted, computed or include_next includes)"))
            elif ".." in m.group(2) or m.group(2).startswith("/") or not (
                    m.group(2) in HEADERS or m.group(2).startswith(HEADER_PREFIXES)):
                out.append(Finding(n, text, f"#include <{m.group(2)}>: only CUDA's device headers "
                                            f"({', '.join(sorted(HEADERS))}, and cuda/, cub/, "
                                            f"cooperative_groups/) may be included"))
    if not re.search(r"__global__", stripped):
        out.append(Finding(0, "", "the source defines no __global__ function"))
    return out


def check_options(options: tuple[str, ...]) -> str | None:
    """Why `options` may not be passed to the compiler, or None."""
    for o in options:
        if not isinstance(o, str) or not _OPTIONS.fullmatch(o):
            return (f"compile option {o!r} is not allowed; allowed (whole option): "
                    + ", ".join(p.replace("\\", "") for p in OPTIONS))
    return None


# ---- PTX: what the unit's kernels take, and what they may not do ---------------------------

_ENTRY = re.compile(r"\.entry\s+([\w$]+)\s*\(([^)]*)\)", re.S)
_PARAM = re.compile(r"\.param\s+(?:\.align\s+(\d+)\s+)?\.(\w+)([^,]*)")
# A function's header: `.func [(<returns>)] name [(<params>)] [.noreturn ...]`, then its body
# `{` or `;` (a declaration only: defined elsewhere, whatever its linkage says: ptxas takes
# `.func`, `.weak .func` and `.extern .func` prototypes alike, also inside a kernel's body).
_FUNC = re.compile(r"(?<![\w$.])\.func\s*(?:\([^)]*\)\s*)?([\w$]+)\s*(?:\([^)]*\))?"
                   r"(?:\s*\.\w+(?:\s*\([^)]*\))?)*\s*([{;])")
_CALL = re.compile(r"(?<![\w$.])call(?:\.uni)?\s*(?:\([^)]*\)\s*,\s*)?([%\w$]+)")
# `.global` as a state space of its own (a variable's declaration), not a suffix of an instruction
# (`st.global.u32`) nor a pointer parameter's attribute (`.ptr .global`): wherever it stands, a
# line of its own or inside an inline-asm block, `{ .global .u32 s; st.global.u32 [s], 1; }`,
# which ptxas accepts in a function's body, and with its type run on (`.global.u32 s;`).
_GLOBAL_DECL = re.compile(r"(?<![\w$.])\.global(?=[\s.])")
_PTX_NAME = re.compile(r"(?<![\w$.%])[A-Za-z_$][\w$]*")
_PREDICATE = re.compile(r"^@!?%?[\w$]+\s+")


def _global_variables(ptx: str) -> tuple[list[str], set[str], str]:
    """The `.global` variables the PTX declares; those whose address an initializer takes
    (`.global .u64 p = kept;`); and the PTX with the declarations blanked (comments too), so
    that what is left names a variable only where an instruction uses it. A declaration may
    name several (`.global .u32 a = 1, b;`)."""
    text = _COMMENT.sub(lambda m: " " * len(m.group(0)), ptx)
    names, taken, spans = [], set(), []
    for m in _GLOBAL_DECL.finditer(text):
        if re.search(r"\.ptr\s*$", text[:m.start()]):
            continue  # `.param .u64 .ptr .global ...`: where a pointer parameter points
        end = text.find(";", m.end())
        end = len(text) if end < 0 else end + 1
        for part in _top_level(text[m.end():end].rstrip(";"), ","):
            declarator, _, init = part.partition("=")
            name = _PTX_NAME.search(declarator)
            if name:
                names.append(name.group(0))
            taken.update(_PTX_NAME.findall(init))
        spans.append((m.start(), end))
    for a, b in reversed(spans):
        text = text[:a] + " " * (b - a) + text[b:]
    return list(dict.fromkeys(names)), taken, text


def _top_level(text: str, sep: str) -> list[str]:
    """`text` split at each `sep` outside brackets and braces."""
    parts, depth, last = [], 0, 0
    for i, c in enumerate(text):
        depth += (c in "([{") - (c in ")]}")
        if c == sep and depth == 0:
            parts.append(text[last:i])
            last = i + 1
    return parts + [text[last:]]


def ptx_entries(ptx: str) -> dict[str, list[str]]:
    """Each `.entry` of the PTX and its parameters' types (`u64`, `f32`, ...; an array or
    struct passed by value as `b8[<bytes>]@<alignment>`, e.g. a tensor map's `b8[128]@64`)."""
    out: dict[str, list[str]] = {}
    for m in _ENTRY.finditer(ptx):
        params = []
        for p in m.group(2).split(","):
            pm = _PARAM.search(p)
            if pm:
                n = re.search(r"\[(\d*)\]", pm.group(3))
                params.append(pm.group(2) + (f"[{n.group(1)}]@{pm.group(1) or 1}" if n else ""))
        out[m.group(1)] = params
    return out


def check_ptx(ptx: str) -> list[str]:
    """What the compiled device code does that a timed kernel may not, in words."""
    out = []
    code = _COMMENT.sub(lambda m: " " * len(m.group(0)), ptx)
    defined = {m.group(1) for m in _FUNC.finditer(code) if m.group(2) == "{"}
    outside = [m.group(1) for m in _FUNC.finditer(code) if m.group(1) not in defined]
    called = [m.group(1) for m in _CALL.finditer(code)]
    if any(c.startswith("%") for c in called):
        out.append("an indirect call (through a function's address in a register): a kernel calls "
                   "only the functions its source defines")
    outside += [c for c in called if not c.startswith("%") and c not in defined]
    for name in dict.fromkeys(outside):
        if name in ALLOWED_EXTERNS:
            continue
        if name == "vprintf":
            out.append("device-side printf (vprintf) in a timed kernel: take it out")
        elif name in ("malloc", "free"):
            out.append(f"device-side {name} (the device heap) in a kernel: use shared memory, "
                       f"registers or the buffers given")
        else:
            out.append(f"a call of the external function {name!r}: nothing is linked to a kernel "
                       f"(no dynamic parallelism, no separate compilation)")
    names, taken, rest = _global_variables(ptx)
    hint = next((h for f, h in _MESSAGE_HINTS.items() if f in outside), "")
    for name in names:
        # Read-only use is a constant (NVRTC emits a namespace-scope constexpr as a .global
        # with its value); a store, an atomic, or its address taken (then written through
        # a pointer) keeps state. A use is the statement around the name: from the last
        # `;`, brace or line end before it, less a predicate (`@%p1 st.global...`).
        uses = []
        for m in re.finditer(rf"(?<![\w$.%]){re.escape(name)}(?![\w$])", rest):
            start = max(rest.rfind(c, 0, m.start()) for c in ";{}\n") + 1
            uses.append(_PREDICATE.sub("", rest[start:m.start()].strip()))
        if name not in taken and all(u.startswith("ld.") for u in uses):
            continue
        out.append(f"a writable __device__ variable {name!r}: state kept from one launch to the next "
                   f"is not allowed (use __constant__ for tables, the buffers given for data)" + hint)
    return out


# An assert's or a printf's message strings are `.global` variables whose address is passed to
# the call: the variable is refused like any other, with what to change.
_MESSAGE_HINTS = {"__assertfail": "; assert() keeps its message strings in such variables: take it out "
                                  "of the timed kernel or pass the option -DNDEBUG",
                  "vprintf": "; printf keeps its format strings in such variables"}


_RES_FN = re.compile(r"(?:Compiling entry function|Function properties for) '([\w$]+)'")
_RES_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def resources(log: str) -> dict[str, dict[str, int]]:
    """ptxas's `-v` report: per entry, registers per thread and static shared memory bytes."""
    out: dict[str, dict[str, int]] = {}
    current = None
    for ln in log.splitlines():
        m = _RES_FN.search(ln)
        if m:
            current = m.group(1)
            continue
        m = _RES_USED.search(ln)
        if m and current:
            out[current] = {"regs": int(m.group(1)), "smem": int(m.group(2) or 0)}
    return out


# ---- compiling one unit ---------------------------------------------------------------


def compiler() -> str:
    """"nvcc" or "nvrtc": the one this machine has (TUNER_CUDA_COMPILER picks one)."""
    want = os.environ.get("TUNER_CUDA_COMPILER", "")
    if want not in ("", "nvcc", "nvrtc"):
        raise CudaCompileError(f"TUNER_CUDA_COMPILER={want!r}: nvcc or nvrtc")
    # NVRTC first: in-process, a quarter of nvcc's time per unit (no host preprocessing, no
    # process start).
    if want != "nvcc" and _nvrtc_path():
        return "nvrtc"
    if want != "nvrtc" and _nvcc():
        return "nvcc"
    raise CudaCompileError("no CUDA C++ compiler: neither nvcc (the CUDA toolkit: on PATH or under "
                           "CUDA_HOME) nor libnvrtc (installed with a CUDA build of torch) was found"
                           + (f" (TUNER_CUDA_COMPILER={want})" if want else ""))


def _nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    return shutil.which("nvcc") or next((str(p) for p in [Path(home) / "bin" / "nvcc"] if p.is_file()), None)


def _site_nvidia() -> list[Path]:
    return [Path(p) / "nvidia" for p in sys.path if p and (Path(p) / "nvidia").is_dir()]


def _nvrtc_path() -> str | None:
    for base in _site_nvidia():
        for f in sorted(glob.glob(str(base / "cu*" / "lib" / "libnvrtc.so*")) +
                        glob.glob(str(base / "cuda_nvrtc" / "lib" / "libnvrtc.so*"))):
            if "builtins" not in f:
                return f
    return ctypes.util.find_library("nvrtc")


def _include_dirs() -> list[str]:
    """Where cuda_bf16.h and friends are, for NVRTC (nvcc knows its own)."""
    # The headers installed beside libnvrtc first: a toolkit's of another version may not
    # parse with this NVRTC.
    home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    dirs = [b / d / "include" for b in _site_nvidia()
            for d in ("cuda_runtime", "cu13", "cu12", "cuda_nvrtc", "cuda_cccl")] + [Path(home) / "include"]
    return [str(d) for d in dirs if d.is_dir()]


def arch_name(arch: int) -> str:
    """sm_90a for Hopper (wgmma, setmaxnreg need the arch-specific target), sm_100a likewise."""
    return f"sm_{arch}a" if arch in (90, 100, 103) else f"sm_{arch}"


def compile_unit(source: str, options: tuple[str, ...], arch: int, workdir: Path, timeout_s: float) -> dict[str, Any]:
    """Compile one unit under `workdir` (`unit.cu` -> `unit.cubin`); its manifest entry:
    {"kernels": {name: {"params": [...], "regs": n, "smem": bytes}}, "compiler": ...}.
    Raises CudaCompileError with the reason for anything that fails or is refused."""
    findings = check_source(source)
    if findings:
        f = findings[0]
        raise CudaCompileError(f"forbidden: {f.why}" + (f" (CUDA source line {f.line})" if f.line else ""))
    why = check_options(options)
    if why:
        raise CudaCompileError(f"forbidden: {why}")
    workdir.mkdir(parents=True, exist_ok=True)
    which = compiler()
    if which == "nvcc":
        ptx, cubin, log = _nvcc_compile(source, options, arch, workdir, timeout_s)
    else:
        ptx, cubin, log = _nvrtc_compile(source, options, arch)
    bad = check_ptx(ptx)
    if bad:
        raise CudaCompileError("forbidden: " + "; ".join(bad))
    (workdir / "unit.cubin").write_bytes(cubin)
    res = resources(log)
    entries = ptx_entries(ptx)
    return {"compiler": which, "kernels": {name: {"params": params, **res.get(name, {})}
                                           for name, params in entries.items()}}


def _nvcc_compile(source, options, arch, workdir: Path, timeout_s):
    (workdir / "unit.cu").write_text(source)
    keep = workdir / "keep"
    keep.mkdir(exist_ok=True)
    cmd = [_nvcc(), "-cubin", f"-arch={arch_name(arch)}", "-std=c++17", "-Xptxas", "-v", "--keep",
           "--keep-dir", str(keep), "-o", str(workdir / "unit.cubin"), *options, str(workdir / "unit.cu")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=workdir,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise CudaCompileError(f"nvcc took more than {timeout_s:g} s") from None
    if proc.returncode != 0:
        raise CudaCompileError("nvcc: " + _errors(out))
    ptx = next(iter(sorted(keep.glob("*.ptx"))), None)
    if ptx is None:
        raise CudaCompileError("nvcc left no PTX to check")
    return ptx.read_text(), (workdir / "unit.cubin").read_bytes(), out


def _errors(log: str, limit: int = 1500) -> str:
    """The compiler's error lines first (with the line of unit.cu they name), then the rest."""
    lines = [ln for ln in log.splitlines() if ln.strip()]
    errors = [ln.replace(str(Path.cwd()) + "/", "") for ln in lines if "error" in ln.lower()]
    return "\n".join(errors or lines)[:limit]


_NVRTC_OPTION = {"-lineinfo": "--generate-line-info", "-use_fast_math": "--use_fast_math"}


def _nvrtc_compile(source, options, arch):
    lib = ctypes.CDLL(_nvrtc_path())
    prog = ctypes.c_void_p()
    _nvrtc_ok(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"unit.cu", 0, None, None),
              "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture={arch_name(arch)}", "--std=c++17", "--ptxas-options=-v",
                *[f"-I{d}" for d in _include_dirs()]]
        for o in options:
            if o.startswith("-O"):
                continue  # NVRTC always optimises
            o = _NVRTC_OPTION.get(o, o)
            opts.append("--" + o[1:] if o.startswith("-maxrregcount") or o.startswith("-std") else o)
        arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace")
        if rc != 0:
            raise CudaCompileError("nvrtc: " + _errors(log))
        out = []
        for what in ("PTX", "CUBIN"):
            getattr(lib, f"nvrtcGet{what}Size")(prog, ctypes.byref(size))
            data = ctypes.create_string_buffer(size.value)
            _nvrtc_ok(lib, getattr(lib, f"nvrtcGet{what}")(prog, data), f"nvrtcGet{what}")
            out.append(data.raw)
        return out[0].rstrip(b"\0").decode(errors="replace"), out[1], log
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _nvrtc_ok(lib, rc: int, what: str) -> None:
    if rc != 0:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise CudaCompileError(f"{what}: {lib.nvrtcGetErrorString(rc).decode()}")


# ---- the launches against what was compiled ---------------------------------------------

MAX_BLOCK = (1024, 1024, 64)
MAX_GRID = (2**31 - 1, 65535, 65535)
REGS_PER_SM = 65536


def check_launches(launches, units: dict[str, dict[str, Any]], smem_limit: int) -> str | None:
    """Why one of `launches` (tuner.cuda.Launch) would fail against the compiled `units`."""
    from tuner.cuda import check_arg
    for ln in launches:
        kernels = units[ln.key]["kernels"]
        k = kernels.get(ln.name)
        if k is None:
            found = ", ".join(sorted(kernels)) or "none"
            return (f"cuda.launch names {ln.name!r}, which the source does not define as a kernel "
                    f"(found: {found}; declare it extern \"C\" __global__ so its name is kept)")
        if len(ln.args) != len(k["params"]):
            return f"{ln.name}: launched with {len(ln.args)} arguments; the kernel has {len(k['params'])} parameters"
        for i, (kind, t) in enumerate(zip(ln.args, k["params"])):
            why = check_arg(t, kind)
            if why:
                return f"{ln.name} argument {i}: {why}"
        threads = ln.block[0] * ln.block[1] * ln.block[2]
        if threads > 1024 or any(b > m for b, m in zip(ln.block, MAX_BLOCK)):
            return f"{ln.name}: block {ln.block} ({threads} threads): at most 1024 threads, {MAX_BLOCK} per dimension"
        if any(g > m for g, m in zip(ln.grid, MAX_GRID)):
            return f"{ln.name}: grid {ln.grid} beyond the limits {MAX_GRID}"
        smem = ln.smem + k.get("smem", 0)
        if smem > smem_limit:
            return (f"out of resource: shared memory, Required: {smem} ({k.get('smem', 0)} static + {ln.smem} "
                    f"dynamic), Hardware limit: {smem_limit}")
        regs = k.get("regs", 0)
        if regs and regs * threads > REGS_PER_SM:
            return (f"out of resource: registers, {regs} per thread x {threads} threads > {REGS_PER_SM} per SM "
                    f"(fewer threads, or -maxrregcount)")
    return None

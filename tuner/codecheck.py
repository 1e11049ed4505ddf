"""Static checks of generated kernel code, before it is compiled or run.

Kernels written by a model are checked for what a kernel has no business doing, and for the
known ways to cheat a benchmark:

* Python / Triton (`check_python`): imports only from an allowed set (triton, math, torch
  for allocation, torch_npu); no torch compute anywhere (a torch fallback is a cheat) — torch
  may only allocate (`torch.empty*`) and tensors may only be asked for their layout
  (`stride`, `numel`, ...); no file, process or network access, no eval/exec/compile, no
  dunder names or attributes, no getattr/setattr, no try/except (a silent fallback), no
  global state (`global`, module-level containers).
* C (`check_c`): `#include` only of standard math/OpenMP/stdlib/SIMD headers; no calls to
  system/exec*/fork/popen/fopen/dlopen/syscall/socket/getenv and kin; no inline asm, no
  constructor/destructor attributes, no token pasting (`##`) or computed includes that would
  hide a forbidden name.

Each returns a list of `Finding(line, text, why)`; empty means clean. `check_source` picks
the checker by skeleton language. Jinja templates are also checked (`check_template`) for
access to underscore attributes, which is how template code escapes to Python.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    line: int
    text: str  # the offending source line
    why: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.why}\n    {self.text.strip()}"


# ---- Python / Triton ----------------------------------------------------------------------

ALLOWED_IMPORTS = ("triton", "math", "torch", "torch_npu", "typing", "functools")
TORCH_ALLOWED = {"empty", "empty_like", "empty_strided", "float32", "float16", "bfloat16", "float64",
                 "int32", "int64", "int8", "uint8", "bool", "dtype", "device", "Tensor", "Size",
                 "cuda", "npu", "finfo", "iinfo"}
TORCH_SUBMODULE_ALLOWED = {"current_device", "current_stream", "get_device_properties",
                           "device_count", "is_available"}
TENSOR_METHODS = {"stride", "size", "numel", "dim", "data_ptr", "is_contiguous", "element_size",
                  "view", "get_device", "nelement", "ndimension"}
FORBIDDEN_NAMES = {"eval", "exec", "compile", "open", "__import__", "getattr", "setattr", "delattr",
                   "globals", "locals", "vars", "input", "breakpoint", "exit", "quit", "memoryview",
                   "help", "dir", "type", "object", "super", "classmethod", "staticmethod", "property"}
FORBIDDEN_MODULES = {"os", "sys", "subprocess", "socket", "ctypes", "importlib", "pickle", "shutil",
                     "pathlib", "builtins", "io", "threading", "multiprocessing", "signal", "urllib",
                     "http", "requests", "inspect", "gc", "tempfile", "marshal", "numpy"}
_BUILTIN_CALLS = {"range", "len", "min", "max", "int", "float", "bool", "tuple", "list", "dict",
                  "enumerate", "zip", "abs", "isinstance", "str", "round", "sum", "all", "any",
                  "divmod", "pow", "sorted", "reversed", "print", "ValueError", "AssertionError"}


def check_python(source: str, allowed_imports: tuple[str, ...] = ALLOWED_IMPORTS) -> list[Finding]:
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        line = (source.splitlines()[e.lineno - 1] if e.lineno and e.lineno <= len(source.splitlines())
                else "")
        return [Finding(e.lineno or 0, line, f"Python syntax error: {e.msg}")]
    lines = source.splitlines()
    out: list[Finding] = []

    def bad(node: ast.AST, why: str) -> None:
        n = getattr(node, "lineno", 0)
        out.append(Finding(n, lines[n - 1] if 0 < n <= len(lines) else "", why))

    torch_names = {"torch"}  # names bound to the torch module
    module_aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                root = a.name.split(".")[0]
                if root not in allowed_imports:
                    bad(node, f"import of {a.name!r}: only {', '.join(allowed_imports)} may be imported")
                module_aliases[a.asname or root] = a.name if a.asname else root
                if a.name == "torch":
                    torch_names.add(a.asname or "torch")
        elif isinstance(node, ast.ImportFrom):
            root = (node.module or "").split(".")[0]
            if node.level or root not in allowed_imports:
                bad(node, f"import from {node.module!r}: only {', '.join(allowed_imports)} may be imported")
            if root == "torch":
                for a in node.names:
                    if a.name not in TORCH_ALLOWED:
                        bad(node, f"from torch import {a.name}: torch may only allocate "
                                  f"(torch.empty*), not compute")
    jit_funcs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and _is_jit(n)]
    jit_nodes = {id(x) for f in jit_funcs for x in ast.walk(f)}

    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if node.id.startswith("__") or node.id in FORBIDDEN_NAMES:
                bad(node, f"{node.id!r} is not allowed in a kernel")
            elif node.id in FORBIDDEN_MODULES:
                bad(node, f"module {node.id!r} is not allowed in a kernel")
            elif id(node) in jit_nodes and node.id in torch_names:
                bad(node, "torch inside a @triton.jit kernel")
        elif isinstance(node, ast.Attribute):
            if node.attr.startswith("_"):
                bad(node, f"access to the private attribute {node.attr!r}")
            base = node.value
            if isinstance(base, ast.Name) and base.id in torch_names and node.attr not in TORCH_ALLOWED:
                bad(node, f"torch.{node.attr}: torch may only allocate (torch.empty*) and name "
                          f"dtypes; the kernel must compute the result itself")
            if (isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name)
                    and base.value.id in torch_names and base.attr in ("cuda", "npu")
                    and node.attr not in TORCH_SUBMODULE_ALLOWED):
                bad(node, f"torch.{base.attr}.{node.attr} is not allowed in a kernel")
        elif isinstance(node, (ast.Try, ast.With, ast.AsyncWith, ast.Global, ast.Nonlocal,
                               ast.AsyncFunctionDef, ast.ClassDef, ast.Await, ast.Yield, ast.YieldFrom)):
            what = {ast.Try: "try/except (a silent fallback)", ast.Global: "global state",
                    ast.Nonlocal: "nonlocal state", ast.ClassDef: "a class"}.get(type(node), type(node).__name__)
            bad(node, f"{what} is not allowed in a kernel")
        elif isinstance(node, ast.Call) and id(node) not in jit_nodes:
            _check_host_call(node, torch_names, module_aliases, bad)
    for stmt in tree.body:  # module level: constants, imports, functions only
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            if not _is_constant(stmt.value):
                bad(stmt, "module-level state: only constants may be assigned outside functions")
        elif not isinstance(stmt, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.Expr, ast.Assert)):
            bad(stmt, f"{type(stmt).__name__} at module level: a kernel file defines functions only")
        elif isinstance(stmt, ast.Expr) and not (isinstance(stmt.value, ast.Constant)
                                                 and isinstance(stmt.value.value, str)):
            bad(stmt, "module-level code runs at import: only docstrings may stand alone")
    return sorted(out, key=lambda f: f.line)


def _is_jit(f: ast.FunctionDef) -> bool:
    for d in f.decorator_list:
        text = ast.unparse(d)
        if "jit" in text or "autotune" in text or "heuristics" in text:
            return True
    return False


def _is_constant(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, (ast.Tuple,)):
        return all(_is_constant(e) for e in node.elts)
    if isinstance(node, (ast.UnaryOp, ast.BinOp)):
        return all(_is_constant(c) for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr))
    if isinstance(node, ast.Attribute):  # tl.float32, torch.float16
        return isinstance(node.value, (ast.Name, ast.Attribute))
    if isinstance(node, ast.Call) and ast.unparse(node.func) in ("tl.constexpr", "triton.language.constexpr"):
        return all(_is_constant(a) for a in node.args)
    return False


def _check_host_call(node: ast.Call, torch_names: set[str], aliases: dict[str, str], bad) -> None:
    f = node.func
    if isinstance(f, ast.Subscript):  # kernel[grid](...): a launch
        return
    if isinstance(f, ast.Name):
        return  # builtins are vetted as names; local functions are checked where defined
    if isinstance(f, ast.Attribute):
        base = f.value
        while isinstance(base, ast.Attribute):
            base = base.value
        if isinstance(base, ast.Name) and (base.id in torch_names or base.id in aliases):
            return  # module functions: torch.* is vetted as an attribute; triton/math are fine
        if f.attr not in TENSOR_METHODS:
            bad(node, f".{f.attr}() on a tensor: outside the kernel only layout queries "
                      f"({', '.join(sorted(TENSOR_METHODS))}) are allowed")


# ---- C ---------------------------------------------------------------------------------------

ALLOWED_HEADERS = {"math.h", "stdint.h", "stddef.h", "stdlib.h", "stdbool.h", "float.h", "limits.h",
                   "string.h", "omp.h", "complex.h", "tgmath.h", "stdalign.h", "assert.h",
                   "immintrin.h", "x86intrin.h", "xmmintrin.h", "emmintrin.h", "pmmintrin.h",
                   "smmintrin.h", "nmmintrin.h", "arm_neon.h", "arm_sve.h", "riscv_vector.h"}
FORBIDDEN_C = {"system", "popen", "pclose", "fork", "vfork", "clone", "execl", "execle", "execlp",
               "execv", "execve", "execvp", "execvpe", "fexecve", "posix_spawn", "posix_spawnp",
               "fopen", "freopen", "fdopen", "open", "openat", "creat", "read", "write", "pread",
               "pwrite", "unlink", "remove", "rename", "mkdir", "rmdir", "chmod", "chown",
               "dlopen", "dlsym", "syscall", "socket", "connect", "bind", "listen", "accept",
               "send", "recv", "sendto", "recvfrom", "getenv", "setenv", "putenv", "kill", "raise",
               "signal", "sigaction", "ptrace", "mmap", "mprotect", "munmap", "exit", "_exit",
               "abort", "atexit", "asm", "__asm__", "__asm", "setjmp", "longjmp", "printf",
               "fprintf", "puts", "fputs", "scanf", "sleep", "usleep", "nanosleep", "time",
               "clock", "clock_gettime", "gettimeofday", "rand", "srand"}
_C_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_C_STRING = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'')
_IDENT = re.compile(r"[A-Za-z_]\w*")
_CALL = re.compile(r"([A-Za-z_]\w*)\s*\(")
_ASM = re.compile(r"\b(asm|__asm__|__asm)\b")


def check_c(source: str) -> list[Finding]:
    original = source.splitlines()
    # Comments out (newlines kept), then backslash-continued lines joined: a name split by
    # backslash-newline is still that name. Each logical line remembers its first line.
    stripped = _C_COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), source)
    lines, starts, line_no = [], [], 1
    for chunk in re.split(r"(?<!\\)\n", stripped):
        lines.append(chunk.replace("\\\n", ""))
        starts.append(line_no)
        line_no += chunk.count("\n") + 1
    out: list[Finding] = []

    def bad(i: int, why: str) -> None:
        n = starts[i]
        out.append(Finding(n, original[n - 1] if 0 < n <= len(original) else "", why))

    for i, ln in enumerate(lines):
        s = ln.strip()
        if s.startswith("#"):
            directive = s[1:].strip()
            if directive.startswith("include"):
                m = re.match(r'include\s*[<"]([^>"]+)[>"]', directive)
                if not m:
                    bad(i, "computed #include: name the header literally")
                elif m.group(1) not in ALLOWED_HEADERS:
                    bad(i, f"#include <{m.group(1)}>: only standard math/OpenMP/stdlib/SIMD headers "
                           f"may be included ({', '.join(sorted(ALLOWED_HEADERS))})")
            elif directive.startswith(("define", "undef")) and "##" in directive:
                bad(i, "token pasting (##) in a macro")
            elif directive.startswith(("pragma", "if", "else", "elif", "endif", "define", "undef",
                                       "ifdef", "ifndef", "error", "warning", "line")):
                pass
            else:
                bad(i, f"preprocessor directive #{directive.split()[0] if directive else ''} is not allowed")
        code = _C_STRING.sub('""', ln)
        # A call or a declaration names the function with "(" after it; a macro may alias it.
        named = (_IDENT.findall(code) if s.startswith("#")
                 else [m.group(1) for m in _CALL.finditer(code)] + _ASM.findall(code))
        for name in dict.fromkeys(named):
            if name in FORBIDDEN_C:
                bad(i, f"{name!r}: a kernel may not do I/O, start processes, read the clock or "
                       f"the environment, or use inline asm")
        m = re.search(r"__attribute__\s*\(\(.*\b(constructor|destructor)\b", code)
        if m:
            bad(i, f"__attribute__(({m.group(1)})) runs code when the library loads")
        if "_Pragma" in code:
            bad(i, "_Pragma: write #pragma instead")
    return sorted(out, key=lambda f: f.line)


# ---- Jinja templates and dispatch ---------------------------------------------------------

def check_template(template: str) -> list[Finding]:
    """Underscore attributes (`x.__class__`, `x['_y']`) and the `attr` filter in a Jinja
    template: the ways template code reaches Python internals. (Templates also render in a
    sandbox; this names the line before anything renders.)"""
    import jinja2
    from jinja2 import nodes
    try:
        tree = jinja2.Environment().parse(template)
    except jinja2.TemplateSyntaxError as e:
        return [Finding(e.lineno or 0, _line(template, e.lineno or 0), f"template syntax error: {e.message}")]
    out = []
    for node in tree.find_all((nodes.Getattr, nodes.Getitem, nodes.Filter)):
        name = None
        if isinstance(node, nodes.Getattr):
            name = node.attr
        elif isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str):
            name = node.arg.value
        if isinstance(node, nodes.Filter) and node.name == "attr":
            out.append(Finding(node.lineno, _line(template, node.lineno), "the attr filter"))
        elif name is not None and name.startswith("_"):
            out.append(Finding(node.lineno, _line(template, node.lineno),
                               f"underscore name {name!r} in a template expression"))
    return sorted(out, key=lambda f: f.line)


def check_source(language: str, source: str) -> list[Finding]:
    """The findings for one rendered source. Triton modules for the cuda backend go through
    that backend's own contract checker (`tuner.backends.triton_source`) when it is there."""
    if language == "c":
        return check_c(source)
    if language == "triton":
        try:
            from .backends import triton_source
        except ImportError:
            return check_python(source)
        try:
            triton_source.check_source(source)
        except SyntaxError as e:
            return [Finding(e.lineno or 0, _line(source, e.lineno or 0), f"Python syntax error: {e.msg}")]
        except triton_source.Forbidden as e:
            m = re.search(r"\(line (\d+)\)", str(e))
            n = int(m.group(1)) if m else 0
            return [Finding(n, _line(source, n), str(e))]
        return []
    if language in ("triton_ascend", "python"):
        return check_python(source)
    return []


def _line(source: str, n: int) -> str:
    lines = source.splitlines()
    return lines[n - 1] if 0 < n <= len(lines) else ""

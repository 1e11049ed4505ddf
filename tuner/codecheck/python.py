"""The Python kernel checker (Triton launch modules for the cuda, npu and sim backends; `cuda`
launch modules, whose kernels are CUDA C++ launched through `tuner.cuda.launch`).

A `triton` or `triton_ascend` skeleton renders to a Python module that defines @triton.jit
kernels and `def launch(<inputs>, <outputs>)`; a `cuda` one to constants (the CUDA C++ source)
and `launch`, which may import `math`, `torch` and `tuner.cuda` (only `launch`, `cdiv` and `tensor_map`). Templates may come from a language model, so the
module's AST is checked before anything in it runs:

* imports: only the policy's modules (`triton`, `triton.language` and its submodules, `math`,
  `torch`, and per policy `triton.tools.tensor_descriptor` or `torch_npu`, imported for its
  side effect only: nothing is taken from it); no relative or star imports;
* module level: imports, function definitions and constant assignments only, so importing the
  module runs no code; the only decorator is `triton.jit` (the imported one, with constant
  arguments: a function the module defines and names `jit` is not the JIT);
* attribute paths from an imported module stay inside the allowed modules: torch only for
  dtypes and allocation (`torch.empty`, `torch.zeros`, ...), no `torch.nn`/`torch.cuda`/
  `torch.ops`; from `triton` only a short list; a path that reaches another module through
  an allowed one (`tl.core.builtins`) is refused;
* no torch inside a @triton.jit function, and no `.handle`/`.data` there (under Triton's
  interpreter a tensor's handle is a numpy array on the host);
* outside @triton.jit functions: tensor methods only from a short list that computes nothing
  (`stride`, `size`, `view`, ...), no `@`, no augmented or subscript assignment (no in-place
  tensor writes), no `out=` arguments, no `**kwargs`, no `key=`/`file=` other than a lambda
  (a builtin would call what it is given), calls only of builtins from a short list, of
  imported functions and of this module's functions and kernels, and no attribute of this
  module's functions (a JIT function's state: `k.cache` tells the first launch from later ones);
* nothing that outlives a launch: no list among a module's constants or a function's
  defaults (tuples only), no assignment to an attribute or item in a kernel either (Triton has
  none), and no attribute that, on what the imports reach, holds a list or dict or leads into
  a JIT function's state (`tl.dtype.SINT_TYPES`, `x.sum.add_pre_run_hook`; found by walking the
  installed Triton): under Triton's interpreter a kernel's body is Python in the judging process;
* nowhere: dunder names or private attributes, `eval`/`exec`/`open`/`getattr`/`__import__`
  and the like, `global`/`nonlocal`, classes, `with`, `try`, `del`, `match`, async code,
  generators; nor a name of the module's functions or imports bound again (an assignment, a
  loop or comprehension variable, a parameter, a nested `def`): the call rules above trust
  such a name to be that function or module, and `helper = x.untyped_storage; helper()`
  would call whatever it was bound to.

Every violation is a `Finding` with its line; the module must also define `launch`.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import sys
import types
from dataclasses import dataclass

from tuner.codecheck.findings import Finding, source_line
from tuner.codecheck.outlives import held_names, mutable


@dataclass(frozen=True)
class PythonPolicy:
    """What a launch module may import, and what it may reach through those imports."""
    imports: frozenset[str]          # importable modules (and any triton.language.* submodule)
    triton_attrs: frozenset[str]     # names a module may take from `triton`
    torch_attrs: frozenset[str]      # names a module may take from `torch` (dtypes, allocation)
    module_prefixes: tuple[str, ...]  # a module reached through an attribute path must be one of these
    # Per module path, the only names a module may take from it (`tuner.cuda`: `launch`, `cdiv`, `tensor_map`).
    attrs: tuple[tuple[str, frozenset[str]], ...] = ()

    def names_of(self, module: str) -> frozenset[str] | None:
        return dict(self.attrs).get(module)


TRITON_ATTRS = frozenset({"jit", "cdiv", "next_power_of_2", "language", "tools", "Config"})
TORCH_ALLOC = frozenset({"empty", "empty_like", "zeros", "zeros_like", "empty_strided", "full",
                         "full_like"})
TORCH_DTYPES = frozenset({"float32", "float16", "bfloat16", "float64", "int8", "int16", "int32",
                          "int64", "uint8", "bool", "float", "half", "float8_e4m3fn", "float8_e5m2",
                          "dtype", "Size"})
SAFE_METHODS = frozenset({"stride", "size", "numel", "dim", "element_size", "is_contiguous", "view",
                          "new_empty", "new_zeros", "data_ptr", "from_tensor", "get", "items",
                          "keys", "values"})
FORBIDDEN_NAMES = frozenset({"eval", "exec", "compile", "open", "getattr", "setattr", "delattr",
                             "globals", "locals", "vars", "input", "breakpoint", "exit", "quit",
                             "help", "memoryview", "__import__", "type", "object", "super",
                             "classmethod", "staticmethod", "property", "dir", "id", "hash",
                             "callable", "isinstance", "issubclass"})
SAFE_BUILTINS = frozenset({"min", "max", "abs", "int", "float", "bool", "len", "range", "tuple",
                           "list", "dict", "round", "zip", "enumerate", "print", "str", "slice"})

TRITON = PythonPolicy(
    imports=frozenset({"triton", "triton.language", "math", "torch", "triton.tools.tensor_descriptor"}),
    triton_attrs=TRITON_ATTRS, torch_attrs=TORCH_DTYPES | TORCH_ALLOC,
    module_prefixes=("triton.language", "triton.tools.tensor_descriptor", "math", "torch"))
TRITON_ASCEND = PythonPolicy(
    imports=frozenset({"triton", "triton.language", "math", "torch", "torch_npu"}),
    triton_attrs=TRITON_ATTRS, torch_attrs=TORCH_DTYPES | TORCH_ALLOC,
    module_prefixes=("triton.language", "math", "torch"),
    # Imported for what the import does (torch's npu device); nothing taken from it: its
    # functions are the vendor's fused kernels (torch_npu.npu_rms_norm), the op's work.
    attrs=(("torch_npu", frozenset()),))
# `cuda` launch modules (cuda backend): CUDA C++ kernels launched through `tuner.cuda.launch`.
CUDA = PythonPolicy(
    imports=frozenset({"math", "torch", "tuner.cuda"}),
    triton_attrs=frozenset(), torch_attrs=TORCH_DTYPES | TORCH_ALLOC,
    module_prefixes=("math", "torch", "tuner.cuda"),
    attrs=(("tuner", frozenset({"cuda"})), ("tuner.cuda", frozenset({"launch", "cdiv", "tensor_map"}))))


def check_python(source: str, policy: PythonPolicy = TRITON) -> list[Finding]:
    """Every violation of `policy`'s contract in `source`, by line; a syntax error alone when
    the source does not parse."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return [Finding(e.lineno or 0, source_line(source, e.lineno or 0),
                        f"Python syntax error: {e.msg}", syntax=True)]
    checker = _Checker(source, policy)
    checker.check_module(tree)
    seen, out = set(), []
    for f in sorted(checker.findings, key=lambda f: f.line):
        if (f.line, f.why) not in seen:
            seen.add((f.line, f.why))
            out.append(f)
    return out


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _const(node: ast.AST, lists: bool = False) -> bool:
    """A literal, a tuple of literals, arithmetic of those, or tl.constexpr(<literal>); with
    `lists`, lists of those too. A module's constants and a function's defaults take no list:
    they live as long as the module, and under Triton's interpreter a kernel's body is Python
    that could append to one (a result kept from one launch to the next)."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Tuple) or (lists and isinstance(node, ast.List)):
        return all(_const(e, lists) for e in node.elts)
    if isinstance(node, ast.UnaryOp):
        return _const(node.operand, lists)
    if isinstance(node, ast.BinOp):
        return _const(node.left, lists) and _const(node.right, lists)
    if isinstance(node, ast.Call) and _dotted(node.func) in ("tl.constexpr", "triton.language.constexpr"):
        return all(_const(a, lists) for a in node.args) and not node.keywords
    return False


# Stdlib module names that are also triton.language submodules: the static fallback below
# must not refuse `tl.math`.
_TL_SUBMODULES = {"math", "core", "semantic", "standard", "extra", "random", "libdevice"}


# Builtins a path through an allowed module must not reach under another name (a module that
# re-exports `exec`), found by identity.
_DANGEROUS = tuple(getattr(builtins, n) for n in FORBIDDEN_NAMES if callable(getattr(builtins, n, None)))


# Attributes of a Triton tensor that lead out of Triton: its IR value, which under Triton's
# interpreter (the sim backend's verification, interpret mode) is a numpy array on the host
# (`v.handle.data.tofile(path)` wrote a file from inside a kernel).
_BEHIND_A_TENSOR = frozenset({"handle", "data"})


_LIST = ("a list as a module's constant or a default: it outlives the launch, and under Triton's "
         "interpreter a kernel could keep a result in it between calls; use a tuple")


class _Checker(ast.NodeVisitor):
    def __init__(self, source: str, policy: PythonPolicy) -> None:
        self.source = source
        self.policy = policy
        self.findings: list[Finding] = []
        self.aliases: dict[str, str] = {}  # local name -> the module or module attribute it stands for
        self.functions: set[str] = set()
        self.in_jit = 0
        self.depth = 0  # functions being visited, around the current node
        # torch is not walked: a launch reaches its values only through the methods in
        # SAFE_METHODS (none changes anything), and a kernel not at all.
        self.held = held_names(tuple(p for p in policy.module_prefixes if p.split(".")[0] != "torch"))

    def fail(self, node: ast.AST, what: str) -> None:
        n = getattr(node, "lineno", 0)
        self.findings.append(Finding(n, source_line(self.source, n), what))

    # ---- module level -----------------------------------------------------------------

    def check_module(self, tree: ast.Module) -> None:
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self.visit(node)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                self.functions.add(node.name)
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.FunctionDef):
                self.visit(node)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if not all(isinstance(t, ast.Name) for t in targets) or node.value is None \
                        or not _const(node.value):
                    self.fail(node, _LIST if node.value is not None and _const(node.value, lists=True)
                              else "module-level code other than imports, functions and constants")
                for t in targets:
                    self.visit(t)
                if isinstance(node, ast.AnnAssign):  # evaluated on import, like the value
                    if _dotted(node.annotation) is None:
                        self.fail(node, "annotations must be plain names such as tl.constexpr")
                    else:
                        self.visit(node.annotation)
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                    and isinstance(node.value.value, str):
                continue  # a docstring
            else:
                self.fail(node, f"module-level {type(node).__name__}; only imports, functions "
                                "and constants")
        if "launch" not in self.functions:
            self.findings.append(Finding(0, "", "the module defines no `def launch(...)` entry point"))

    def _is_jit_decorator(self, d: ast.AST) -> bool:
        """`@triton.jit` or `@jit` imported from triton: resolved through the imports, so a
        function of the module's own that is named `jit` is not the JIT."""
        return self._resolve(d.func if isinstance(d, ast.Call) else d) == "triton.jit"

    def _resolve(self, node: ast.AST) -> str | None:
        dotted = _dotted(node)
        if dotted is None:
            return None
        root, _, rest = dotted.partition(".")
        if root in self.functions or root not in self.aliases:
            return None
        module = self.aliases[root]
        return f"{module}.{rest}" if rest else module

    # ---- imports ----------------------------------------------------------------------

    def _importable(self, name: str) -> bool:
        return name in self.policy.imports or (
            "triton.language" in self.policy.imports and name.startswith("triton.language."))

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if not self._importable(a.name):
                self.fail(node, f"import {a.name}; allowed: {', '.join(sorted(self.policy.imports))}")
                continue
            root = a.name.split(".")[0]
            self._imports_as(node, a.asname or root, a.name if a.asname else root)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = node.module or ""
        if node.level or not self._importable(mod):
            self.fail(node, f"from {mod} import ...; allowed modules: "
                            f"{', '.join(sorted(self.policy.imports))}")
            return
        for a in node.names:
            if a.name == "*":
                self.fail(node, "import *")
            elif mod == "torch" and a.name not in self.policy.torch_attrs:
                self.fail(node, f"from torch import {a.name}: torch may only allocate "
                                f"(torch.empty*) and name dtypes, not compute")
            elif mod == "triton" and a.name not in self.policy.triton_attrs:
                self.fail(node, f"from triton import {a.name}")
            elif self.policy.names_of(mod) is not None and a.name not in self.policy.names_of(mod):
                self.fail(node, f"from {mod} import {a.name}; allowed: "
                                f"{', '.join(sorted(self.policy.names_of(mod))) or 'nothing (import the module itself)'}")
            else:
                self._imports_as(node, a.asname or a.name, f"{mod}.{a.name}")
                self._check_reached_modules(node, f"{mod}.{a.name}")  # `from tl.core import builtins`

    # ---- names and attributes ---------------------------------------------------------

    def _rebinds(self, node: ast.AST, name: str) -> None:
        """A binding of `name`: refused where it is one of the module's functions or imports,
        which calls and attribute paths are trusted to be."""
        if name in self.functions or name in self.aliases:
            self.fail(node, f"{name!r} is bound again here, but it names this module's "
                            f"{'function' if name in self.functions else 'import'} {name!r}: "
                            f"a call through it is trusted to be that one; use another name")

    def _imports_as(self, node: ast.AST, name: str, target: str) -> None:
        """An import binding `name` to `target`: inside a function, a binding again like any
        other, unless it names the same thing the module's own import does."""
        if self.depth and self.aliases.get(name) != target:
            self._rebinds(node, name)
        self.aliases[name] = target

    def visit_arg(self, node: ast.arg) -> None:  # a lambda's parameters (a def's: visit_FunctionDef)
        self._rebinds(node, node.arg)

    def visit_Name(self, node: ast.Name) -> None:
        if not isinstance(node.ctx, ast.Load):
            self._rebinds(node, node.id)
        if node.id.startswith("__") or node.id in FORBIDDEN_NAMES:
            self.fail(node, f"name {node.id!r} is not allowed in a kernel")
        elif self.in_jit and self.aliases.get(node.id, "").split(".")[0] == "torch":
            self.fail(node, "torch inside a @triton.jit kernel")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr.startswith("_"):
            self.fail(node, f"private or dunder attribute {node.attr!r}")
            return
        if not isinstance(node.ctx, ast.Load):
            self._stored(node)
        path = (_dotted(node) or node.attr).split(".")
        held = [seg for seg in path[1:] or path if seg in self.held]
        if held:
            self.fail(node, f".{held[0]}: on what a kernel reaches through its imports this holds a "
                            f"list, a dict or a JIT function's state, which outlives the launch (a "
                            f"result kept between calls); a kernel computes from its arguments")
            return
        if self.in_jit and node.attr in _BEHIND_A_TENSOR:
            self.fail(node, f".{node.attr}: what stands behind a Triton tensor (an IR value; under "
                            f"Triton's interpreter, a numpy array on the host) is not the kernel's; "
                            f"use triton.language's operations")
            return
        if isinstance(node.value, ast.Name) and node.value.id in self.functions:
            # A @triton.jit function's attributes are the JIT's state (`k.cache` fills on the
            # first launch: a launch could tell the checked first call from the timed ones).
            self.fail(node, f"{node.value.id}.{node.attr}: a function of the module is called or "
                            f"launched (kernel[grid](...)), never looked into")
            return
        full = self._resolve(node)
        if full is not None:
            self._check_module_path(node, full)
            if self.in_jit and full.split(".")[0] == "torch":
                self.fail(node, "torch inside a @triton.jit kernel")
            return  # the whole path was checked; its prefixes need no second look
        self.generic_visit(node)

    def _check_module_path(self, node: ast.AST, full: str) -> None:
        parts = full.split(".")
        for i in range(1, len(parts)):
            allowed = self.policy.names_of(".".join(parts[:i]))
            if allowed is not None and parts[i] not in allowed:
                self.fail(node, f"{'.'.join(parts[:i + 1])}; from {'.'.join(parts[:i])} only "
                                f"{', '.join(sorted(allowed)) or 'the import itself, nothing in it'}")
                return
        if parts[0] == "torch":
            if len(parts) > 1 and not (len(parts) == 2 and parts[1] in self.policy.torch_attrs):
                self.fail(node, f"{full}: torch is for dtypes and allocation "
                                f"({', '.join(sorted(TORCH_ALLOC))}) only; the kernel must "
                                f"compute the result itself")
            return
        if parts[0] == "triton" and len(parts) > 1:
            if parts[1] == "tools":
                if ".".join(parts[:3]) != "triton.tools.tensor_descriptor" \
                        or "triton.tools.tensor_descriptor" not in self.policy.imports:
                    self.fail(node, full)
                    return
            elif parts[1] != "language" and parts[1] not in self.policy.triton_attrs:
                self.fail(node, f"{full}; from triton only {', '.join(sorted(self.policy.triton_attrs))}")
                return
        self._check_reached_modules(node, full)

    def _check_reached_modules(self, node: ast.AST, full: str) -> None:
        """Walk the path object by object where the module is importable here: every module
        it passes through must be one of the policy's (`tl.core.builtins` reaches `builtins`).
        Where it is not importable (a machine without triton), refuse segments that name a
        standard-library module instead."""
        parts = full.split(".")
        root = sys.modules.get(parts[0])
        if root is None:
            try:
                root = importlib.import_module(parts[0])
            except Exception:  # noqa: BLE001 - not importable here: the static rule below
                root = None
        if root is None:
            for seg in parts[1:]:
                if seg in sys.stdlib_module_names and seg not in _TL_SUBMODULES:
                    self.fail(node, f"{full} reaches the module {seg!r}")
                    return
            return
        obj = root
        for i, seg in enumerate(parts[1:], start=1):
            try:
                obj = getattr(obj, seg)
            except Exception:  # noqa: BLE001 - a name the module lacks: Triton says so at compile
                return
            if mutable(obj):
                self.fail(node, f"{'.'.join(parts[:i + 1])} is a {type(obj).__name__}, which outlives the "
                                f"launch (a result kept between calls); a kernel computes from its arguments")
                return
            if any(obj is f for f in _DANGEROUS):
                self.fail(node, f"{'.'.join(parts[:i + 1])} is the builtin {obj.__name__!r}")
                return
            if isinstance(obj, types.ModuleType):
                name = obj.__name__
                if not any(name == p or name.startswith(p + ".") or p.startswith(name + ".")
                           for p in self.policy.module_prefixes):  # inside one, or a package above one
                    self.fail(node, f"{'.'.join(parts[:i + 1])} is the module {name!r}, which a "
                                    f"kernel may not use")
                    return

    # ---- statements -------------------------------------------------------------------

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        if node.name.startswith("__"):
            self.fail(node, f"function name {node.name!r}")
        # A decorator is an expression run when the function is defined: nothing but the JIT,
        # and that only on a module-level function (a decorator is not visited as code).
        for d in node.decorator_list:
            if self.depth:
                self.fail(d, f"decorator {ast.unparse(d)!r} on a nested function")
                continue
            if not self._is_jit_decorator(d):
                self.fail(d, f"decorator {ast.unparse(d)!r}; only @triton.jit")
            if isinstance(d, ast.Call) and (d.args or not all(_const(k.value, lists=True) for k in d.keywords)):
                self.fail(d, "@triton.jit(...) takes constant keyword arguments only")
        if self.depth:
            self._rebinds(node, node.name)
        for default in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
            if not _const(default):
                self.fail(default, _LIST if _const(default, lists=True) else "non-constant default argument")
        args = node.args
        for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
            if a is not None:
                self._rebinds(a, a.arg)
            if a is not None and a.annotation is not None:
                if _dotted(a.annotation) is None:
                    self.fail(a, "annotations must be plain names such as tl.constexpr")
                else:
                    self.visit(a.annotation)
        if node.returns is not None:
            self.fail(node, "return annotation")
        jit = not self.depth and any(self._is_jit_decorator(d) for d in node.decorator_list)
        self.in_jit += jit
        self.depth += 1
        for stmt in node.body:
            self.visit(stmt)
        self.depth -= 1
        self.in_jit -= jit

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if not self.in_jit:
            self.fail(node, "augmented assignment outside a @triton.jit function (in-place tensor "
                            "writes belong in the kernel)")
        self.generic_visit(node)

    def _stored(self, node: ast.AST) -> None:
        """An attribute or item as an assignment's (or a loop's) target."""
        if self.in_jit:
            self.fail(node, "assignment to an attribute or item in a @triton.jit function: Triton has "
                            "none, and under its interpreter it would change an object that outlives "
                            "the launch (state kept between calls); bind a new name instead")
        else:
            self.fail(node, "assignment to a subscript or attribute outside a @triton.jit function")

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if not isinstance(node.ctx, ast.Load):
            self._stored(node)
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult) and not self.in_jit:
            self.fail(node, "`@` outside a @triton.jit function")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        for k in node.keywords:
            if k.arg is None:
                self.fail(node, "**kwargs in a call")
            elif k.arg == "out" and not self.in_jit:
                self.fail(node, "out= argument")
            elif k.arg in ("key", "file") and not self.in_jit and not isinstance(k.value, ast.Lambda):
                # max(..., key=y.copy_) calls what it is given, past the call rules
                self.fail(node, f"{k.arg}= argument other than a lambda outside a @triton.jit function")
        if not self.in_jit:
            self._check_host_call(node)
        self.generic_visit(node)

    def _check_host_call(self, node: ast.Call) -> None:
        f = node.func
        if isinstance(f, ast.Subscript):  # kernel[grid](...) of a kernel defined here
            if isinstance(f.value, ast.Name) and f.value.id in self.functions:
                return
            self.fail(node, f"call of {ast.unparse(f)!r}; only kernel[grid](...) of this module's kernels")
        elif isinstance(f, ast.Name):
            if f.id in SAFE_BUILTINS or f.id in self.functions or f.id in self.aliases \
                    or f.id in FORBIDDEN_NAMES or f.id.startswith("__"):
                return  # a builtin from the list, a function of this module, an imported one;
                # a forbidden name is reported once, by visit_Name
            self.fail(node, f"call of {f.id!r}")
        elif isinstance(f, ast.Attribute):
            if self._resolve(f) is not None:
                return  # a module attribute: its path is checked by visit_Attribute
            if f.attr not in SAFE_METHODS:
                self.fail(node, f"method call .{f.attr}() outside a @triton.jit function; allowed: "
                                f"{', '.join(sorted(SAFE_METHODS))}")
        elif not isinstance(f, ast.Lambda):
            self.fail(node, f"call of {ast.unparse(f)!r}")

    def _no(what):  # noqa: N805 - a small factory of visitors that always fail
        def visit(self, node):
            self.fail(node, f"{what} is not allowed in a kernel")
        return visit

    visit_Global = _no("global state")
    visit_Nonlocal = _no("nonlocal state")
    visit_ClassDef = _no("a class definition")
    visit_With = _no("a with statement")
    visit_AsyncFunctionDef = _no("an async function")
    visit_AsyncWith = _no("async with")
    visit_AsyncFor = _no("async for")
    visit_Await = _no("await")
    visit_Yield = _no("yield")
    visit_YieldFrom = _no("yield from")
    visit_Delete = _no("del")
    visit_Try = _no("try/except (a silent fallback)")
    visit_TryStar = _no("try/except* (a silent fallback)")
    visit_Match = _no("a match statement")  # its patterns bind names without an assignment
    del _no

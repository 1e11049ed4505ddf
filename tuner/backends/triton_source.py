"""What a rendered Triton module may contain, and how it is loaded.

A `triton` skeleton renders to a Python module that defines @triton.jit kernels and
`def launch(<inputs>, <outputs>)`. Templates may come from a language model, so the module's
AST is checked before anything in it runs:

* imports: `triton`, `triton.language` (and its submodules), `math`, `torch`, and
  `triton.tools.tensor_descriptor` (host-side TMA descriptors); nothing else;
* module level: imports, function definitions and constant assignments only, so importing the
  module runs no code; decorators only `triton.jit` (with constant arguments);
* torch only for dtypes and allocation (`torch.empty`, `torch.zeros`, ...): no torch compute,
  no `torch.nn`, no `torch.cuda`/`torch.ops`/`torch._C`;
* outside @triton.jit functions: tensor methods only from a short list that computes nothing
  (`stride`, `size`, `view`, ...), no `@`, no augmented or subscript assignment (no in-place
  tensor writes), no `out=` arguments;
* nowhere: dunder names or attributes, `eval`/`exec`/`open`/`getattr`/`__import__` and the like,
  `global`/`nonlocal`, classes, `with`, async code.

A violation is a COMPILE_ERROR whose message starts with "forbidden:": the code is rejected
before it runs, exactly like a compiler rejecting a program, and the reason goes back to the
proposer as compile feedback. (SUSPECT is for kernels that ran and passed but look too good.)
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

ALLOWED_IMPORTS = {"triton", "triton.language", "math", "torch", "triton.tools.tensor_descriptor"}
TRITON_ATTRS = {"jit", "cdiv", "next_power_of_2", "language", "tools", "Config"}
TORCH_ALLOC = {"empty", "empty_like", "zeros", "zeros_like", "empty_strided", "full", "full_like"}
TORCH_DTYPES = {"float32", "float16", "bfloat16", "float64", "int8", "int16", "int32", "int64",
                "uint8", "bool", "float", "half", "float8_e4m3fn", "float8_e5m2", "dtype", "Size"}
SAFE_METHODS = {"stride", "size", "numel", "dim", "element_size", "is_contiguous", "view",
                "new_empty", "new_zeros", "data_ptr", "from_tensor", "get", "items", "keys", "values"}
FORBIDDEN_NAMES = {"eval", "exec", "compile", "open", "getattr", "setattr", "delattr", "globals",
                   "locals", "vars", "input", "breakpoint", "exit", "quit", "help", "memoryview",
                   "__import__", "type", "object", "super", "classmethod", "staticmethod",
                   "property", "dir", "id", "hash", "callable", "isinstance", "issubclass"}
SAFE_BUILTINS = {"min", "max", "abs", "int", "float", "bool", "len", "range", "tuple", "list",
                 "dict", "round", "zip", "enumerate", "print", "str", "slice"}


class Forbidden(ValueError):
    """The module breaks the contract; the message says where and what."""


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _is_jit(fn: ast.FunctionDef) -> bool:
    for d in fn.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        name = _dotted(target)
        if name in ("triton.jit", "jit"):
            return True
    return False


def _const(node: ast.AST) -> bool:
    """A literal, a tuple of literals, arithmetic of those, or tl.constexpr(<literal>)."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_const(e) for e in node.elts)
    if isinstance(node, ast.UnaryOp):
        return _const(node.operand)
    if isinstance(node, ast.BinOp):
        return _const(node.left) and _const(node.right)
    if isinstance(node, ast.Call) and _dotted(node.func) in ("tl.constexpr", "triton.language.constexpr"):
        return all(_const(a) for a in node.args) and not node.keywords
    return False


class _Checker(ast.NodeVisitor):
    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}  # local name -> module it stands for
        self.functions: set[str] = set()
        self.in_jit = 0

    def fail(self, node: ast.AST, what: str) -> None:
        raise Forbidden(f"forbidden: {what} (line {getattr(node, 'lineno', '?')})")

    # ---- module level -----------------------------------------------------------------

    def check_module(self, tree: ast.Module) -> None:
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self.visit(node)
            elif isinstance(node, ast.FunctionDef):
                self.functions.add(node.name)
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.FunctionDef):
                for d in node.decorator_list:
                    target = d.func if isinstance(d, ast.Call) else d
                    if _dotted(target) not in ("triton.jit", "jit"):
                        self.fail(d, f"decorator {ast.unparse(d)!r}; only @triton.jit")
                    if isinstance(d, ast.Call) and not all(_const(k.value) for k in d.keywords):
                        self.fail(d, "@triton.jit(...) takes constant arguments only")
                self.visit(node)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if not all(isinstance(t, ast.Name) for t in targets) or node.value is None \
                        or not _const(node.value):
                    self.fail(node, "module-level code other than imports, functions and constants")
                for t in targets:
                    self.visit(t)
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue  # a docstring
            else:
                self.fail(node, f"module-level {type(node).__name__}; only imports, functions "
                                "and constants")
        if "launch" not in self.functions:
            raise Forbidden("forbidden: the module defines no `def launch(...)` entry point")

    # ---- imports ----------------------------------------------------------------------

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.name not in ALLOWED_IMPORTS:
                self.fail(node, f"import {a.name}; allowed: {', '.join(sorted(ALLOWED_IMPORTS))}")
            self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = node.module or ""
        if node.level or not (mod in ALLOWED_IMPORTS or mod.startswith("triton.language.")):
            self.fail(node, f"from {mod} import ...; allowed modules: {', '.join(sorted(ALLOWED_IMPORTS))}")
        for a in node.names:
            if a.name == "*":
                self.fail(node, "import *")
            if mod == "torch" and a.name not in TORCH_DTYPES | TORCH_ALLOC:
                self.fail(node, f"from torch import {a.name}")
            if mod == "triton" and a.name not in TRITON_ATTRS:
                self.fail(node, f"from triton import {a.name}")
            self.aliases[a.asname or a.name] = f"{mod}.{a.name}"

    # ---- names and attributes ---------------------------------------------------------

    def visit_Name(self, node: ast.Name) -> None:
        if node.id.startswith("__") or node.id in FORBIDDEN_NAMES:
            self.fail(node, f"name {node.id!r}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr.startswith("_"):
            self.fail(node, f"private or dunder attribute {node.attr!r}")
        dotted = _dotted(node)
        if dotted:
            root, _, rest = dotted.partition(".")
            module = self.aliases.get(root)
            if module is not None:
                full = f"{module}.{rest}" if rest else module
                self._check_module_attr(node, full)
        self.generic_visit(node)

    def _check_module_attr(self, node: ast.AST, full: str) -> None:
        parts = full.split(".")
        if parts[0] == "torch":
            if len(parts) > 1 and not (len(parts) == 2 and parts[1] in TORCH_DTYPES | TORCH_ALLOC):
                self.fail(node, f"torch.{'.'.join(parts[1:])}: torch is for dtypes and allocation "
                                f"({', '.join(sorted(TORCH_ALLOC))}) only")
        elif parts[0] == "triton" and len(parts) > 1:
            if parts[1] == "language":
                return
            if parts[1] == "tools":
                if ".".join(parts[:3]) != "triton.tools.tensor_descriptor":
                    self.fail(node, f"{full}")
                return
            if parts[1] not in TRITON_ATTRS:
                self.fail(node, f"{full}; from triton only {', '.join(sorted(TRITON_ATTRS))}")

    # ---- statements -------------------------------------------------------------------

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        if node.name.startswith("__"):
            self.fail(node, f"function name {node.name!r}")
        for default in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
            if not _const(default):
                self.fail(default, "non-constant default argument")
        args = node.args
        for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
            if a is not None and a.annotation is not None and _dotted(a.annotation) is None:
                self.fail(a, "annotations must be plain names such as tl.constexpr")
            if a is not None and a.annotation is not None:
                self.visit(a.annotation)
        if node.returns is not None:
            self.fail(node, "return annotation")
        jit = _is_jit(node)
        self.in_jit += jit
        for stmt in node.body:
            self.visit(stmt)
        self.in_jit -= jit

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if not self.in_jit:
            self.fail(node, "augmented assignment outside a @triton.jit function (in-place tensor "
                            "writes belong in the kernel)")
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        if not self.in_jit and any(isinstance(t, (ast.Subscript, ast.Attribute)) for t in node.targets):
            self.fail(node, "assignment to a subscript or attribute outside a @triton.jit function")
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult) and not self.in_jit:
            self.fail(node, "`@` outside a @triton.jit function")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        for k in node.keywords:
            if k.arg is None:
                self.fail(node, "**kwargs in a call")
            if k.arg == "out" and not self.in_jit:
                self.fail(node, "out= argument")
        if not self.in_jit:
            self._check_host_call(node)
        self.generic_visit(node)

    def _check_host_call(self, node: ast.Call) -> None:
        f = node.func
        if isinstance(f, ast.Subscript):  # kernel[grid](...) of a kernel defined here
            if isinstance(f.value, ast.Name) and f.value.id in self.functions:
                return
            self.fail(node, f"call of {ast.unparse(f)!r}; only kernel[grid](...) of this module's kernels")
        if isinstance(f, ast.Name):
            if f.id in SAFE_BUILTINS or f.id in self.functions:
                return
            if f.id in self.aliases:  # an imported function (e.g. TensorDescriptor, cdiv)
                return
            self.fail(node, f"call of {f.id!r}")
        if isinstance(f, ast.Attribute):
            dotted = _dotted(f)
            root = dotted.split(".")[0] if dotted else None
            if root in self.aliases:
                return  # a module attribute: checked by visit_Attribute
            if f.attr in SAFE_METHODS:
                return
            self.fail(node, f"method call .{f.attr}() outside a @triton.jit function; allowed: "
                            f"{', '.join(sorted(SAFE_METHODS))}")
        if isinstance(f, ast.Lambda):
            return
        self.fail(node, f"call of {ast.unparse(f)!r}")

    def _no(what):  # noqa: N805 - a small factory of visitors that always fail
        def visit(self, node):
            self.fail(node, what)
        return visit

    visit_Global = _no("global")
    visit_Nonlocal = _no("nonlocal")
    visit_ClassDef = _no("class definition")
    visit_With = _no("with statement")
    visit_AsyncFunctionDef = _no("async function")
    visit_AsyncWith = _no("async with")
    visit_AsyncFor = _no("async for")
    visit_Await = _no("await")
    visit_Yield = _no("yield")
    visit_YieldFrom = _no("yield from")
    visit_Delete = _no("del")
    visit_Try = _no("try statement")
    del _no


def check_source(source: str) -> None:
    """Raise Forbidden (message "forbidden: ...") or SyntaxError if `source` breaks the contract."""
    tree = ast.parse(source)
    _Checker().check_module(tree)


def load_module(path: str | Path, name: str):
    """Import a checked module file under `name` (re-checked here: the file could have changed)."""
    path = Path(path)
    check_source(path.read_text())
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # @triton.jit looks its function's module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def warm_launch(module, inputs: list, outputs: list) -> list:
    """Call the module's `launch` with every Triton kernel launch turned into a compile-only
    warm-up (`run(..., warmup=True)`); the compiled kernels, in launch order. The compile
    happens in the compile pool, and the benchmark worker's first launch hits the cache."""
    import torch
    from triton.runtime import jit
    compiled: list = []
    original = jit.JITFunction.run

    def run(fn, *args, grid, warmup, **kwargs):
        kernel = original(fn, *args, grid=grid, warmup=True, **kwargs)
        compiled.append(kernel)
        return kernel

    jit.JITFunction.run = run
    try:
        with torch.no_grad():
            module.launch(*inputs, *outputs)
    finally:
        jit.JITFunction.run = original
    return compiled

"""A model's own module as a problem file, and back: what `tuner profile --emit` writes for a
leaf module whose forward runs several aten ops (an activation written out as a formula, such
as GPT-2's tanh GELU: five elementwise ops, one fused kernel's work), and what `runtime.patch`
reads to put the kernel tuned for that file in place of each such module of a model.

A module is extractable when it is a leaf (no submodules), holds no buffers (parameters, as
an RMSNorm's weight, are fine: the kernel takes them after the inputs, as it takes a problem
file's Model's), its class can be found again (importable by its module's name, or defined in
the model file, loaded again from its path), and every attribute of its own is a plain value
(a number, a string, a bool, None, a tuple of those) or a function importable by name
(`recipe`). The recipe names the class, those attributes and its parameters (names; their
shapes are sizes, the problem file's); `build` makes the module again (without calling its
__init__: the attributes are what it set; the parameters drawn at random, as a problem file's
Model's are). `MODULE = {...}` in the problem file is the recipe, read back without running
the file (`read`). Two modules are the same op when their recipes are equal: the same class,
the same attributes and parameter names (GELU(approximate="tanh") is not GELU()).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

MODEL_PREFIX = "tuner_model_"  # profile.load_model's module names: a class defined in the model file
_PLAIN = (int, float, str, bool, type(None))


def _plain(v) -> Any:
    """v as JSON-able data the recipe keeps, or raise ValueError."""
    if isinstance(v, _PLAIN):
        return v
    if isinstance(v, tuple) and all(isinstance(x, _PLAIN) for x in v):
        return {"tuple": list(v)}
    mod, qual = getattr(v, "__module__", None), getattr(v, "__qualname__", None)
    if callable(v) and mod and qual and "<" not in qual and _find(mod, qual) is v:
        return {"function": f"{mod}:{qual}"}
    raise ValueError(f"{type(v).__name__} attribute")


def _value(v) -> Any:
    if isinstance(v, dict) and "tuple" in v:
        return tuple(v["tuple"])
    if isinstance(v, dict) and "function" in v:
        mod, qual = v["function"].split(":", 1)
        return _find(mod, qual)
    return v


def _find(mod: str, qual: str) -> Any:
    try:
        obj = importlib.import_module(mod)
        for part in qual.split("."):
            obj = getattr(obj, part)
        return obj
    except (ImportError, AttributeError, ValueError):
        return None


def recipe(module) -> dict | None:
    """The module's recipe (see the module docstring), or None when it is not extractable."""
    cls = type(module)
    if next(module.children(), None) is not None or next(module.buffers(), None) is not None \
            or "<" in cls.__qualname__ or not all(p.is_floating_point() for p in module.parameters()):
        return None
    where: dict[str, str] = {}
    if cls.__module__.startswith(MODEL_PREFIX):
        path = getattr(sys.modules.get(cls.__module__), "__file__", None)
        if not path:
            return None
        where = {"file": str(Path(path).resolve())}
    elif _find(cls.__module__, cls.__qualname__) is not cls:
        return None
    attrs = {}
    for k, v in sorted(vars(module).items()):
        if k.startswith("_") or k == "forward":
            continue
        try:
            attrs[k] = _plain(v)
        except ValueError:
            return None
    return {"class": f"{cls.__module__}:{cls.__qualname__}", **where, "attrs": attrs,
            "params": [n for n, _ in module.named_parameters(recurse=False)]}


def same(module, wanted: dict) -> bool:
    """Whether `module` is the op `wanted` (a recipe) describes: its recipe, the class found by
    name or by its file, the attributes (but `training`) and the parameter names equal."""
    mine = recipe(module)

    def attrs(r):  # `training` is not the op: the patched forward routes in eval mode only
        return {k: v for k, v in r.get("attrs", {}).items() if k != "training"}
    if mine is None or attrs(mine) != attrs(wanted) or mine["params"] != wanted.get("params", []):
        return False
    if "file" in wanted or "file" in mine:
        return (mine.get("file") == wanted.get("file")
                and mine["class"].split(":", 1)[1] == wanted["class"].split(":", 1)[1])
    return mine["class"] == wanted["class"]


def build(r: dict, shapes: dict | None = None):
    """The module a recipe describes, made again (its __init__ not called: the attributes are
    what it set), each parameter of `shapes[name]` drawn at random. ValueError when its class
    cannot be found or a parameter's shape is not given."""
    import torch
    import torch.nn as nn
    mod, qual = r["class"].split(":", 1)
    if "file" in r:
        name = MODEL_PREFIX + "extracted_" + str(abs(hash(r["file"])))
        module = sys.modules.get(name)
        if module is None:
            spec = importlib.util.spec_from_file_location(name, r["file"])
            if spec is None:
                raise ValueError(f"{r['file']}: cannot load the model file that defines {qual}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(name, None)
                raise
        cls = _find(name, qual)
    else:
        cls = _find(mod, qual)
    if not isinstance(cls, type) or not issubclass(cls, nn.Module):
        raise ValueError(f"{r['class']}: not found (the module's class moved or was renamed?)")
    m = cls.__new__(cls)
    nn.Module.__init__(m)
    m.__dict__.update({k: _value(v) for k, v in r["attrs"].items()})
    for name in r.get("params", []):
        if name not in (shapes or {}):
            raise ValueError(f"{r['class']}: the shape of its parameter {name!r} is not given")
        m.register_parameter(name, nn.Parameter(1 + 0.1 * torch.randn(tuple(shapes[name]))))
    return m


def short_name(r: dict) -> str:
    """The class's name with its attributes, as a profile row names it: GELU(approximate='tanh')."""
    name = r["class"].rsplit(":", 1)[1].rsplit(".", 1)[-1]
    shown = {k: _value(v) for k, v in r["attrs"].items() if k != "training"}
    return name + (f"({', '.join(f'{k}={v!r}' for k, v in shown.items())})" if shown else "")


def read(path: str | Path) -> dict | None:
    """A problem file's `MODULE = {...}` (a literal: the file is not run), or None."""
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "MODULE":
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return None
            if isinstance(value, dict) and isinstance(value.get("class"), str) and isinstance(value.get("attrs"), dict):
                return value
    return None

"""What outlives a Triton launch, found in the installed Triton (for the launch-module checker,
tuner/codecheck/python.py).

Under Triton's interpreter (the sim backend's checks, the cuda backend's `interpret` option) a
kernel's body is Python run in the judging process, and every object it reaches through
triton.language outlives the launch: a list there (`tl.dtype.SINT_TYPES`) or a JIT function's
own state (`tl.sum.pre_run_hooks`, `.add_pre_run_hook`) could carry a result from one launch to
the next. Triton's compiler refuses such code on a device; here it is refused before it runs,
by what the installed Triton holds, not by a list of names kept by hand.
"""

from __future__ import annotations

import collections.abc
import functools
import importlib
import types


def mutable(obj) -> bool:
    """A container a value could be put in and found again."""
    return isinstance(obj, (collections.abc.MutableSequence, collections.abc.MutableMapping,
                            collections.abc.MutableSet, bytearray))


# What the walk does not look into: values that hold nothing, and functions and descriptors (a
# class's methods; a JIT function is an object, not a FunctionType, and is looked into).
_PLAIN = (str, bytes, int, float, complex, bool, type(None), frozenset, range, types.FunctionType,
          types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType,
          types.GetSetDescriptorType, types.MemberDescriptorType, property, functools.cached_property,
          staticmethod, classmethod, type)


@functools.lru_cache(maxsize=None)
def held_names(roots: tuple[str, ...]) -> frozenset[str]:
    """Attribute names that, on the modules under `roots` (those importable here), their
    classes and the objects they hold, name a mutable container, or anything a JIT function
    answers to (its caches, hooks, `run`) other than what the language's own values answer to
    (`x.type`, `x.dtype.element_ty`). Empty where nothing is importable: nothing can run then."""
    containers: set[str] = set()
    jit: set[str] = set()
    api: set[str] = set()
    seen: set[int] = set()

    def public(d) -> dict:
        return {n: v for n, v in d.items() if not n.startswith("_")}

    def walk(obj, depth: int) -> None:
        if id(obj) in seen or depth > 4:
            return
        seen.add(id(obj))
        if isinstance(obj, types.ModuleType):
            if not any(obj.__name__ == r or obj.__name__.startswith(r + ".") for r in roots):
                return
            items = public(vars(obj))
        elif isinstance(obj, type):
            items = {}
            for c in reversed(obj.__mro__[:-1]):
                items.update(public(vars(c)))
            api.update(items)
        else:  # an object a module holds: a dtype, a constexpr, a JIT function
            items = public(getattr(obj, "__dict__", {}))
            if callable(obj):
                jit.update(items)
                for c in type(obj).__mro__[:-1]:
                    jit.update(public(vars(c)))
                return
            api.update(items)
        for name, value in items.items():
            if mutable(value):
                containers.add(name)
            elif isinstance(value, (types.ModuleType, type)) or not isinstance(value, _PLAIN + (tuple,)):
                walk(value, depth + 1)

    for root in roots:
        try:
            walk(importlib.import_module(root), 0)
        except Exception:  # noqa: BLE001 - not importable here: nothing of it can run either
            continue
    try:  # what a language value answers to that no class holds (attributes set in __init__)
        tl = importlib.import_module("triton.language")
        for v in (tl.tensor(None, tl.float32), tl.constexpr(1)):
            api.update(public(vars(v)))
    except Exception:  # noqa: BLE001 - another Triton's constructors: the classes' names stand
        pass
    return frozenset(containers | (jit - api))

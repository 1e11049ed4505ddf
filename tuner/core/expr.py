"""Whitelisted arithmetic expressions for constraints and resource formulas.

Spaces are written by people and by LLMs, so their expressions are parsed with Python's
`ast` and walked here node by node; nothing is ever handed to `eval`. Allowed: numbers,
booleans, strings, names, + - * / // % **, comparisons (chained too), and/or/not,
`a if c else b`, and the functions in FUNCTIONS.
"""

from __future__ import annotations

import ast
import math
import operator
from dataclasses import dataclass
from typing import Any


class ExprError(ValueError):
    """A malformed or disallowed expression, or one that names an unknown variable."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


FUNCTIONS = {
    "min": min, "max": max, "abs": abs, "int": int, "float": float,
    "cdiv": _cdiv, "ceil": math.ceil, "floor": math.floor,
    "log2": math.log2, "sqrt": math.sqrt,
    "is_pow2": lambda x: int(x) > 0 and (int(x) & (int(x) - 1)) == 0,
    "round_up": lambda a, b: _cdiv(a, b) * b,
}

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_CMPOPS = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
           ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
           ast.NotIn: lambda a, b: a not in b}
_MAX_POW = 64  # 2**64 is as large as any tile arithmetic needs; bigger is a typo or an attack
# Bounds that keep a hostile expression (a model writes spaces) from hanging or exhausting the
# process: every integer a step makes fits in _MAX_BITS bits, every string in _MAX_STR
# characters, and the expression nests at most _MAX_DEPTH deep.
_MAX_BITS = 256
_MAX_STR = 4096
_MAX_DEPTH = 64


@dataclass(frozen=True)
class Expr:
    """A parsed expression. `names` are the free variables it reads."""

    text: str
    tree: ast.Expression
    names: frozenset[str]

    def __call__(self, env: dict[str, Any]) -> Any:
        try:
            return _eval(self.tree.body, env, self.text)
        except ExprError:
            raise
        except (TypeError, ValueError, OverflowError, ArithmeticError, RecursionError, MemoryError) as e:
            raise ExprError(f"{type(e).__name__}: {e} in {self.text!r}") from None

    def violation(self, env: dict[str, Any]) -> float:
        """0 when the expression holds; else how far it is from holding, for a search that
        walks an invalid config towards a valid one: a failed numeric comparison counts its
        relative gap |a - b| / (|a| + |b|) (so a smem overflow of 2x is further than one of
        10 %), anything else that fails counts 1. `and` adds up, `or` takes the nearest."""
        try:
            return _violation(self.tree.body, env, self.text)
        except ExprError:
            raise
        except (TypeError, ValueError, OverflowError, ArithmeticError, RecursionError, MemoryError) as e:
            raise ExprError(f"{type(e).__name__}: {e} in {self.text!r}") from None

    def __reduce__(self):  # AST nodes pickle, but re-parsing is smaller and always valid
        return (parse, (self.text,))


def parse(text: Any) -> Expr:
    if isinstance(text, bool) or isinstance(text, (int, float)):
        text = repr(text)
    if not isinstance(text, str) or not text.strip():
        raise ExprError(f"expected an expression string, got {text!r}")
    if len(text) > 2000:
        raise ExprError("expression longer than 2000 characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ExprError(f"syntax error in {text!r}: {e.msg}") from None
    if _depth(tree.body) > _MAX_DEPTH:
        raise ExprError(f"expression nested more than {_MAX_DEPTH} deep: {text[:80]!r}...")
    names: set[str] = set()
    _check(tree.body, names, text)
    return Expr(text.strip(), tree, frozenset(names))


def _depth(node: ast.AST) -> int:
    """How deep `node` nests, counted without recursion (a deep tree is what is refused)."""
    deepest, stack = 0, [(node, 1)]
    while stack:
        n, d = stack.pop()
        deepest = max(deepest, d)
        if d <= _MAX_DEPTH:
            stack.extend((c, d + 1) for c in ast.iter_child_nodes(n))
    return deepest


def _bounded(value: Any, text: str) -> Any:
    """`value`, when within the bounds above; else ExprError."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > _MAX_BITS:
        raise ExprError(f"a value larger than 2**{_MAX_BITS} in {text!r}")
    if isinstance(value, str) and len(value) > _MAX_STR:
        raise ExprError(f"a string longer than {_MAX_STR} characters in {text!r}")
    return value


def _check(node: ast.AST, names: set[str], text: str) -> None:
    if isinstance(node, ast.Constant):
        if not isinstance(node.value, (int, float, str, bool)):
            raise ExprError(f"constant {node.value!r} not allowed in {text!r}")
    elif isinstance(node, ast.Name):
        if node.id in FUNCTIONS:
            raise ExprError(f"function {node.id!r} used as a value in {text!r}")
        names.add(node.id)
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        _check(node.left, names, text)
        _check(node.right, names, text)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub, ast.UAdd)):
        _check(node.operand, names, text)
    elif isinstance(node, ast.BoolOp):
        for v in node.values:
            _check(v, names, text)
    elif isinstance(node, ast.Compare) and all(type(o) in _CMPOPS for o in node.ops):
        for v in [node.left, *node.comparators]:
            _check(v, names, text)
    elif isinstance(node, ast.IfExp):
        for v in (node.test, node.body, node.orelse):
            _check(v, names, text)
    elif isinstance(node, (ast.Tuple, ast.List)):
        for v in node.elts:
            _check(v, names, text)
    elif isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            what = ast.unparse(node.func)
            raise ExprError(f"call to {what!r} not allowed in {text!r}; allowed functions: "
                            + ", ".join(sorted(FUNCTIONS)))
        if node.keywords:
            raise ExprError(f"keyword arguments not allowed in {text!r}")
        for a in node.args:
            _check(a, names, text)
    else:
        raise ExprError(f"{type(node).__name__} not allowed in {text!r} "
                        f"(at {ast.unparse(node)!r})")


def _eval(node: ast.AST, env: dict[str, Any], text: str) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        try:
            return env[node.id]
        except KeyError:
            raise ExprError(f"unknown name {node.id!r} in {text!r}") from None
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, env, text), _eval(node.right, env, text)
        if isinstance(node.op, ast.Pow) and isinstance(b, (int, float)) and abs(b) > _MAX_POW:
            raise ExprError(f"exponent {b} too large in {text!r}")
        if isinstance(a, tuple) or isinstance(b, tuple):  # `[x] * 10**9` would build it
            raise ExprError(f"a list may only be the right side of `in`, in {text!r}")
        if isinstance(a, str) or isinstance(b, str):
            if not (isinstance(node.op, ast.Add) and isinstance(a, str) and isinstance(b, str)):
                raise ExprError(f"strings may only be compared or joined with +, in {text!r}")
        if isinstance(node.op, ast.Pow) and isinstance(a, int) and isinstance(b, int) \
                and a.bit_length() * abs(b) > 4 * _MAX_BITS:
            raise ExprError(f"a value larger than 2**{_MAX_BITS} in {text!r}")
        try:
            return _bounded(_BINOPS[type(node.op)](a, b), text)
        except ZeroDivisionError:
            raise ExprError(f"division by zero in {text!r}") from None
        except (TypeError, OverflowError) as e:
            raise ExprError(f"{e} in {text!r}") from None
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env, text)
        if isinstance(node.op, ast.Not):
            return not v
        if not isinstance(v, (int, float)):
            raise ExprError(f"unary {'-' if isinstance(node.op, ast.USub) else '+'} of a "
                            f"{type(v).__name__} in {text!r}")
        return -v if isinstance(node.op, ast.USub) else +v
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            result: Any = True
            for v in node.values:
                result = _eval(v, env, text)
                if not result:
                    return result
            return result
        result = False
        for v in node.values:
            result = _eval(v, env, text)
            if result:
                return result
        return result
    if isinstance(node, ast.Compare):
        return all(ok for _, _, _, ok in _comparisons(node, env, text))
    if isinstance(node, ast.IfExp):
        return _eval(node.body if _eval(node.test, env, text) else node.orelse, env, text)
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_eval(v, env, text) for v in node.elts)
    if isinstance(node, ast.Call):
        args = [_eval(a, env, text) for a in node.args]
        try:
            value = FUNCTIONS[node.func.id](*args)  # type: ignore[attr-defined]
        except (TypeError, ValueError, ZeroDivisionError, OverflowError) as e:
            raise ExprError(f"{node.func.id}(): {e} in {text!r}") from None  # type: ignore[attr-defined]
        return _bounded(value, text)
    raise ExprError(f"unreachable: {type(node).__name__} in {text!r}")


_ORDERED_CMP = (ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Eq)


def _comparisons(node: ast.Compare, env: dict[str, Any], text: str, lazy: bool = True):
    """(op, left, right, holds) for each link of a (chained) comparison; `lazy` stops after
    the first that fails, as Python does (later operands are not evaluated)."""
    left = _eval(node.left, env, text)
    for op, comp in zip(node.ops, node.comparators):
        right = _eval(comp, env, text)
        try:
            ok = bool(_CMPOPS[type(op)](left, right))
        except TypeError as e:
            raise ExprError(f"{e} in {text!r}") from None
        yield op, left, right, ok
        if lazy and not ok:
            return
        left = right


def _violation(node: ast.AST, env: dict[str, Any], text: str) -> float:
    if isinstance(node, ast.BoolOp):
        parts = [_violation(v, env, text) for v in node.values]
        return sum(parts) if isinstance(node.op, ast.And) else min(parts)
    if isinstance(node, ast.Compare):
        total = 0.0
        for op, left, right, ok in _comparisons(node, env, text, lazy=False):
            if not ok:
                numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (left, right))
                if numeric and isinstance(op, _ORDERED_CMP):
                    total += 1e-3 + abs(left - right) / (abs(left) + abs(right) + 1e-12)
                else:
                    total += 1.0
        return total
    return 0.0 if _eval(node, env, text) else 1.0

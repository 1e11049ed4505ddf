"""Skeletons: a Jinja2 kernel template plus the space of its tunables.

Library skeletons live in `kernel_templates/<op>/<lang>.<ext>.j2` with their space in
`spaces/<op>/<lang>.yaml`. Both folders are found from a checkout and from an installed
wheel (where they are packaged as `tuner/kernel_templates` and `tuner/spaces`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox

from tuner.core.space import Space, SpaceError, load_space
from tuner.core.values import Config, content_hash

EXTENSIONS = {"c": "c", "triton": "py", "triton_ascend": "py", "cuda": "py", "script": "txt"}


class SkeletonError(ValueError):
    """A template that does not parse or render, or a skeleton that cannot be found."""


MAX_SOURCE_CHARS = 4_000_000  # a rendered kernel larger than this is a runaway template
RENDER_TIMEOUT_S = 5.0  # a template whose own code runs longer than this is a runaway too (renders take ~0.1 ms)


class _RenderTimeout(Exception):
    pass


@contextlib.contextmanager
def _deadline(seconds: float):
    """Stop the template's own code (its loops, its macros) after `seconds`. The sandbox caps
    one range, but nested loops that write nothing ran on (10^10 iterations) in the tool's own
    process (an evaluation thread, so no SIGALRM): a trace function on the template's frames
    counts their line events and looks at the clock now and then. Other frames are not traced."""
    end = time.monotonic() + seconds
    count = 0

    def line(frame, event, arg):
        nonlocal count
        count += 1
        if count % 4096 == 0 and time.monotonic() > end:
            raise _RenderTimeout(f"rendering took more than {seconds:g} s; a loop in the template runs away")
        return line

    old = sys.gettrace()
    sys.settrace(lambda frame, event, arg: line if frame.f_code.co_filename == "<template>" else None)
    try:
        yield
    finally:
        sys.settrace(old)


def _template_line(e: BaseException) -> int | None:
    """The template line an exception was raised on (Jinja's compiled code maps to it)."""
    tb = e.__traceback__
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


@dataclass(frozen=True)
class Skeleton:
    template: str  # the Jinja2 source
    space: Space
    language: str  # "c", "triton", "triton_ascend"
    name: str = ""  # e.g. "softmax/c"
    round: int = 0
    parent: str = ""  # hash of the skeleton this one revises
    template_path: str = ""

    @property
    def hash(self) -> str:
        import json
        return content_hash(self.template, json.dumps(self.space.to_json()["params"], sort_keys=True),
                            "\n".join(r.expr.text for r in self.space.constraints),
                            json.dumps({n: r.expr.text for n, r in self.space.resources}, sort_keys=True),
                            self.language)

    def render(self, config: Config, context: dict[str, Any]) -> str:
        """The kernel source for one config. Every name the template reads must be defined."""
        env = {**context, **config.as_dict()}
        name = self.template_path or self.name
        try:
            # Streamed, so that a template that expands without bound fails instead of
            # filling the memory (the sandbox caps one range, not nested loops).
            chunks, size = [], 0
            template = _compiled(self.template)
            with _deadline(RENDER_TIMEOUT_S):
                for chunk in template.generate(**env):
                    size += len(chunk)
                    if size > MAX_SOURCE_CHARS:
                        raise SkeletonError(f"{name}: the rendered source passed {MAX_SOURCE_CHARS:,} "
                                            f"characters for {config}; a loop in the template runs away")
                    chunks.append(chunk)
            return "".join(chunks)
        except jinja2.TemplateError as e:
            line = getattr(e, "lineno", None)
            where = f":{line}" if line else ""
            raise SkeletonError(f"{name}{where}: {type(e).__name__}: {e}") from None
        except SkeletonError:
            raise
        except _RenderTimeout as e:
            line = _template_line(e)
            raise SkeletonError(f"{name}{f':{line}' if line else ''}: {e} (config {config})") from None
        except Exception as e:  # {{ 1 // 0 }}, a sandbox limit (OverflowError), a bad filter argument
            line = _template_line(e)
            where = f":{line}" if line else ""
            raise SkeletonError(f"{name}{where}: {type(e).__name__}: {e}") from None

    def to_json(self) -> dict[str, Any]:
        return {"template": self.template, "space": self.space.to_json(), "language": self.language,
                "name": self.name, "round": self.round, "parent": self.parent,
                "template_path": self.template_path}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Skeleton":
        return cls(template=data["template"], space=Space.from_json(data["space"]),
                   language=data["language"], name=data.get("name", ""), round=data.get("round", 0),
                   parent=data.get("parent", ""), template_path=data.get("template_path", ""))


_BIG_WIDTH = re.compile(r"\d{7,}|%[-+ #0]*\d*\.?\*")  # a width of a million or more, or a % width taken from an argument


def _check_format(spec: str) -> None:
    """A format string (`%` or str.format) whose widths could make a huge string in one step."""
    if isinstance(spec, str) and ("%" in spec or "{" in spec) and _BIG_WIDTH.search(spec):
        raise jinja2.sandbox.SecurityError("a format width or precision of a million or more (or one "
                                           "taken from an argument)")


def _check_size(value: Any, what: str) -> Any:
    if isinstance(value, (str, bytes, list, tuple, dict)) and len(value) > MAX_SOURCE_CHARS:
        raise jinja2.sandbox.SecurityError(f"{what} made a value of {len(value):,} items, more than a "
                                           f"kernel's source may hold")
    return value


def _check_args(args, kwargs, what: str) -> None:
    for a in (*args, *kwargs.values()):
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > MAX_SOURCE_CHARS:
            raise jinja2.sandbox.SecurityError(f"{what}: an argument of {a} is larger than a kernel's "
                                               f"source may be")


def _bounded_filter(f):
    @functools.wraps(f)
    def bounded(*args, **kwargs):
        _check_args(args[1:], kwargs, f"filter {f.__name__}")
        if f.__name__ == "do_format" and args:
            _check_format(args[-1] if isinstance(args[0], jinja2.runtime.Context) else args[0])
        return _check_size(f(*args, **kwargs), f"filter {f.__name__}")
    return bounded


class _Sandbox(jinja2.sandbox.SandboxedEnvironment):
    """Also bounds what one C-level step may make, which no deadline or length check
    interrupts: a `*` or `**` whose result would be huge (`{{ "x" * 10**10 }}`, an integer
    squared again and again), a `%` or `.format` with a huge width, a filter or method given a
    huge width (`center`, `indent`, `ljust`, `zfill`), or a call whose result is longer than a
    kernel's source may be (a `replace` doubling a string)."""

    intercepted_binops = frozenset({"*", "**", "%"})

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.filters = {name: _bounded_filter(f) for name, f in self.filters.items()}
        # Jinja's lorem-ipsum generator: `lipsum(10**6)` runs minutes in Jinja's own code (not
        # the template's frames, which the deadline watches), and no kernel needs it.
        self.globals.pop("lipsum", None)

    def call_binop(self, context, operator, left, right):
        ints = isinstance(left, int) and isinstance(right, int)
        if operator == "**" and ints and abs(left) > 1 and right * math.log10(abs(left)) > 4000:
            raise jinja2.sandbox.SecurityError(f"{left} ** {right} is too large a number")
        if operator == "*":
            if ints and left.bit_length() + right.bit_length() > 16384:
                raise jinja2.sandbox.SecurityError("a product of more than 16384 bits")
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_SOURCE_CHARS:
                    raise jinja2.sandbox.SecurityError(f"a sequence of {len(seq)} repeated {n} times is "
                                                       f"longer than a kernel's source may be")
        if operator == "%" and isinstance(left, str):
            _check_format(left)
        return _check_size(super().call_binop(context, operator, left, right), f"`{operator}`")

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - Jinja's signature
        name = getattr(__obj, "__name__", type(__obj).__name__)
        _check_args(args, kwargs, name)
        bound = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)  # the sandbox wraps str.format
        if name in ("format", "format_map") and isinstance(bound, str):
            _check_format(bound)
        return _check_size(super().call(__context, __obj, *args, **kwargs), name)


def _environment() -> jinja2.Environment:
    # Sandboxed: templates may come from a language model, and a plain Environment lets a
    # template reach Python internals (`''.__class__...`) in the tool's own process.
    return _Sandbox(undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                    trim_blocks=True, lstrip_blocks=True)


@functools.lru_cache(maxsize=64)
def _compiled(text: str) -> jinja2.Template:
    """A template compiled once per text, not on every render (a Template renders from many
    threads at once)."""
    return _environment().from_string(text)


def _check_template(text: str, path: str) -> None:
    try:
        _environment().parse(text)
    except jinja2.TemplateSyntaxError as e:
        raise SkeletonError(f"{path}:{e.lineno}: template syntax error: {e.message}") from None


def data_dir(name: str) -> Path:
    """`kernel_templates` or `spaces`: inside the installed package, else the checkout root."""
    here = Path(__file__).resolve().parents[1]  # the package
    for candidate in (here / name, here.parent / name):
        if candidate.is_dir():
            return candidate
    raise SkeletonError(f"cannot find the {name}/ folder next to {here}; is the package installed whole?")


def library_skeletons() -> dict[str, list[str]]:
    """op -> languages that the library has a skeleton for."""
    out: dict[str, list[str]] = {}
    for y in sorted(data_dir("spaces").glob("*/*.yaml")):
        out.setdefault(y.parent.name, []).append(y.stem)
    return out


def library_skeleton(op: str, language: str) -> Skeleton:
    spaces = data_dir("spaces")
    space_path = spaces / op / f"{language}.yaml"
    if not space_path.is_file():
        have = library_skeletons()
        raise SkeletonError(
            f"the library has no {language} skeleton for {op!r}; it has: "
            + ", ".join(f"{o} ({'/'.join(ls)})" for o, ls in have.items())
            + ". Write one and pass --template FILE --space FILE.")
    space = load_space(space_path)
    ext = EXTENSIONS.get(language, language)
    template_path = data_dir("kernel_templates") / op / f"{language}.{ext}.j2"
    return load_skeleton(template_path, space_path, language=language, name=f"{op}/{language}",
                         space=space)


def load_skeleton(template_path: str | Path, space_path: str | Path, language: str | None = None,
                  name: str = "", space: Space | None = None) -> Skeleton:
    """A user's skeleton from two files. The language comes from the space's `language:` key,
    else from the template's extension (.c.j2 -> c, .py.j2 -> triton)."""
    template_path, space_path = Path(template_path), Path(space_path)
    try:
        text = template_path.read_text()
    except OSError as e:
        raise SkeletonError(f"cannot read template {template_path}: {e.strerror}") from None
    if space is None:
        space = load_space(space_path)
    _check_template(text, str(template_path))
    lang = language or space.get_meta("language")
    if lang is None:
        suffixes = template_path.suffixes
        lang = {".c": "c", ".py": "triton"}.get(suffixes[-2] if len(suffixes) >= 2 else "", None)
    if lang not in EXTENSIONS:
        raise SkeletonError(f"{space_path}: set 'language:' to one of {', '.join(EXTENSIONS)} "
                            f"(could not tell it from {template_path.name})")
    return Skeleton(template=text, space=space, language=lang,
                    name=name or template_path.name.split(".")[0], template_path=str(template_path))


__all__ = ["Skeleton", "SkeletonError", "SpaceError", "library_skeleton", "load_skeleton",
           "library_skeletons", "data_dir"]


def template_line(template: str, rendered: str) -> tuple[int, str]:
    """(line number, text) of the template line that rendered the line `rendered`, or (0, "")
    when no single line can be named. Each template line is read as a pattern: its literal
    text exactly, each {{ expression }} any text (leading and trailing blanks ignored, as
    lstrip_blocks and indentation change them). Lines with only {% %} or {# #} render nothing.
    Several lines of one text (a loop body written twice) count as one when they are alike."""
    want = rendered.strip()
    if not want:
        return 0, ""
    hits: list[tuple[int, str, int]] = []
    for n, line in enumerate(template.splitlines(), 1):
        text = line.strip()
        parts = re.split(r"({{.*?}}|{%.*?%}|{#.*?#})", text)
        literals = [q for q in parts if not q.startswith("{")]
        if not "".join(literals).strip() and not any(q.startswith("{{") for q in parts):
            continue  # renders nothing of its own
        # Literal runs split by {{ }}: a glob with only '*', matched greedily (the leftmost
        # place for each middle run is always right for such a pattern): linear, unlike a
        # regex of many '.*?', which a line built for it can make take forever.
        runs, cur = [], ""
        for q in parts:
            if q.startswith("{{"):
                runs.append(cur)
                cur = ""
            elif not q.startswith("{"):
                cur += q
        runs.append(cur)
        if _glob_match(runs, want):
            hits.append((n, line.rstrip(), sum(len(r) for r in runs)))
    if not hits:
        return 0, ""
    best = max(h[2] for h in hits)  # the most literal text matched: the most specific line
    top = [h for h in hits if h[2] == best]
    if len({h[1].strip() for h in top}) > 1:
        return 0, ""
    return top[0][0], top[0][1]


def _glob_match(runs: list[str], text: str) -> bool:
    """Whether `text` is runs[0] + anything + runs[1] + ... + anything + runs[-1]."""
    if len(runs) == 1:
        return text == runs[0]
    head, tail = runs[0], runs[-1]
    if not (text.startswith(head) and text.endswith(tail) and len(head) + len(tail) <= len(text)):
        return False
    i, end = len(head), len(text) - len(tail)
    for r in runs[1:-1]:
        j = text.find(r, i, end)
        if j < 0:
            return False
        i = j + len(r)
    return True

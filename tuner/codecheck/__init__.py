"""Static checks of candidate kernel code: one checker per language, used by the skeleton
writer (before a model's skeleton is accepted) and by the backends (on every source they
compile), so a rule is written once and means the same in both places.

Contract: `check_source(language, source) -> list[Finding]`, empty when clean; findings carry
the line and a reason a model can act on. `require_clean` raises `Forbidden` with the first
finding (message "forbidden: <why> (line N)"), which a backend records as the config's
COMPILE_ERROR: the code is rejected before it runs, like a compiler rejecting a program.
Languages without a checker (`script`: the null and replay backends' text) pass.
"""

from __future__ import annotations

from tuner.codecheck.c import check_c, check_object
from tuner.codecheck.findings import Finding, Forbidden
from tuner.codecheck.python import CUDA, TRITON, TRITON_ASCEND, PythonPolicy, check_python
from tuner.codecheck.template import check_template

POLICIES = {"triton": TRITON, "triton_ascend": TRITON_ASCEND, "cuda": CUDA}

__all__ = ["CUDA", "Finding", "Forbidden", "PythonPolicy", "TRITON", "TRITON_ASCEND", "check_c", "check_object",
           "check_python", "check_source", "check_template", "require_clean"]


def check_source(language: str, source: str) -> list[Finding]:
    """The findings for one rendered source of a skeleton in `language`."""
    if language == "c":
        return check_c(source)
    if language in POLICIES:
        return check_python(source, POLICIES[language])
    return []


def require_clean(language: str, source: str) -> None:
    """Raise `Forbidden` (or SyntaxError, for Python that does not parse) naming the first
    finding; return when the source is clean."""
    findings = check_source(language, source)
    if findings:
        first = findings[0]
        if first.syntax:
            raise SyntaxError(first.why.removeprefix("Python syntax error: "), ("<kernel>", first.line, 0, first.text))
        raise Forbidden(f"forbidden: {first.why} (line {first.line})", findings)

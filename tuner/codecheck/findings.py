"""What a checker reports."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    line: int   # 1-based; 0 when the finding is about the whole source
    text: str   # the offending source line
    why: str    # what is wrong, in words a model can act on
    syntax: bool = False  # the source does not parse (nothing else was checked)

    def __str__(self) -> str:
        return f"line {self.line}: {self.why}\n    {self.text.strip()}"


class Forbidden(ValueError):
    """The source breaks the contract; the message names the first finding and its line."""

    def __init__(self, message: str, findings: list[Finding] | tuple[Finding, ...] = ()) -> None:
        super().__init__(message)
        self.findings = tuple(findings)


def source_line(source: str, n: int) -> str:
    lines = source.splitlines()
    return lines[n - 1] if 0 < n <= len(lines) else ""

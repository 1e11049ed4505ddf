"""A run directory as a Python object: its metadata, summary, records and rounds, the records
flattened (rows, CSV, Parquet, a pandas frame), its report. `tuner.Run` (tuner/api.py) and
`tuner show --csv/--parquet` read runs through it."""

from __future__ import annotations

import csv
import io
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.core.values import Record, RunMeta, Status
from tuner.run.store import Store


@dataclass(frozen=True)
class Run:
    """A run directory, read when asked (a run still going shows what it has so far)."""

    path: Path

    @classmethod
    def open(cls, path: str | Path) -> "Run":
        """The run at `path`; StoreError when it is not a run directory."""
        return cls(Store.open(path).path)

    @property
    def _store(self) -> Store:
        return Store(self.path)

    @property
    def meta(self) -> RunMeta:
        return self._store.meta()

    @property
    def summary(self) -> dict[str, Any] | None:
        """summary.json (what `tuner show` prints); None until the run has finished."""
        return self._store.read_json("summary.json")

    @property
    def records(self) -> list[Record]:
        """Every evaluated config, in the order they finished (a multi-round run: every
        round's, round by round)."""
        if self.meta.is_rounds:
            return [r for run in self.rounds for r in run.records]
        return sorted(self._store.records(), key=lambda r: r.time)

    @property
    def rounds(self) -> list["Run"]:
        """A multi-round run's rounds (each a run of its own); [] for a single run."""
        folder = self.path / "rounds"
        return [Run(p) for p in sorted(folder.glob("[0-9]*")) if (p / "run.json").is_file()] \
            if folder.is_dir() else []

    @property
    def best(self) -> dict[str, Any] | None:
        """The winner as the summary names it (config, median_s, iqr_s, ceiling, speedup...)."""
        return (self.summary or {}).get("best")

    @property
    def best_config(self) -> dict[str, Any] | None:
        best = self.best
        return dict(best["config"]) if best else None

    def rows(self) -> list[dict[str, Any]]:
        """The records flattened, one dict per record: round (multi-round runs), trial, status,
        median_s, iqr_s, samples, compile_s, max errors, the config's params as columns, the
        reason it failed, when it finished (unix seconds)."""
        out = []
        runs = self.rounds if self.meta.is_rounds else [self]
        for run in runs:
            for r in sorted(run._store.records(), key=lambda r: r.time):
                out.append(record_row(r, round_name=run.path.name if run is not self else None))
        return out

    def frame(self):
        """rows() as a pandas DataFrame (pandas is not a dependency: pip install pandas)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("Run.frame() needs pandas: pip install pandas (Run.rows() gives the "
                              "same rows as dicts)") from None
        return pd.DataFrame(self.rows())

    def to_csv(self, path: str | Path | None = None) -> str:
        """rows() as CSV, written to `path` when given; the text either way."""
        text = rows_csv(self.rows())
        if path is not None:
            Path(path).write_text(text)
        return text

    def to_parquet(self, path: str | Path) -> Path:
        """rows() as a Parquet file (needs pandas and pyarrow)."""
        frame = self.frame()
        try:
            frame.to_parquet(path, index=False)
        except ImportError as e:
            raise ImportError(f"Parquet needs pyarrow: pip install pyarrow ({e})") from None
        return Path(path)

    def report(self, out: str | Path | None = None) -> Path:
        """Write the HTML report (tuner.run.html) and return its path."""
        from tuner.run.html import write_report
        return write_report(self.path, out)

    def __repr__(self) -> str:
        best = self.best
        told = f", best {best['median_s'] * 1e6:.1f} us" if best else ""
        return f"Run({str(self.path)!r}{told})"


def record_row(r: Record, round_name: str | None = None) -> dict[str, Any]:
    m = r.measurement
    samples = list(m.samples)
    q = statistics.quantiles(samples, n=4) if len(samples) >= 2 else None
    row: dict[str, Any] = {}
    if round_name is not None:
        row["round"] = round_name
    row.update({"trial": r.trial, "status": r.status.value,
                "median_s": statistics.median(samples) if samples and r.status is Status.OK else None,
                "iqr_s": (q[2] - q[0]) if q else None, "samples": len(samples),
                "compile_s": r.build.compile_s, "max_abs_err": m.max_abs_err, "max_rel_err": m.max_rel_err})
    row.update({f"param.{k}": v for k, v in r.config.as_dict().items()})
    row.update({"reason": r.reason or "", "finished_unix": r.time, "device": r.device})
    return row


def rows_csv(rows: list[dict[str, Any]]) -> str:
    """CSV of `rows` with the union of their keys as columns (rounds may differ in params)."""
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    w.writeheader()
    for row in rows:
        w.writerow({k: ("" if v is None or (isinstance(v, float) and math.isnan(v)) else v)
                    for k, v in row.items()})
    return buf.getvalue()

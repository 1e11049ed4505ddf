"""The run directory: everything a search produced, append-only and resumable.

    runs/<id>/
      run.json        op, backend, device, toolchain, command line, settings, format version
      records.jsonl   one Record per line, flushed and fsynced as each one finishes
      skeleton/       the skeleton as used (template, space, skeleton.json)
      best/           the winner: kernel source with its config baked in, config.json
      summary.json    the final summary (`tuner show` reprints it)
      build/          compiled candidates; workers.log: what candidate code printed

A run killed at any point loses at most the evaluation that was in flight: records are
written before Optuna is told, and a torn last line (a kill mid-write) is dropped on read.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any, Iterator

from .values import Record

FORMAT_VERSION = 1


class StoreError(RuntimeError):
    """A run directory that cannot be created, read, or is from another format version."""


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Store:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    # ---- creating and opening ------------------------------------------------------------

    @classmethod
    def create(cls, runs_dir: str | Path, name: str) -> "Store":
        runs = Path(runs_dir)
        try:
            runs.mkdir(parents=True, exist_ok=True)
            probe = runs / f".probe-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
        except OSError as e:
            raise StoreError(f"cannot write to the runs directory {runs}: {e.strerror}; "
                             f"pass --runs-dir DIR or set TUNER_RUNS_DIR") from None
        base = re.sub(r"[^\w.=-]+", "_", name) + time.strftime("-%Y%m%d-%H%M%S")
        for i in range(1000):
            path = runs / (base if i == 0 else f"{base}-{i}")
            try:
                path.mkdir()
                return cls(path)
            except FileExistsError:
                continue
        raise StoreError(f"could not create a new run directory under {runs}")

    @classmethod
    def open(cls, path: str | Path) -> "Store":
        store = cls(path)
        meta_path = store.path / "run.json"
        if not meta_path.is_file():
            raise StoreError(f"{store.path} is not a run directory (no run.json); "
                             f"`tuner list` shows the runs")
        meta = store.meta()
        version = meta.get("format_version")
        if version != FORMAT_VERSION:
            raise StoreError(f"{store.path} was written by format version {version}; this tuner "
                             f"reads version {FORMAT_VERSION}. Re-run the search, or use the "
                             f"tuner version that wrote it.")
        return store

    # ---- files ---------------------------------------------------------------------------

    def meta(self) -> dict[str, Any]:
        try:
            return json.loads((self.path / "run.json").read_text())
        except (OSError, ValueError) as e:
            raise StoreError(f"{self.path}/run.json is unreadable: {e}") from None

    def write_meta(self, meta: dict[str, Any]) -> None:
        _atomic_write(self.path / "run.json", json.dumps({**meta, "format_version": FORMAT_VERSION},
                                                          indent=1, default=str))

    def write_json(self, name: str, data: Any) -> None:
        target = self.path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(target, json.dumps(data, indent=1, default=str))

    def read_json(self, name: str) -> Any:
        try:
            return json.loads((self.path / name).read_text())
        except FileNotFoundError:
            return None
        except ValueError as e:
            raise StoreError(f"{self.path / name} is unreadable: {e}") from None

    def write_text(self, name: str, text: str) -> Path:
        target = self.path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(target, text)
        return target

    # ---- records -------------------------------------------------------------------------

    def append(self, record: Record) -> None:
        line = json.dumps(record.to_json(), separators=(",", ":")) + "\n"
        with open(self.path / "records.jsonl", "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def records(self) -> list[Record]:
        return list(self._iter_records())

    def _iter_records(self) -> Iterator[Record]:
        path = self.path / "records.jsonl"
        if not path.exists():
            return
        with open(path) as f:
            lines = f.readlines()
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                yield Record.from_json(json.loads(line))
            except (ValueError, KeyError, TypeError):
                if i == len(lines) - 1:
                    continue  # torn by a kill mid-write; that evaluation will simply run again
                raise StoreError(f"{path}:{i + 1}: corrupt record line") from None

    def repair(self) -> None:
        """Drop a torn last line so that later appends start on a fresh line."""
        path = self.path / "records.jsonl"
        if not path.exists():
            return
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            with open(path, "r+b") as f:
                f.truncate(cut)


def list_runs(runs_dir: str | Path) -> list[tuple[Path, dict[str, Any], dict[str, Any] | None]]:
    out = []
    for p in sorted(Path(runs_dir).glob("*/run.json")):
        try:
            meta = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        summary = None
        try:
            summary = json.loads((p.parent / "summary.json").read_text())
        except (OSError, ValueError):
            pass
        out.append((p.parent, meta, summary))
    return out

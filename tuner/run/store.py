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

import contextlib
import errno
import fcntl
import json
import os
import re
import time
from pathlib import Path
from typing import Any, Iterator

from tuner.core.values import OpSpec, Record, RunMeta

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
            if (store.path / "sweep.json").is_file():  # a sweep's folder: its runs are its tasks
                raise StoreError(f"{store.path} is a sweep's folder, not a run: its runs are under "
                                 f"{store.path / 'tasks'} (`tuner list --runs-dir {store.path}` lists them)")
            raise StoreError(f"{store.path} is not a run directory (no run.json); "
                             f"`tuner list` shows the runs")
        version = store._meta_json().get("format_version")
        if version != FORMAT_VERSION:
            raise StoreError(f"{store.path} was written by format version {version}; this tuner "
                             f"reads version {FORMAT_VERSION}. Re-run the search, or use the "
                             f"tuner version that wrote it.")
        store.meta()  # every run.json has an op and a backend: one cut short or edited by hand says so
        return store

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the run for this process while it searches. Two processes resuming one run
        at once would evaluate the same configs twice, append records under the same trial
        numbers and time their candidates against each other. The lock is the kernel's
        (flock): it goes with the process, even one killed with SIGKILL."""
        path = self.path / ".lock"
        try:
            f = open(path, "a+")
        except OSError as e:
            raise StoreError(f"cannot write {path}: {e.strerror}") from None
        with f:
            busy = False
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                # Any other error: a file system without locks (some network mounts); run unlocked.
                busy = e.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES)
            if busy:
                f.seek(0)
                holder = f.read().strip()
                raise StoreError(f"{self.path} is in use by another tuner process"
                                 + (f" (pid {holder})" if holder.isdigit() else "")
                                 + "; wait for it to finish or stop it, then resume the run")
            f.seek(0)
            f.truncate()
            f.write(str(os.getpid()))
            f.flush()
            yield

    # ---- files ---------------------------------------------------------------------------

    def _meta_json(self) -> dict[str, Any]:
        try:
            meta = json.loads((self.path / "run.json").read_text())
        except (OSError, ValueError) as e:
            raise StoreError(f"{self.path}/run.json is unreadable: {e}") from None
        if not isinstance(meta, dict):
            raise StoreError(f"{self.path}/run.json is damaged: a JSON object was expected, "
                             f"found a {type(meta).__name__}")
        return meta

    def meta(self) -> RunMeta:
        """The run's `run.json`; StoreError when it is unreadable or damaged."""
        try:
            return RunMeta.from_json(self._meta_json())
        except ValueError as e:
            raise StoreError(f"{self.path}/run.json is damaged: {e}; re-run the search") from None

    PROBLEM_COPY = "problem.py"  # a problem file's op: the file as it was when the run began

    def op_spec(self):
        """The run's OpSpec (run.json's `op`). A problem file moved or deleted since the run
        began is read from the run's own copy of it, so that a resume, a retune or the
        feedback still has the op's reference."""
        spec = self.meta().op
        copy = self.path / self.PROBLEM_COPY
        if spec.kind == "kernelbench" and not Path(spec.source).is_file() and copy.is_file():
            return OpSpec(spec.name, str(copy), spec.sizes, spec.dtype, spec.kind)
        return spec

    def write_meta(self, meta: RunMeta) -> None:
        _atomic_write(self.path / "run.json", json.dumps({**meta.to_json(), "format_version": FORMAT_VERSION},
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
        except (OSError, ValueError) as e:
            raise StoreError(f"{self.path / name} is unreadable: {e}") from None

    def skeleton(self):
        """The skeleton the run searches (skeleton/skeleton.json), or a StoreError that says so:
        a run cannot be resumed or explained without it."""
        from tuner.core.skeleton import Skeleton
        data = self.read_json("skeleton/skeleton.json")
        if data is None:
            raise StoreError(f"{self.path}/skeleton/skeleton.json is missing; this run cannot be "
                             f"resumed: re-run the search")
        try:
            return Skeleton.from_json(data)
        except Exception as e:  # a damaged file may fail anywhere in the parse
            raise StoreError(f"{self.path}/skeleton/skeleton.json is damaged ({type(e).__name__}: "
                             f"{e}); re-run the search") from None

    def write_text(self, name: str, text: str) -> Path:
        target = self.path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(target, text)
        return target

    # ---- records -------------------------------------------------------------------------

    def append(self, record: Record) -> None:
        line = json.dumps(record.to_json(), separators=(",", ":")) + "\n"
        try:
            with open(self.path / "records.jsonl", "a") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise StoreError(f"cannot append to {self.path / 'records.jsonl'}: {e.strerror}") from None

    def records(self) -> list[Record]:
        return list(self._iter_records())

    def _iter_records(self) -> Iterator[Record]:
        path = self.path / "records.jsonl"
        if not path.exists():
            return
        try:
            with open(path, errors="replace") as f:
                lines = f.readlines()
        except OSError as e:
            raise StoreError(f"{path} is unreadable: {e.strerror}") from None
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
        """Drop a torn last line so that later appends start on a fresh line. A last line that
        does not parse is dropped even when it ends in a newline: the reader skips it as torn,
        but once appends follow it, it is a corrupt line in the middle and the run cannot be
        read. A whole last record that only lost its newline is kept."""
        path = self.path / "records.jsonl"
        if not path.exists():
            return
        try:
            data = path.read_bytes()
        except OSError as e:
            raise StoreError(f"{path} is unreadable: {e.strerror}") from None
        body = data.rstrip(b"\n")
        start = body.rfind(b"\n") + 1
        last = body[start:]
        if not last.strip():
            return
        try:
            Record.from_json(json.loads(last))
        except (ValueError, KeyError, TypeError):
            with open(path, "r+b") as f:
                f.truncate(start)
            return
        if not data.endswith(b"\n"):  # a whole record whose newline was lost: keep it
            with open(path, "ab") as f:
                f.write(b"\n")


def list_runs(runs_dir: str | Path) -> list[tuple[Path, RunMeta, dict[str, Any] | None]]:
    """The runs directly under `runs_dir` (for a sweep's folder: its tasks), by name; a run
    whose run.json cannot be read is left out."""
    runs_dir = Path(runs_dir)
    if (runs_dir / "sweep.json").is_file():
        runs_dir = runs_dir / "tasks"
    out = []
    for p in sorted(runs_dir.glob("*/run.json")):
        try:
            meta = RunMeta.from_json(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
        summary = None
        try:
            summary = json.loads((p.parent / "summary.json").read_text())
        except (OSError, ValueError):
            pass
        out.append((p.parent, meta, summary))
    return out



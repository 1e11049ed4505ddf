"""What runs inside Ray's worker processes for the Ray executor (tuner.exec.ray_executor, the
driver side): the compile tasks' bodies (`compile_in_task`, `warm_in_task`), each Ray worker
process keeping its own compile `Worker`s, and `DeviceActor`, one device's benchmark `Worker`
behind a Ray actor. The driver wraps these with `ray.remote`; Ray imports this module in its
workers, which is why it imports nothing of Ray at module level."""

from __future__ import annotations

import collections
import json
import os
import time
from pathlib import Path
from typing import Any

from tuner.backends import get_backend
from tuner.core.settings import Settings
from tuner.core.values import Status
from tuner.exec.worker import COMPILE_NICE, Worker, WorkerError, WorkerFailure

FILES_LIMIT = 64 * 2**20  # build folders larger than this are not shipped between nodes


def _apply_env(env: dict[str, str | None]) -> None:
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _read_files(folder: str) -> dict[str, bytes] | None:
    """The plain files of a build folder (not recursive), or None when it is too large."""
    out, total = {}, 0
    try:
        for p in Path(folder).iterdir():
            if p.is_file():
                total += p.stat().st_size
                if total > FILES_LIMIT:
                    return None
                out[p.name] = p.read_bytes()
    except OSError:
        return None
    return out


def _materialize(artifact: str | None, files_ref: list | None) -> None:
    """Write a build folder shipped from another node, when this node does not have it."""
    if not artifact or not files_ref or os.path.exists(artifact):
        return
    import ray
    files = ray.get(files_ref[0])
    if not files:
        return
    folder = Path(artifact).parent
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        tmp = folder / f".{name}.tmp{os.getpid()}"
        tmp.write_bytes(data)
        os.replace(tmp, folder / name)


_COMPILE_WORKERS: "collections.OrderedDict[str, Worker]" = collections.OrderedDict()
_COMPILE_WORKERS_MAX = 4  # distinct (backend, options) per Ray worker process


def _compile_worker(backend: str, options: dict, settings: Settings, log_path: str | None,
                    limit_memory: bool) -> Worker:
    """This Ray worker process's compile Worker for (backend, options), kept across tasks so
    the backend is imported once per process."""
    key = json.dumps([backend, options, log_path], sort_keys=True, default=str)
    worker = _COMPILE_WORKERS.pop(key, None)
    if worker is None:
        worker = Worker(backend, 0, options, settings, log_path, limit_memory, COMPILE_NICE)
    _COMPILE_WORKERS[key] = worker
    while len(_COMPILE_WORKERS) > _COMPILE_WORKERS_MAX:
        _COMPILE_WORKERS.popitem(last=False)[1].close()
    return worker


def compile_in_task(backend: str, options: dict, settings: Settings, log_path: str | None,
                    env: dict, source: str, op: dict, workdir: str, limit_memory: bool):
    """Body of a compile task: compile `source` (a kernel of the op `op`, as JSON) in this Ray
    worker process's own Worker. Returns two values: the outcome and the build folder's files."""
    _apply_env(env)
    # The op travels with each request, not in the worker's options: a sweep interleaves its
    # ops on every compile process, and a worker per op (a Python with torch and Triton
    # imported, seconds to start) thrashed the cache above and bounded the sweep's rate.
    options = {k: v for k, v in options.items() if k != "op"}
    worker = _compile_worker(backend, options, settings, log_path, limit_memory)
    try:
        build = worker.call("compile", timeout=settings.compile_timeout_s + 15, source=source,
                            workdir=workdir, timeout_s=settings.compile_timeout_s, op=op)
    except WorkerFailure as e:
        return ("failure", e.kind, e.reason), None
    except WorkerError as e:
        return ("error", str(e)), None
    files = _read_files(workdir) if build.status is Status.OK else None
    return ("ok", build), files


def warm_in_task(backend: str, options: dict, settings: Settings, log_path: str | None,
                 env: dict, limit_memory: bool) -> int:
    """Body of a warm-up task: start this Ray worker process's compile Worker and import the
    backend's compiler in it, so that a sweep's first compiles do not each pay for a Python
    with torch and Triton starting (tens of seconds when every CPU starts one at once)."""
    _apply_env(env)
    if log_path:  # the run folder may not exist yet: the warm-up runs before any task starts
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    options = {k: v for k, v in options.items() if k != "op"}
    _compile_worker(backend, options, settings, log_path, limit_memory).call("warm", timeout=300)
    return os.getpid()


def warm_options(backend: str, settings: Settings) -> dict:
    """The options of the compile Workers that the warm-up starts: an evaluator's compile
    options less the op (which compile tasks strip), so that its compiles find them."""
    options: dict = {"cache_dir": settings.cache_dir}
    try:  # the backend's compile options (cuda: the device's arch), asked here as evaluators do
        options.update(get_backend(backend, 0, **options).compile_options())
    except Exception:  # noqa: BLE001 - no device here: the evaluators will say so
        pass
    return options


class DeviceActor:
    """One device (or, for cpu/null, one CPU worker): a benchmark Worker behind a Ray actor."""

    def __init__(self, backend: str, device: int, settings: Settings, log_path: str | None,
                 env: dict, limit_memory: bool):
        _apply_env(env)
        self.backend, self.device, self.settings = backend, device, settings
        self.log_path, self.limit_memory = log_path, limit_memory
        self.worker: Worker | None = None
        self.key = ""
        self.served_s = 0.0  # seconds inside requests, as this actor sees them (see stats)
        self.calls = 0
        self.serving = 0  # requests in hand (the actor takes two at once; its Worker one)
        if log_path:
            Path(log_path).parent.mkdir(parents=True, exist_ok=True)

    def ready(self) -> dict[str, Any]:
        import ray
        ctx = ray.get_runtime_context()
        # What the benchmark Worker will inherit (it sees only these devices): a check that
        # two actors really time on two devices.
        visible = {k: os.environ[k] for k in ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES")
                   if k in os.environ}
        return {"pid": os.getpid(), "node": ctx.get_node_id(), "visible": visible,
                "accelerators": {k: list(v) for k, v in ctx.get_accelerator_ids().items() if v}}

    def call(self, options: dict, method: str, timeout: float, files: dict | None = None,
             **kwargs):
        # The op in the options is for compiling ahead; measuring takes it per request, so one
        # benchmark Worker serves every op of a sweep.
        opts = {k: v for k, v in options.items() if k != "op"}
        key = json.dumps(opts, sort_keys=True, default=str)
        if self.worker is None or key != self.key:
            if self.worker is not None:
                self.worker.close()
            self.worker = Worker(self.backend, self.device, opts, self.settings, self.log_path,
                                 self.limit_memory)
            self.key = key
        t0 = time.monotonic()
        self.serving += 1
        try:
            for a in [kwargs.get("artifact"), *(kwargs.get("artifacts") or ())]:
                _materialize(a, (files or {}).get(a))
            return ("ok", self.worker.call(method, timeout=timeout, **kwargs))
        except WorkerFailure as e:
            return ("failure", e.kind, e.reason)
        except WorkerError as e:
            return ("error", str(e))
        finally:
            self.served_s += time.monotonic() - t0
            self.calls += 1
            self.serving -= 1

    def stats(self) -> dict[str, float]:
        """Seconds spent serving requests here, and how many: set beside the driver's own
        count (request sent to answer received), the difference is time in Ray and the driver."""
        out: dict[str, float] = {"served_s": self.served_s, "calls": self.calls,
                                 "actor_cpu_s": time.process_time()}
        pid = self.worker_pid()
        if pid is not None:  # CPU seconds of the benchmark Worker: near served_s, the host's
            try:  # side (launches, Python) bounds the measurements, not the device
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                out["worker_cpu_s"] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            except (OSError, ValueError, IndexError):
                pass  # not Linux, or it just ended
        if self.worker is not None and self.worker.proc is not None and not self.serving:
            try:  # where its benchmark Worker's measurements spent their time (when it is idle:
                # a Worker answers one caller at a time)
                out.update(self.worker.call("stats", timeout=30))
            except (WorkerFailure, WorkerError):
                pass
        return out

    def worker_pid(self) -> int | None:
        w = self.worker
        return w.proc.pid if w is not None and w.proc is not None else None

    def worker_deaths(self) -> int:
        return self.worker.deaths if self.worker is not None else 0

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()

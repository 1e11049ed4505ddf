"""Runners: where an Evaluator's requests run. The Evaluator decides what to ask and what an
answer or a failure means; a runner only carries a request to a compile process or to a
device's benchmark process and brings the answer back.

Contract (every runner; tests/conformance/test_runners.py holds each to it):

* `compile(source, op_json, workdir, timeout_s) -> Build` compiles in a compile process (the
  worker protocol's `compile`: tuner/exec/worker.py). A compile that fails is a `Build` with
  its status, not an exception.
* `device(method, timeout, what, **request)` runs one request of the worker protocol
  (`measure`, `time_reference`, `device_info`, `recheck`, `time_many`) in a benchmark process,
  on whichever device is free, and returns its value. `what` names the request for progress
  and fault reports.
* Both raise `WorkerFailure` when the process serving the request failed it: kind `timeout`
  (no answer within the limit; the process was ended) or `crash` (the process died under the
  request, or its runner lost it). Both raise `WorkerError` for a fault of the tool itself.
  A runner never retries: the retry rule is the Evaluator's, one rule for every runner.
* `exclusive` is a lock to hold around every request when the backend's timing must have the
  machine to itself (cpu: a compile beside a timing slows the timing), or None.
* `default_parallel`: how many evaluations keep this runner busy, or None (the settings' count
  of compile workers).
* `timing_slots`: how many `device` requests run at once (one per device): a search keeps one
  evaluation in flight per slot beside those compiling (`pace.in_flight_cap`).
* `retried()` is told each time a request is sent again after a process died under it; the
  count is `retries`.
* `warm_up()` starts compile processes ahead of the first compile (not before a timing that
  must have the machine to itself); `close()` ends what this runner owns and waits for its
  requests in flight on what it borrowed.
"""

from __future__ import annotations

import json
import queue
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tuner.core.settings import Settings
from tuner.core.values import Build
from tuner.exec.worker import COMPILE_NICE, Worker


@dataclass(frozen=True)
class Placement:
    """What a runner is told to serve one evaluator. `options` go to the benchmark processes
    (with the op: the sim models the reference's time from it), `compile_options` to the
    compile processes (Backend.compile_options: what they are told instead of asking the
    device)."""
    backend: str
    devices: tuple[int, ...]
    options: dict = field(hash=False)
    compile_options: dict = field(hash=False)
    limit_memory: bool
    exclusive_timing: bool
    log_path: str


class Runner(Protocol):
    exclusive: threading.Lock | None
    default_parallel: int | None
    timing_slots: int
    retries: int

    def compile(self, source: str, op_json: str, workdir: str, timeout_s: float) -> Build: ...

    def device(self, method: str, timeout: float, what: str, **request: Any) -> Any: ...

    def retried(self) -> None: ...

    def warm_up(self, op_json: str | None = None) -> None:
        """Start the compile processes' preparation in the background and return: they import
        their compiler (and with `op_json`, work out the shapes its kernels compile for)."""

    def close(self) -> None: ...


class LocalRunner:
    """Worker processes on this machine: a pool of compile workers (one per CPU core by
    default) and one benchmark worker per device, so a compile never queues behind a timing.
    The workers are its own, or borrowed from `WorkerPools` (then `close` gives them back
    idle: the next run must not share one with a request still in flight)."""

    default_parallel = None

    def __init__(self, placement: Placement, settings: Settings,
                 workers: tuple[list[Worker], list[Worker]] | None = None):
        p = placement
        self.owned = workers is None
        if workers is None:
            self.compilers = [Worker(p.backend, p.devices[0], p.compile_options, settings, p.log_path,
                                     p.limit_memory, COMPILE_NICE) for _ in range(settings.n_compile_workers)]
            self.bench_workers = [Worker(p.backend, d, p.options, settings, p.log_path, p.limit_memory)
                                  for d in p.devices]
        else:
            self.compilers, self.bench_workers = workers
        self.timing_slots = max(1, len(self.bench_workers))
        self._compilers: queue.Queue[Worker] = queue.Queue()
        for w in self.compilers:
            self._compilers.put(w)
        self._benchers: queue.Queue[Worker] = queue.Queue()
        for w in self.bench_workers:
            self._benchers.put(w)
        self.exclusive = threading.Lock() if p.exclusive_timing else None
        self.retries = 0
        self._lock = threading.Lock()
        self._warming: list[threading.Thread] = []

    def compile(self, source: str, op_json: str, workdir: str, timeout_s: float) -> Build:
        with self._take(self._compilers) as worker:
            return worker.call("compile", timeout=timeout_s + 15, source=source, workdir=workdir,
                               timeout_s=timeout_s, op=op_json)

    def device(self, method: str, timeout: float, what: str, **request: Any) -> Any:
        with self._take(self._benchers) as worker:
            return worker.call(method, timeout=timeout, **request)

    def retried(self) -> None:
        with self._lock:
            self.retries += 1

    def warm_up(self, op_json: str | None = None) -> None:
        if self.exclusive is not None:
            return

        def warm() -> None:
            with self._take(self._compilers) as w:
                try:
                    w.call("warm", timeout=300, op=op_json)
                except Exception:  # noqa: BLE001 - the first compile starts it again and says why
                    pass
        self._warming = [threading.Thread(target=warm, daemon=True) for _ in self.compilers]
        for t in self._warming:
            t.start()

    def close(self) -> None:
        if self.owned:
            for w in self.bench_workers + self.compilers:
                w.close()  # also ends a request in flight (a run stopped early, Ctrl-C)
            for t in self._warming:
                t.join(timeout=30)
            return
        # Borrowed: every worker back in its queue (idle) before the next run takes them.
        for workers, q in ((self.bench_workers, self._benchers), (self.compilers, self._compilers)):
            for _ in workers:
                q.get()
        for t in self._warming:
            t.join(timeout=30)

    @contextmanager
    def _take(self, q: queue.Queue[Worker]):
        worker = q.get()
        try:
            yield worker
        finally:
            q.put(worker)


class WorkerPools:
    """Worker processes shared by runs that follow one another (the tasks of a local sweep): a
    Python with torch and Triton imported, on a GPU with a CUDA context, takes seconds to start,
    once per sweep instead of once per task. The op travels with each request; workers are
    keyed by backend, devices and the other options. `runner` is a runner factory for the
    Evaluator; `close` ends the workers."""

    def __init__(self, settings: Settings, log_path: str | Path):
        self.settings, self.log_path = settings, str(log_path)
        self._pools: dict[str, tuple[list[Worker], list[Worker]]] = {}
        self._lock = threading.Lock()

    def runner(self, placement: Placement, settings: Settings) -> LocalRunner:
        return LocalRunner(placement, settings, self.get(placement))

    def get(self, p: Placement) -> tuple[list[Worker], list[Worker]]:
        """(compile workers, one benchmark worker per device) for this placement."""
        opts = {k: v for k, v in p.options.items() if k != "op"}
        copts = {k: v for k, v in p.compile_options.items() if k != "op"}
        key = json.dumps([p.backend, list(p.devices), opts, copts], sort_keys=True, default=str)
        with self._lock:
            if key not in self._pools:
                s, log = self.settings, self.log_path
                compilers = [Worker(p.backend, p.devices[0], copts, s, log, p.limit_memory, COMPILE_NICE)
                             for _ in range(s.n_compile_workers)]
                benchers = [Worker(p.backend, d, opts, s, log, p.limit_memory) for d in p.devices]
                self._pools[key] = (compilers, benchers)
            return self._pools[key]

    def close(self) -> None:
        with self._lock:
            for compilers, benchers in self._pools.values():
                for w in compilers + benchers:
                    w.close()
            self._pools.clear()

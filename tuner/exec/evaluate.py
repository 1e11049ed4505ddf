"""The Evaluator: config -> Record. Check constraints and resources, render, compile, verify, time.

Compilation runs in a pool of killable worker processes (one per CPU core by default) and
timing in one long-lived benchmark worker per device, so a compile never queues behind a
timing. Backends whose timing runs on the same cores as the compiler (cpu) serialise the two.
`evaluate` is thread-safe: the searcher calls it from several threads at once.

A candidate's fault is always a Record; only faults of the tool raise.
"""

from __future__ import annotations

import hashlib
import json
import queue
import threading
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Callable

from tuner.backends import get_backend
from tuner.core.ops import load_op, render_context
from tuner.core.settings import Settings
from tuner.core.skeleton import Skeleton, SkeletonError
from tuner.core.values import Build, Config, DeviceInfo, Measurement, OpSpec, Record, Status
from tuner.exec.worker import COMPILE_NICE, Worker, WorkerFailure


class WorkerPools:
    """Worker processes shared by runs that follow one another (the tasks of a local sweep): a
    Python with torch and Triton imported, on a GPU with a CUDA context, takes seconds to start,
    once per sweep instead of once per task. The op travels with each request; workers are
    keyed by backend, devices and the other options. `close` ends them."""

    def __init__(self, settings: Settings, log_path: str | Path):
        self.settings, self.log_path = settings, str(log_path)
        self._pools: dict[str, tuple[list[Worker], list[Worker]]] = {}
        self._lock = threading.Lock()

    def get(self, backend: str, devices: tuple[int, ...], options: dict,
            limit_memory: bool, compile_options: dict | None = None) -> tuple[list[Worker], list[Worker]]:
        """(compile workers, one benchmark worker per device); `compile_options`: the compile
        workers' on top of `options` (Backend.compile_options)."""
        opts = {k: v for k, v in options.items() if k != "op"}
        copts = {**opts, **(compile_options or {})}
        key = json.dumps([backend, list(devices), opts, copts], sort_keys=True, default=str)
        with self._lock:
            if key not in self._pools:
                s, log = self.settings, self.log_path
                compilers = [Worker(backend, devices[0], copts, s, log, limit_memory, COMPILE_NICE)
                             for _ in range(s.n_compile_workers)]
                benchers = [Worker(backend, d, opts, s, log, limit_memory) for d in devices]
                self._pools[key] = (compilers, benchers)
            return self._pools[key]

    def close(self) -> None:
        with self._lock:
            for compilers, benchers in self._pools.values():
                for w in compilers + benchers:
                    w.close()
            self._pools.clear()


class Evaluator:
    def __init__(self, backend: str, spec: OpSpec, skeleton: Skeleton, settings: Settings,
                 workdir: str | Path, devices: tuple[int, ...] = (0,), options: dict | None = None,
                 workers: WorkerPools | None = None):
        self.backend_name, self.spec, self.skeleton, self.settings = backend, spec, skeleton, settings
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        # The op goes with every compile request (`Backend.compile`); the benchmark workers are
        # also told it (the sim models the reference's time from it).
        self.options = {"cache_dir": settings.cache_dir, "op": spec.to_json(), **(options or {})}
        device = devices[0]
        self.backend = get_backend(backend, device, **self.options)  # parent side: context, limits
        self.op = load_op(spec)
        self.context = {**render_context(self.op), **self.backend.render_context(self.op)}
        self.limits = self.backend.limits()
        # What the compile workers are told instead of asking the device (Backend.compile_options).
        self.compile_options = {**{k: v for k, v in self.options.items() if k != "op"},
                                **self.backend.compile_options()}
        log = str(self.workdir / "workers.log")
        limit_mem = self.backend.limit_memory
        # Borrowed workers (a sweep's) outlive this evaluator; its own end with it.
        self._owns_workers = workers is None
        if workers is not None:
            compilers, self.bench_workers = workers.get(backend, tuple(devices), self.options, limit_mem,
                                                        self.backend.compile_options())
        else:
            compilers = [Worker(backend, device, self.compile_options, settings, log, limit_mem, COMPILE_NICE)
                         for _ in range(settings.n_compile_workers)]
            # One benchmark worker per device; a measurement takes whichever is free.
            self.bench_workers = [Worker(backend, d, self.options, settings, log, limit_mem) for d in devices]
        self._compilers: queue.Queue[Worker] = queue.Queue()
        for w in compilers:
            self._compilers.put(w)
        self._benchers: queue.Queue[Worker] = queue.Queue()
        for w in self.bench_workers:
            self._benchers.put(w)
        self._quiet = threading.Lock() if self.backend.exclusive_timing else None
        self._warming: list[threading.Thread] = []  # see warm_up
        self._by_source: dict[str, tuple[Build, Measurement]] = {}
        self._source_lock = threading.Lock()
        self.device_info: DeviceInfo | None = None
        self.device_done: float | None = None  # time.monotonic() when the device facts came
        self._device_ready = threading.Event()  # set when they came (or failed to)
        self.reference_samples: list[float] = []
        self.reference_s: float | None = None
        self.reference_done: float | None = None  # time.monotonic() when it was timed
        self._reference_thread: threading.Thread | None = None  # see start(wait=False)
        self._reference_error: BaseException | None = None

    # ---- set-up ------------------------------------------------------------------------

    def start(self, wait: bool = True,
              on_device: Callable[[DeviceInfo], None] | None = None) -> DeviceInfo | None:
        """Device facts (measured ceilings included) and the reference's time, once per run.

        wait=False returns at once and takes both in the background: the first compiles
        overlap them (on a GPU the benchmark process's start and the device facts took 7-8 s
        of a 26 s run before any compile was asked for), no candidate is measured before both
        are in (evaluate waits), and a record waits for the device facts, which name the
        device. A backend whose timing must have the machine to itself (cpu) always waits: a
        compile beside the reference would slow the reference. `on_device` is called with the
        facts as soon as they are in (the run's metadata keeps them)."""
        if wait or self._quiet is not None:
            self._take_device_info(on_device)
            self._take_reference()
            return self.device_info

        def run() -> None:
            try:
                self._take_device_info(on_device)
                self._take_reference()
            except BaseException as e:  # noqa: BLE001 - raised again where it is waited for
                self._reference_error = e
            finally:
                self._device_ready.set()  # a record waiting for the facts goes on without them
        self._reference_thread = threading.Thread(target=run, daemon=True, name="device and reference")
        self._reference_thread.start()
        return None

    def _take_device_info(self, on_device=None) -> None:
        self.device_info = self._device_info()
        self.device_done = time.monotonic()
        if on_device is not None:
            on_device(self.device_info)
        self._device_ready.set()

    def wait_reference(self) -> None:
        """Block until the reference is timed; its failure is the run's, raised here."""
        t = self._reference_thread
        if t is not None:
            t.join()
        if self._reference_error is not None:
            raise self._reference_error

    def _take_reference(self) -> None:
        samples = self._time_reference()
        self.reference_samples = samples
        self.reference_s = sorted(samples)[len(samples) // 2]
        self.reference_done = time.monotonic()

    def _device_info(self) -> DeviceInfo:
        with self._bencher() as worker:
            return worker.call("device_info", timeout=600)

    def _time_reference(self) -> list[float]:
        with self._bencher() as worker:
            return worker.call("time_reference", timeout=max(600, self.settings.run_timeout_s),
                               spec=self.spec, settings=self.settings)

    def warm_up(self) -> None:
        """Start the compile workers (a Python importing the backend's compiler, each) in the
        background, so that their start overlaps `start` (device facts, the reference timed)
        instead of following it: on a GPU the first evaluation came ~12 s after the reference
        was timed, most of it compile workers starting. Not for backends whose timing must
        not share the machine (cpu): starting processes would disturb the reference."""
        if self._quiet is not None:
            return

        def warm() -> None:
            w = self._compilers.get()
            try:
                w.call("warm", timeout=300)
            except Exception:  # noqa: BLE001 - the first compile starts it again and says why
                pass
            finally:
                self._compilers.put(w)
        self._warming = [threading.Thread(target=warm, daemon=True) for _ in range(self._compilers.qsize())]
        for t in self._warming:
            t.start()

    def close(self) -> None:
        reference = self._reference_thread
        if reference is not None and not self._owns_workers:
            # A sweep's workers: the next task must not share one with a reference still timed.
            reference.join(timeout=max(600, self.settings.run_timeout_s) + 30)
        for t in self._warming:
            t.join(timeout=310)  # every worker is back in its queue before the queue is closed
        if not self._owns_workers:
            return
        for w in self.bench_workers:
            w.close()  # also ends a reference still being timed (a run stopped early, Ctrl-C)
        while not self._compilers.empty():
            self._compilers.get().close()
        if reference is not None:
            reference.join(timeout=30)

    # ---- one config --------------------------------------------------------------------

    def check(self, config: Config) -> str | None:
        return self.skeleton.space.check(config, self.context, self.limits)

    def evaluate(self, config: Config, best_s: float | None = None, trial: int = -1) -> Record:
        why = self.check(config)
        if why is not None:
            return self._record(config, Build(Status.INVALID, error=why), Measurement(Status.INVALID), trial)
        try:
            source = self.skeleton.render(config, self.context)
        except SkeletonError as e:
            build = Build(Status.COMPILE_ERROR, error=f"template did not render: {e}")
            return self._record(config, build, Measurement(Status.COMPILE_ERROR), trial)
        digest = hashlib.sha256(source.encode()).hexdigest()[:16]
        with self._source_lock:
            seen = self._by_source.get(digest)
        if seen is not None:  # another config rendered to the very same source
            build, meas = seen
            return self._record(config, build, meas, trial, note="same source as an earlier config")
        build = self.compile(source, digest)
        if build.status is not Status.OK:
            meas = Measurement(build.status)
        else:
            self.wait_reference()
            meas = self.measure(build, best_s)
        if meas.status is not Status.RUN_TIMEOUT:  # a hang may be load-dependent; allow a retry
            with self._source_lock:
                self._by_source[digest] = (build, meas)
        return self._record(config, build, meas, trial)

    def compile(self, source: str, digest: str) -> Build:
        worker = self._compilers.get()
        try:
            with self._quiet or nullcontext():
                return worker.call("compile", timeout=self.settings.compile_timeout_s + 15,
                                   source=source, workdir=str(self.workdir / "build" / digest),
                                   timeout_s=self.settings.compile_timeout_s, op=self.options["op"])
        except WorkerFailure as e:
            status = Status.COMPILE_TIMEOUT if e.kind == "timeout" else Status.COMPILE_ERROR
            return Build(status, error=f"compiler: {e.reason}")
        finally:
            self._compilers.put(worker)

    def measure(self, build: Build, best_s: float | None = None) -> Measurement:
        with self._bencher() as worker, self._quiet or nullcontext():
            try:
                return worker.call(
                    "measure", timeout=self.settings.run_timeout_s, artifact=build.artifact,
                    spec=self.spec, settings=self.settings, best_s=best_s,
                    reference_s=self.reference_s)
            except WorkerFailure as e:
                if e.kind == "timeout":
                    return Measurement(Status.RUN_TIMEOUT, detail=f"kernel hung: {e.reason}")
                return Measurement(Status.RUNTIME_ERROR, detail=f"kernel crashed: {e.reason}")

    def artifact(self, record: Record) -> str:
        """The record's compiled kernel, found from this process's directory (see `artifact_in`),
        or compiled again from its config when it is gone (a run whose build/ was deleted to
        save space, then resumed: the re-timing of the top configs failed on it)."""
        path = artifact_in(self.workdir, record.build.artifact)
        if Path(path).exists() or not ("build" in Path(path).parts):
            return path
        try:
            source = self.skeleton.render(record.config, self.context)
        except SkeletonError:
            return path
        build = self.compile(source, hashlib.sha256(source.encode()).hexdigest()[:16])
        return build.artifact if build.status is Status.OK else path

    def retime(self, records: list[Record]) -> list[list[float]] | None:
        """The top few, re-timed interleaved in one worker so that drift hits all alike.
        None when that fails (a kernel that passed once and then hung): keep the first times."""
        artifacts = [self.artifact(r) for r in records]
        with self._bencher() as worker, self._quiet or nullcontext():
            try:
                return worker.call("time_many", timeout=self.settings.run_timeout_s * len(records),
                                              artifacts=artifacts, spec=self.spec, settings=self.settings)
            except WorkerFailure:
                return None

    def recheck(self, record: Record) -> str | None:
        with self._bencher() as worker, self._quiet or nullcontext():
            try:
                return worker.call("recheck", timeout=self.settings.run_timeout_s,
                                              artifact=self.artifact(record), spec=self.spec)
            except WorkerFailure as e:
                return f"re-check failed: {e.reason}"

    @contextmanager
    def _bencher(self):
        worker = self._benchers.get()
        try:
            yield worker
        finally:
            self._benchers.put(worker)

    @property
    def bench_worker(self) -> Worker:
        return self.bench_workers[0]

    def _record(self, config: Config, build: Build, meas: Measurement, trial: int,
                note: str = "") -> Record:
        if note and meas.status is Status.OK:
            meas = Measurement(meas.status, meas.samples, meas.max_abs_err, meas.max_rel_err,
                               (meas.detail + "; " if meas.detail else "") + note)
        if self._reference_thread is not None and meas.status is not Status.INVALID:
            # A compile failure can come before the device facts. (A config the formulas
            # reject never reached a device: its record does not hold up the search loop.)
            self._device_ready.wait()
        info = self.device_info
        return Record(op_key=self.spec.key, skeleton_hash=self.skeleton.hash, config=config,
                      build=build, measurement=meas, device=info.name if info else self.backend_name,
                      toolchain=info.toolchain if info else (), time=time.time(), trial=trial)


def artifact_in(run_dir: str | Path, artifact: str) -> str:
    """A record's build artifact as a path that exists from here. Records keep the path it was
    compiled at, relative to where the command ran (`runs/<id>/build/<digest>/kernel.so`): a
    resume from another directory, or a run moved elsewhere, finds it under the run's own
    build/ instead. Anything else (a replayed landscape's keys) is returned as it is."""
    p = Path(artifact)
    if p.exists() or "build" not in p.parts:
        return artifact
    i = len(p.parts) - 1 - p.parts[::-1].index("build")
    return str(Path(run_dir).joinpath(*p.parts[i:]))

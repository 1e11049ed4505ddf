"""The Evaluator: config -> Record. Check constraints and resources, render, compile, verify, time.

Where compiles and timings run is its Runner's (tuner/exec/runner.py: local worker processes,
or a Ray cluster); what a request and its failure mean is decided here, once for every runner:
a request whose process died under it is sent once more (an outside kill, the OOM killer, a
lost node is not the config's fault), a second death is the config's unless both were kills
from outside (then the record is INFRA_ERROR: the machine's, not the config's), and a hang is
never retried. `evaluate` is thread-safe: the searcher calls it from several threads at once.

A candidate's fault is always a Record; only faults of the tool raise.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, TypeVar

from tuner import __version__
from tuner.backends import get_backend
from tuner.core.ops import load_op, render_context
from tuner.core.settings import Settings
from tuner.core.skeleton import Skeleton, SkeletonError
from tuner.core.values import Build, Config, DeviceInfo, Measurement, OpSpec, Record, Status
from tuner.exec.runner import LocalRunner, Placement, Runner
from tuner.exec.worker import WorkerFailure

T = TypeVar("T")

REFERENCE_TTL_S = 6 * 3600.0  # a cached reference timing older than this is timed again


class Evaluator:
    """`runner(placement, settings) -> Runner` says where requests run (default: this machine's
    worker processes, `LocalRunner`; `WorkerPools.runner` for workers a sweep shares,
    `RayExecutor.evaluator` builds one on a Ray cluster)."""

    def __init__(self, backend: str, spec: OpSpec, skeleton: Skeleton, settings: Settings,
                 workdir: str | Path, devices: tuple[int, ...] = (0,), options: dict | None = None,
                 runner: Callable[[Placement, Settings], Runner] = LocalRunner):
        self.backend_name, self.spec, self.skeleton, self.settings = backend, spec, skeleton, settings
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        # The op goes with every compile request (`Backend.compile`); the benchmark workers are
        # also told it (the sim models the reference's time from it).
        self.options = {"cache_dir": settings.cache_dir, "op": spec.to_json(), **(options or {})}
        self.backend = get_backend(backend, devices[0], **self.options)  # parent side: context, limits
        self.op = load_op(spec)
        self.context = {**render_context(self.op), **self.backend.render_context(self.op)}
        self.limits = self.backend.limits()
        # What the compile workers are told instead of asking the device (Backend.compile_options).
        compile_options = {**{k: v for k, v in self.options.items() if k != "op"},
                           **self.backend.compile_options()}
        self.placement = Placement(backend, tuple(devices), self.options, compile_options,
                                   self.backend.limit_memory, self.backend.exclusive_timing,
                                   str(self.workdir / "workers.log"))
        self.runner: Runner = runner(self.placement, settings)
        self.default_parallel = self.runner.default_parallel
        self.timing_slots = self.runner.timing_slots
        self._by_source: dict[str, tuple[Build, Measurement]] = {}
        self._source_lock = threading.Lock()
        self.device_info: DeviceInfo | None = None
        self.device_done: float | None = None  # time.monotonic() when the device facts came
        self._device_ready = threading.Event()  # set when they came (or failed to)
        self.reference_samples: list[float] = []
        self.reference_s: float | None = None
        self.reference_retimed = False  # re-timed interleaved with the top configs (pick_winner)
        self.memcheck_result = "not run"  # the winner under the device's memory checker (pick_winner)
        self.reference_done: float | None = None  # time.monotonic() when it was timed
        self.reference_cached = ""  # when the samples came from the cache: when they were timed
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
        if wait or self.runner.exclusive is not None:
            self._take_device_info(on_device)
            self._take_reference()
            self._prepare()
            return self.device_info

        def run() -> None:
            try:
                self._take_device_info(on_device)
                self._take_reference()
            except BaseException as e:  # noqa: BLE001 - raised again where it is waited for
                self._reference_error = e
            finally:
                self._device_ready.set()  # a record waiting for the facts goes on without them
            self._prepare()
        self._reference_thread = threading.Thread(target=run, daemon=True, name="device and reference")
        self._reference_thread.start()
        return None

    def _prepare(self) -> None:
        """In the background: the benchmark process builds the op's verification sets (and a
        problem file's live op), so the first candidate is checked and timed as soon as it
        compiles: at 8192x8192 on an H200 these took 4-5 s of a model's first candidate. Its
        measure queues behind this on the worker; a failure is left to that measure to say."""
        if self.runner.exclusive is not None:
            return  # the host is the device: its compiles would wait for this (see Runner)

        def run() -> None:
            try:
                self._device("warm", 600, "preparing the verification sets", op=self.spec.to_json(),
                             bench=True)
            except Exception:  # noqa: BLE001
                pass
        threading.Thread(target=run, daemon=True, name="prepare").start()

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
        """The reference's samples: timed, or taken from the cache of an earlier timing of the
        same reference on the same device, toolchain and timing settings within
        REFERENCE_TTL_S (a run's rounds, a proposer's validation and the search after it, the
        runs of a sweep or of a user's loop time it once). The final speedup never rests on a
        cached figure: `pick_winner` re-times the reference interleaved with the winner."""
        path = self._reference_cache_path()
        samples = _read_cached_reference(path)
        if samples is None:
            samples = self._time_reference()
            _write_cached_reference(path, samples)
            self.reference_cached = ""
        else:
            self.reference_cached = time.strftime("%Y-%m-%dT%H:%M:%S%z",
                                                  time.localtime(path.stat().st_mtime))
        self.reference_samples = samples
        self.reference_s = sorted(samples)[len(samples) // 2]
        self.reference_done = time.monotonic()

    def _reference_cache_path(self) -> Path | None:
        """Where this reference's timing is cached, keyed by everything that changes it: the
        op (a problem file by its content, not its path), the device and its toolchain, the
        backend's options and the timing settings. None without device facts to key it by."""
        info = self.device_info
        if info is None or not self.settings.cache_dir:
            return None
        spec = self.spec.to_json()
        if self.spec.kind != "builtin":
            try:
                spec["source"] = hashlib.sha256(Path(self.spec.source).read_bytes()).hexdigest()
            except OSError:
                return None
        s = self.settings
        tools = [t for t in info.toolchain if t[0] != "sandbox"]  # names this run's folders
        key = json.dumps([__version__, self.backend_name, info.name, tools, spec,
                          {k: v for k, v in self.options.items() if k not in ("op", "cache_dir")},
                          [s.bench_budget_s, s.warmup_s, s.min_reps, s.max_reps, s.precision]],
                         sort_keys=True, default=str)
        return Path(s.cache_dir) / "reference" / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")

    def _device_info(self) -> DeviceInfo:
        return self._device("device_info", 600, "device_info")

    def _time_reference(self) -> list[float]:
        try:
            return self._device("time_reference", max(600, self.settings.run_timeout_s), "time_reference",
                                spec=self.spec, settings=self.settings)
        except WorkerFailure as e:
            raise WorkerFailure(e.kind, f"timing the reference: {e.reason}") from None

    def warm_up(self) -> None:
        """Start the compile processes in the background, so that their start overlaps `start`
        (device facts, the reference timed) instead of following it: on a GPU the first
        evaluation came ~12 s after the reference was timed, most of it compile workers
        starting. They also work out the op's argument shapes, so that a model's first candidate
        is compiled at once. (Not where timing must have the machine to itself: see Runner.)"""
        self.runner.warm_up(self.spec.to_json())

    def close(self) -> None:
        self.runner.close()  # a reference still being timed ends with its process, or is waited for
        if self._reference_thread is not None:
            self._reference_thread.join(timeout=30)

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
            meas = self.measure(build, best_s, what=f"measure {config}")
        if meas.status not in (Status.RUN_TIMEOUT, Status.INFRA_ERROR):  # may be the load's; allow a retry
            with self._source_lock:
                self._by_source[digest] = (build, meas)
        return self._record(config, build, meas, trial)

    # ---- requests, through the runner --------------------------------------------------

    def _once_more(self, request: Callable[[], T]) -> T:
        """`request()`, sent once more when the process serving it died under it. A second
        death, or a hang, raises WorkerFailure with both reasons: kind 'outside' when both
        deaths were kills from outside, else 'crash' (or 'timeout')."""
        try:
            return request()
        except WorkerFailure as first:
            if first.kind == "timeout":
                raise
            self.runner.retried()
            try:
                return request()
            except WorkerFailure as second:
                if second.kind == "timeout":
                    raise WorkerFailure("timeout", f"{second.reason} (after a retry: {first.reason})") from None
                kind = "outside" if first.kind == second.kind == "outside" else "crash"
                raise WorkerFailure(kind, f"{second.reason} (a process died under this config twice, "
                                    f"first: {first.reason}; not sent again)") from None

    def _exclusive(self):
        return self.runner.exclusive or nullcontext()

    def _device(self, method: str, timeout: float, what: str, **request: Any) -> Any:
        def send():
            with self._exclusive():
                return self.runner.device(method, timeout, what, **request)
        return self._once_more(send)

    def compile(self, source: str, digest: str) -> Build:
        workdir = str(self.workdir / "build" / digest)

        def send() -> Build:
            with self._exclusive():
                return self.runner.compile(source, self.options["op"], workdir, self.settings.compile_timeout_s)
        try:
            return self._once_more(send)
        except WorkerFailure as e:
            status = Status.COMPILE_TIMEOUT if e.kind == "timeout" else Status.COMPILE_ERROR
            return Build(status, error=f"compiler: {e.reason}")

    def measure(self, build: Build, best_s: float | None = None, what: str = "") -> Measurement:
        try:
            return self._device("measure", self.settings.run_timeout_s, what or f"measure {build.artifact}",
                                artifact=build.artifact, spec=self.spec, settings=self.settings,
                                best_s=best_s, reference_s=self.reference_s, floor=self.floor())
        except WorkerFailure as e:
            if e.kind == "timeout":
                return Measurement(Status.RUN_TIMEOUT, detail=f"kernel hung: {e.reason}")
            if e.kind == "outside":
                return Measurement(Status.INFRA_ERROR, detail=f"not the kernel's failure: {e.reason}")
            fenced = (" (its inputs were read-only and every buffer fenced by unmapped pages: a write "
                      "to an input, or past a buffer, ends the process)") if self.backend.data_device() is None else ""
            return Measurement(Status.RUNTIME_ERROR, detail=f"kernel crashed: {e.reason}{fenced}")

    def floor(self) -> tuple[float, str] | None:
        """(seconds, the bound) under which no kernel of this op runs on this device: its bytes
        at `floor_margin` x the measured copy bandwidth, or its FLOPs at that x the fastest
        measured matmul rate, whichever takes longer. None on a modelled device (null, sim:
        their times are scripted or modelled) or where the device reports no peak."""
        info, op, margin = self.device_info, self.op, self.settings.floor_margin
        if info is None or info.simulated or margin <= 0:
            return None
        peaks = dict(info.peaks)
        bounds = []
        if op.bytes and peaks.get("copy_gbps"):
            gbps = peaks["copy_gbps"]
            bounds.append((op.bytes / (margin * gbps * 1e9),
                           f"its {op.bytes / 1e6:.4g} MB moved at {margin:g}x the measured copy bandwidth, "
                           f"{gbps:g} GB/s"))
        rates = [v for k, v in peaks.items() if k.endswith("_gflops") and v]
        if op.flops and rates:
            bounds.append((op.flops / (margin * max(rates) * 1e9),
                           f"its {op.flops / 1e9:.4g} GFLOP at {margin:g}x the fastest measured matmul "
                           f"rate, {max(rates):g} GFLOP/s"))
        return max(bounds) if bounds else None

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

    def retime(self, records: list[Record], with_reference: bool = False) -> list[list[float] | str] | None:
        """The top few, re-timed interleaved in one process so that drift hits all alike: for
        each its samples, or why its re-timed calls were wrong; `with_reference`: the
        reference's samples from the same interleave, last. None when that fails (a kernel
        that passed once and then hung): keep the first times."""
        try:
            return self._device("time_many", self.settings.run_timeout_s * (len(records) + with_reference),
                                "retime", artifacts=[self.artifact(r) for r in records], spec=self.spec,
                                settings=self.settings, with_reference=with_reference)
        except WorkerFailure:
            return None

    def memcheck(self, record: Record) -> str:
        """The record's kernel once under the device's memory checker: "clean", "errors: ...",
        or "not run: why" (Backend.memcheck)."""
        timeout = max(300.0, self.settings.run_timeout_s)
        try:
            return self._device("memcheck", timeout + 60, "memcheck", artifact=self.artifact(record),
                                spec=self.spec, timeout_s=timeout)
        except WorkerFailure as e:
            return f"not run: {e.reason}"

    def recheck(self, record: Record) -> str | None:
        try:
            return self._device("recheck", self.settings.run_timeout_s, "recheck",
                                artifact=self.artifact(record), spec=self.spec)
        except WorkerFailure as e:
            return f"re-check failed: {e.reason}"

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


def _read_cached_reference(path: Path | None) -> list[float] | None:
    """The cached samples, or None when absent, stale or unreadable (then it is timed)."""
    if path is None:
        return None
    try:
        if time.time() - path.stat().st_mtime > REFERENCE_TTL_S:
            return None
        samples = json.loads(path.read_text())["samples"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not (isinstance(samples, list) and samples
            and all(isinstance(x, (int, float)) and x > 0 for x in samples)):
        return None
    return [float(x) for x in samples]


def _write_cached_reference(path: Path | None, samples: list[float]) -> None:
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(json.dumps({"samples": samples}))
        os.replace(tmp, path)
    except OSError:
        pass  # a cache that cannot be written only costs the next run a timing


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

"""The Ray executor: the same evaluations as the local one, spread over a Ray cluster.

Shape (one `RayExecutor` per command; the `RayRunner`s of any number of evaluators share it):

* **Device actors**, one per accelerator, each holding the `GPU` or `NPU` resource (Ray sets
  `CUDA_VISIBLE_DEVICES` / `ASCEND_RT_VISIBLE_DEVICES` for it), or CPU worker actors for the
  `cpu` and `null` backends. They serve `measure`, `time_reference`, `device_info`, `recheck`
  and `time_many`, each taking whichever actor is free, like the local benchmark workers.
* **Compile tasks**, Ray tasks holding one `CPU` each.
* **The driver** keeps the Optuna study (ask/tell), the record store and the search loop
  (`tune.run_search`), exactly as with the local executor: only where an evaluation runs moves.

Each actor and each Ray worker process that runs compile tasks owns a `tuner.exec.worker.Worker`
rather than the backend itself. That keeps everything the local executor guarantees about a
candidate (its own killable process, scrubbed environment, memory and CPU caps, hang timeouts,
a poisoned device context replaced) with the same code, so a candidate's fault gives the same
record either way; and a crashing kernel costs a subprocess restart, not an actor restart (an
actor restart re-imports Ray's worker and re-creates the device context).

Faults. A process that dies while serving a config (the candidate's Worker, the actor itself,
or a compile task's Ray worker) is a `WorkerFailure` of kind crash, as on the local runner; the
Evaluator's rule (send it once more, on whichever actor is free; a second death is the
config's) applies to both. A dead actor is replaced by the driver (a new actor on the same
resource); one that cannot be placed again drops out of the pool and the others carry on.
Records are written by the driver before Optuna is told, so a fault loses nothing recorded.

Files. Compile tasks return the files of their build folder beside the `Build`; a device actor
on another node that does not see the artifact's path writes them there before measuring, so a
cluster needs no shared file system for the `cpu` and `null` backends (the `cuda` backend's
shared Triton cache is not shipped: a remote GPU recompiles on its first launch).

Ray is imported lazily; without it, using this executor says `pip install "tuner[ray]"`.
This module is the driver's side; what runs inside Ray's worker processes (the compile tasks'
bodies, `DeviceActor`) is `tuner.exec.ray_worker`.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from pathlib import Path
from typing import Any

from tuner.backends import BackendUnavailable, backend_class
from tuner.core.settings import Settings
from tuner.core.values import Build, OpSpec, Status
from tuner.exec.evaluate import Evaluator
from tuner.exec.runner import Placement
from tuner.exec.sandbox import worker_env
from tuner.exec.ray_worker import DeviceActor, compile_in_task, warm_in_task, warm_options
from tuner.exec.worker import WorkerError, WorkerFailure

RAY_MISSING = 'the ray executor needs Ray, which is not installed: pip install "tuner[ray]"'
ACCELERATORS = {"cuda": "GPU", "npu": "NPU"}  # backend -> the Ray resource of its device
_PKG_ROOT = str(Path(__file__).resolve().parents[2])  # the folder that holds the package
# Variables Ray sets in its worker processes that would change what a candidate sees: Ray
# forces OMP_NUM_THREADS=1 in workers holding less than one CPU, which would make the torch
# reference single-threaded on the cpu backend. Workers get the driver's values instead.
_DRIVER_ENV = ("OMP_NUM_THREADS", "TUNER_PROFILE")


class RayUnavailable(BackendUnavailable):
    """Ray is missing, or the cluster cannot be reached or cannot run this backend."""


def import_ray():
    try:
        import ray
    except ImportError:
        raise RayUnavailable(RAY_MISSING) from None
    return ray


# ---- the driver side ---------------------------------------------------------------------

def connect(address: str | None = None, num_cpus: int | None = None, num_gpus: int | None = None) -> bool:
    """Connect this process to the cluster at `address`, or start a local one of its own;
    True when it did (and so should shut it down), False when it was connected already."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    env_vars = {"PYTHONPATH": os.pathsep.join(p for p in (_PKG_ROOT, os.environ.get("PYTHONPATH")) if p)}
    kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                          "logging_level": "ERROR", "runtime_env": {"env_vars": env_vars}}
    if address:
        _probe(address)
        kw["address"] = address
    else:
        # address="local": a new cluster of our own, never one someone else started. Idle task
        # workers are kept: each holds a compile Worker (its own process), and Ray's default soft
        # limit (one per CPU, actors included) would kill and re-spawn them between compiles.
        cpus = num_cpus or os.cpu_count() or 1
        kw.update(address="local", num_cpus=num_cpus, num_gpus=num_gpus, object_store_memory=256 * 2**20,
                  _system_config={"num_workers_soft_limit": 2 * cpus + 16})
    # A local cluster's processes inherit this process's environment, and every benchmark or
    # compile Worker can read its parent's (/proc/<ppid>/environ): they start with the
    # workers' allowlisted one instead (sandbox.worker_env), keys and unknown variables out.
    saved = dict(os.environ)
    try:
        if not address:
            os.environ.clear()
            os.environ.update(worker_env(saved))
        ray.init(**kw)
    except (ConnectionError, RuntimeError, ValueError) as e:
        where = f"connect to the Ray cluster at {address}" if address else "start a local Ray cluster"
        raise RayUnavailable(f"cannot {where}: {e}") from None
    finally:
        if os.environ != saved:
            os.environ.clear()
            os.environ.update(saved)
    return True


def _probe(address: str, timeout_s: float = 5.0) -> None:
    """A `host:port` (or `ray://host:port`) nobody answers at fails here in seconds: Ray itself
    waits a minute or more for a cluster's control service, printing only its own warnings."""
    hostport = address.split("://", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return  # "auto" or another form Ray resolves itself
    import socket
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise RayUnavailable(f"no Ray cluster answers at {address} ({e.strerror or e}); start one "
                             f"there (`ray start --head --port {port}`), fix --ray-address, or leave "
                             f"it out to start a local cluster") from None


class _Slot:
    def __init__(self, index: int, actor, info: dict):
        self.index, self.actor, self.info = index, actor, info
        self.busy: str | None = None  # what it is doing, for progress views and tests
        self.since = 0.0  # when the request in hand began
        self.busy_s = 0.0  # seconds spent serving requests: how loaded the device was


class DevicePool:
    """The device actors of one backend. Each evaluator has a home actor (the one with the
    fewest evaluators when it is made), and its requests go there; a request takes another
    free actor only when no request of that actor's own is waiting. So a task's candidates are
    timed on one device wherever the load allows (two GPUs of one model differ by a few per
    cent, more than the gaps a search ranks on), and each actor makes the verification sets of
    its own tasks only, while no device idles while requests wait."""

    def __init__(self, executor: "RayExecutor", backend: str, n: int):
        self.executor, self.backend = executor, backend
        self.resource = ACCELERATORS.get(backend)
        self.slots: list[_Slot] = []
        self.free: list[_Slot] = []
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.homed: dict[int, int] = {}  # slot index -> evaluators at home there
        self.waiting: dict[int, int] = {}  # slot index -> requests waiting for their home
        self.requests = self.away = 0  # requests served, and those served away from home
        self.replaced = 0  # actors that died and were replaced
        self.lost = 0  # actors that died and could not be placed again
        cls = backend_class(backend)
        self.limit_memory = cls.limit_memory
        actors = [self._new_actor(i) for i in range(n)]
        infos = [self._wait_ready(a, i) for i, a in enumerate(actors)]
        # Start each actor's benchmark Worker (a Python importing torch and the backend) now,
        # all at once, rather than on the first request of the first task to reach it, and
        # have it measure its device's facts (ceilings: a second or two on a GPU, once per
        # process), which every task asks for before its first candidate. The options are an
        # evaluator's less the op (which requests carry), so the Worker is reused.
        warm = {"cache_dir": executor.settings.cache_dir}
        steps = (("warm", 300), ("device_info", 600)) if self.resource else (("warm", 300),)
        for method, timeout in steps:  # (cpu measures its ceilings at every run's start anyway)
            for ref in [a.call.remote(warm, method, timeout) for a in actors]:
                try:
                    executor.ray.get(ref, timeout=timeout + 60)
                except Exception:  # noqa: BLE001 - not fatal: the first request does it anyway
                    pass
        for i, (a, info) in enumerate(zip(actors, infos)):
            slot = _Slot(i, a, info)
            self.slots.append(slot)
            self.free.append(slot)

    def _new_actor(self, index: int):
        ray, ex = self.executor.ray, self.executor
        opts: dict[str, Any] = {"max_restarts": 0, "max_task_retries": 0, "max_concurrency": 2}
        if self.resource == "GPU":
            opts.update(num_gpus=1, num_cpus=0)
        elif self.resource:
            opts.update(resources={self.resource: 1}, num_cpus=0)
        else:
            # cpu: the actor times on all the node's cores, but holds none of Ray's CPUs: its
            # timing and the compiles are kept apart by the executor's lock instead (a CPU held
            # for it would starve compiles on a small node). null: a fake device.
            opts.update(num_cpus=0)
            if ex.n_nodes > 1:
                opts["scheduling_strategy"] = "SPREAD"
        remote = ray.remote(**opts)(DeviceActor)
        device = 0 if self.resource else index  # an accelerator actor sees only its own device
        return remote.remote(self.backend, device, ex.settings, ex.log_path, ex.worker_env,
                             self.limit_memory)

    def _wait_ready(self, actor, index: int) -> dict:
        ray = self.executor.ray
        try:
            return ray.get(actor.ready.remote(), timeout=self.executor.place_timeout_s)
        except ray.exceptions.GetTimeoutError:
            ray.kill(actor)
            need = f"1 {self.resource}" if self.resource else "a CPU worker"
            raise RayUnavailable(
                f"the Ray cluster could not place device actor {index} for the {self.backend} "
                f"backend (it needs {need}) within {self.executor.place_timeout_s:g} s; "
                f"cluster resources: {ray.cluster_resources()}") from None

    def home(self) -> int:
        """A home for a new evaluator: the live actor with the fewest; `leave` gives it back."""
        with self.lock:
            index = min((s.index for s in self.slots), key=lambda i: (self.homed.get(i, 0), i), default=0)
            self.homed[index] = self.homed.get(index, 0) + 1
            return index

    def leave(self, index: int) -> None:
        with self.lock:
            self.homed[index] = max(0, self.homed.get(index, 0) - 1)

    def acquire(self, what: str, home: int | None = None) -> _Slot:
        with self.cond:
            if home is not None:
                self.waiting[home] = self.waiting.get(home, 0) + 1
            try:
                while True:
                    if not self.slots:
                        raise RayUnavailable(f"every {self.backend} device actor died and none could "
                                             f"be placed again; see the Ray logs")
                    slot = self._pick(home)
                    if slot is not None:
                        self.free.remove(slot)
                        self.requests += 1
                        self.away += home is not None and slot.index != home
                        slot.busy, slot.since = what, time.monotonic()
                        return slot
                    self.cond.wait(timeout=1.0)
            finally:
                if home is not None:
                    self.waiting[home] -= 1

    def _pick(self, home: int | None) -> _Slot | None:
        free = [s for s in self.free if s in self.slots]
        mine = [s for s in free if s.index == home]
        if mine:
            return mine[0]
        # Another's home only while none of its own requests waits for it: they take it next.
        others = [s for s in free if not self.waiting.get(s.index, 0)]
        return others[0] if others else None

    def release(self, slot: _Slot) -> None:
        with self.cond:
            slot.busy_s += time.monotonic() - slot.since
            slot.busy = None
            if slot in self.slots:
                self.free.append(slot)
            self.cond.notify_all()

    def replace(self, slot: _Slot) -> None:
        """The actor in `slot` died (or wedged): kill what is left of it and start another."""
        ray = self.executor.ray
        try:
            ray.kill(slot.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - it is already gone
            pass
        actor = self._new_actor(slot.index)
        try:
            slot.info = ray.get(actor.ready.remote(), timeout=self.executor.place_timeout_s)
            slot.actor = actor
            self.replaced += 1
        except Exception:  # noqa: BLE001 - its node is gone, or its device is
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
            with self.lock:
                self.slots.remove(slot)
            self.lost += 1

    def close(self) -> None:
        ray = self.executor.ray
        for s in self.slots:
            try:
                ray.get(s.actor.close.remote(), timeout=10)
            except Exception:  # noqa: BLE001
                pass
            try:
                ray.kill(s.actor, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        self.slots = []


class RayExecutor:
    """A connection to a Ray cluster and the device actors on it, shared by every evaluator of
    one command. A local cluster is started when no address is given (and when this process is
    not already connected to one); it is shut down by `close`.

    `devices` is how many device actors to start for an accelerator backend (default: every GPU
    or NPU of the cluster) or for `null` (default 1); `cpu` gets one CPU worker actor per node."""

    def __init__(self, settings: Settings, address: str | None = None, devices: int | None = None,
                 num_cpus: int | None = None, log_path: str | None = None,
                 place_timeout_s: float = 120.0):
        self.ray = import_ray()
        self.settings, self.devices, self.log_path = settings, devices, log_path
        self.place_timeout_s = place_timeout_s
        # Connected already (a library user, a test): use that cluster and leave it running.
        self.owned = connect(address, num_cpus)
        if self.resources().get("CPU", 0) < 1:
            raise RayUnavailable(f"the Ray cluster has no CPU for compile tasks: {self.resources()}")
        self.retries = 0  # configs retried after a process died under them, over all evaluators
        self.compiling = 0  # compile tasks sent and not yet answered (a progress and load figure)
        self._count_lock = threading.Lock()
        self.worker_env = {k: os.environ.get(k) for k in _DRIVER_ENV}
        self._pools: dict[str, DevicePool] = {}
        self._pool_lock = threading.Lock()
        self._quiet: dict[str, threading.Lock] = {}
        self._compile_remote = None
        self._warming: dict[str, list] = {}  # backend -> refs of compile warm-up tasks

    # ---- cluster facts -------------------------------------------------------------------

    @property
    def n_nodes(self) -> int:
        return max(1, sum(1 for n in self.ray.nodes() if n.get("Alive")))

    def resources(self) -> dict[str, float]:
        return self.ray.cluster_resources()

    def n_devices(self, backend: str) -> int:
        if backend == "cpu":
            return self.n_nodes  # the node is the device: two timing actors on it would collide
        if self.devices:
            return self.devices
        res = ACCELERATORS.get(backend)
        if res:
            n = int(self.resources().get(res, 0))
            if n < 1:
                raise RayUnavailable(f"the {backend} backend needs a {res} in the Ray cluster; "
                                     f"it has {self.resources()}")
            return n
        return 1

    def compile_slots(self, backend: str) -> int:
        """CPUs for compile tasks (device actors hold none)."""
        return max(1, int(self.resources().get("CPU", 1)))

    def default_parallel(self, backend: str) -> int:
        """Evaluations in flight for one search: one per compile slot and one per device, so
        that every device has a compiled candidate waiting and no config is asked for that
        could not start at once (each ask is a sample the sampler makes without the answers
        of those still in flight)."""
        return self.n_devices(backend) + self.compile_slots(backend)

    # ---- pieces ----------------------------------------------------------------------------

    def pool(self, backend: str) -> DevicePool:
        with self._pool_lock:
            if backend not in self._pools:
                self._warm_compiles(backend)  # while the device actors are placed
                self._pools[backend] = DevicePool(self, backend, self.n_devices(backend))
            return self._pools[backend]

    def _warm_compiles(self, backend: str) -> None:
        """Start a compile Worker in as many Ray worker processes as there are compile slots,
        without waiting: later compile tasks reuse those processes (idle workers are kept,
        see `connect`). Evaluators' compile options are the settings' cache dir, the backend's
        compile options and the op, which compile tasks strip, so these Workers are the ones
        compiles look up."""
        cls = backend_class(backend)
        if cls.exclusive_timing:  # (cpu) processes starting would disturb the first timings
            return
        ray = self.ray
        remote = ray.remote(num_cpus=1, max_retries=0)(warm_in_task)
        options = warm_options(backend, self.settings)
        limit = cls.limit_memory
        self._warming[backend] = [
            remote.remote(backend, options, self.settings, self.log_path, self.worker_env, limit)
            for _ in range(self.compile_slots(backend))]

    def wait_warm(self, backend: str, timeout: float = 300.0) -> int:
        """Wait for the compile warm-up of `backend` (benches: before their clock starts);
        returns how many compile processes came up. A failed warm-up is not an error: a
        compile starts its own Worker anyway."""
        refs = self._warming.pop(backend, [])
        if not refs:
            return 0
        ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=timeout)
        ok = 0
        for r in ready:
            try:
                self.ray.get(r)
                ok += 1
            except Exception:  # noqa: BLE001 - see the docstring
                pass
        return ok

    def quiet_lock(self, backend: str) -> threading.Lock:
        """For backends whose timing must not overlap compiles (cpu): one lock for every
        evaluator of this executor, since they all share the machine."""
        with self._pool_lock:
            return self._quiet.setdefault(backend, threading.Lock())

    def compile_remote(self):
        if self._compile_remote is None:
            self._compile_remote = self.ray.remote(num_cpus=1, max_retries=0, num_returns=2)(compile_in_task)
        return self._compile_remote

    def evaluator(self, backend: str, spec: OpSpec, skeleton, settings: Settings, workdir,
                  devices: tuple[int, ...] = (0,), options: dict | None = None) -> Evaluator:
        """The Evaluator signature, so that `tune.execute(..., make_evaluator=executor.evaluator)`:
        an Evaluator whose runner is this cluster's."""
        return Evaluator(backend, spec, skeleton, settings, workdir, (0,), options,
                         runner=functools.partial(RayRunner, self))

    def inflight(self) -> list[tuple[str, int, str, int]]:
        """(backend, actor index, what it is doing, actor pid) for every busy device actor."""
        out = []
        for name, pool in list(self._pools.items()):
            for s in list(pool.slots):
                if s.busy:
                    out.append((name, s.index, s.busy, s.info.get("pid", -1)))
        return out

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools = {}
        if self.owned and self.ray.is_initialized():
            self.ray.shutdown()
        self.owned = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


_DEATH_ERRORS_CACHE: tuple | None = None


def _death_errors(ray) -> tuple:
    """Ray's exceptions that mean the process serving a request died."""
    global _DEATH_ERRORS_CACHE
    if _DEATH_ERRORS_CACHE is None:
        ex = ray.exceptions
        names = ("RayActorError", "ActorDiedError", "ActorUnavailableError", "WorkerCrashedError",
                 "OutOfMemoryError", "NodeDiedError", "LocalRayletDiedError", "ObjectLostError",
                 "OwnerDiedError", "TaskCancelledError")
        _DEATH_ERRORS_CACHE = tuple(getattr(ex, n) for n in names if hasattr(ex, n))
    return _DEATH_ERRORS_CACHE


class RayRunner:
    """A Runner (tuner/exec/runner.py) whose compiles are Ray tasks and whose device requests
    run on the executor's device actors, preferring this evaluator's home actor. The actors'
    answers (tuples: they cross Ray) become the Runner's values and WorkerFailures here."""

    def __init__(self, executor: RayExecutor, placement: Placement, settings: Settings):
        self.executor, self.placement, self.settings = executor, placement, settings
        self.ray = executor.ray
        self.pool = executor.pool(placement.backend)
        self.exclusive = executor.quiet_lock(placement.backend) if placement.exclusive_timing else None
        self.default_parallel = executor.default_parallel(placement.backend)
        self.timing_slots = max(1, executor.n_devices(placement.backend))
        self.retries = 0
        self._deaths = _death_errors(self.ray)
        self._files: dict[str, list] = {}  # artifact -> [ObjectRef of its build folder's files]
        self.home = self.pool.home()  # the device actor that times this evaluator's configs when it can

    def compile(self, source: str, op_json: str, workdir: str, timeout_s: float) -> Build:
        ray, ex, p = self.ray, self.executor, self.placement
        refs = ex.compile_remote().remote(p.backend, p.compile_options, self.settings, ex.log_path,
                                          ex.worker_env, source, op_json, workdir, p.limit_memory)
        with ex._count_lock:
            ex.compiling += 1
        try:
            outcome = ray.get(refs[0], timeout=timeout_s + 120)
        except ray.exceptions.GetTimeoutError:
            ray.cancel(refs[0], force=True)
            raise WorkerFailure("crash", "compile task stopped answering; cancelled") from None
        except self._deaths as e:
            raise WorkerFailure("crash", f"compile process died ({type(e).__name__})") from None
        except ray.exceptions.RayTaskError as e:
            raise WorkerError(str(e)) from None
        finally:
            with ex._count_lock:
                ex.compiling -= 1
        build = _answer(outcome)
        if build.status is Status.OK:
            self._files[build.artifact] = [refs[1]]
        return build

    def device(self, method: str, timeout: float, what: str, **request: Any) -> Any:
        ray = self.ray
        slot = self.pool.acquire(what, self.home)
        # Each build's files travel as an ObjectRef inside a dict: Ray resolves it only where
        # the actor asks for it (on a node that lacks the artifact).
        names = [request.get("artifact"), *(request.get("artifacts") or ())]
        files = {a: self._files[a] for a in names if a and a in self._files}
        try:
            ref = slot.actor.call.remote(self.placement.options, method, timeout, files or None, **request)
            try:
                out = ray.get(ref, timeout=timeout + 120)
            except ray.exceptions.GetTimeoutError:
                self.pool.replace(slot)
                raise WorkerFailure("crash", f"device actor {slot.index} stopped answering; replaced") from None
            except self._deaths as e:
                pid = slot.info.get("pid")
                self.pool.replace(slot)
                raise WorkerFailure("crash", f"device actor {slot.index} (pid {pid}) died: "
                                    f"{type(e).__name__}") from None
            except ray.exceptions.RayTaskError as e:
                raise WorkerError(str(e)) from None
        finally:
            self.pool.release(slot)
        return _answer(out)

    def retried(self) -> None:
        with self.executor._count_lock:
            self.retries += 1
            self.executor.retries += 1

    def warm_up(self, op_json: str | None = None) -> None:
        """The executor warms its compile processes when it places the device actors."""

    def close(self) -> None:
        """The actors belong to the executor; a runner gives back only its home. A request
        still in flight (a reference being timed when a run stopped early) finishes on its actor."""
        if self.home is not None:
            self.pool.leave(self.home)
            self.home = None


def _answer(out: tuple) -> Any:
    """A worker's answer as it crossed Ray, ("ok", value) | ("failure", kind, reason) |
    ("error", message), as the Runner contract's value or exception."""
    if out[0] == "ok":
        return out[1]
    if out[0] == "failure":
        raise WorkerFailure(out[1], out[2])
    raise WorkerError(out[1])

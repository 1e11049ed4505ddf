"""Killable worker processes that run candidate code.

A `Worker` is a child Python process (`python -m tuner.exec.worker`) that holds one backend and
answers requests over a pipe: compile, measure, device info. Candidate code runs only in
workers, with a scrubbed environment (no keys, tokens or secrets), no core dumps, a memory
cap and a CPU-time cap. When a request outlives its timeout the parent kills the worker;
when the worker dies (a segfault, an abort), the parent sees the signal. Either way the
request becomes `WorkerFailure` with the reason, and the next call starts a fresh worker.

Wire format: 8-byte big-endian length, then a pickle. The child moves its real stdout away
first, so a kernel that prints cannot corrupt the protocol.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from tuner.backends.base import OUTSIDE_SIGNALS
from tuner.exec.sandbox import (confine_writes, isolate_network, restrict_syscalls, sandbox_facts, worker_env,
                                write_dirs)


class WorkerFailure(Exception):
    """The worker died or timed out while serving a request. `kind` is 'timeout', 'crash', or
    'outside': killed by a signal only the outside sends (SIGKILL or SIGTERM that its parent did
    not send: the OOM killer, an operator), the process or the kernel host it ran, which is the
    machine's failure and not the request's."""

    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind, self.reason = kind, reason


_OUTSIDE = "worker killed from outside"


class WorkerError(RuntimeError):
    """A fault of the tool itself, raised inside the worker (its traceback is the message)."""


def scrubbed_env() -> dict[str, str]:
    """What a worker process starts with: the allowlisted environment (sandbox.worker_env)."""
    env = worker_env()
    pkg_root = str(Path(__file__).resolve().parents[2])  # the folder that holds the package
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _send(fd: int, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(struct.pack(">Q", len(data)) + data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


_ALIVE_POLL_S = 0.5


def _recv_exact(fd: int, n: int, deadline: float | None, alive=None) -> bytes | None:
    """`alive`: asked every half second while nothing arrives; False ends the wait as if the
    pipe had closed. A worker can die with its pipe still open: a kernel that forked leaves a
    child holding it, and the parent waited for the whole timeout."""
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None or alive is not None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError
            wait = left if alive is None else (_ALIVE_POLL_S if left is None else min(left, _ALIVE_POLL_S))
            ready, _, _ = select.select([fd], [], [], wait)
            if not ready:
                if alive is not None and not alive():
                    return None
                continue  # the deadline is checked again
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _recv(fd: int, deadline: float | None = None, alive=None) -> Any:
    head = _recv_exact(fd, 8, deadline, alive)
    if head is None:
        raise EOFError
    body = _recv_exact(fd, struct.unpack(">Q", head)[0], deadline, alive)
    if body is None:
        raise EOFError
    return pickle.loads(body)


# Compile workers run at a lower priority than the rest of the tool: when compiles fill every
# core, the processes that time candidates (and the search's own threads) still get a CPU at
# once, so a timing is never stretched by a compile. (On a 32-core, two-GPU sweep it changed no
# figure measurably; the compiles there rarely filled the cores. bench/RESULTS.md, Ray, E.)
COMPILE_NICE = 10


class Worker:
    """Parent-side handle. One call at a time has the process, from its request to its reply
    (`call` holds a lock): runners that share workers (`WorkerPools`: a model proposer's
    validator, alive for the whole run, and each round's search) each pool them in a queue of
    their own, so two threads could otherwise call one worker at once and read each other's
    replies. A call's timeout counts from when it has the process: one waiting for another
    waits at most that one's timeout longer (every call has one; a hung kernel is killed at
    it). `kill` takes no lock: it ends a call in flight."""

    def __init__(self, backend: str, device: int = 0, options: dict | None = None,
                 settings=None, log_path: str | None = None, limit_memory: bool = True,
                 nice: int = 0):
        self.backend, self.device, self.options = backend, device, options or {}
        self.settings, self.log_path, self.limit_memory = settings, log_path, limit_memory
        self.nice = nice  # added to the process's niceness (compile workers: see COMPILE_NICE)
        self.proc: subprocess.Popen | None = None
        self._calling = threading.Lock()
        self.started = 0  # processes started; restarts = started - 1
        self.deaths = 0  # processes that died under a call (crash, exit, killed from outside)

    def _start(self) -> None:
        if self.log_path:
            _rotate(self.log_path)
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tuner.exec.worker", str(os.getpid())], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=log, env=self._env(), start_new_session=True)
        finally:
            if log is not subprocess.DEVNULL:
                log.close()
        mem = self.settings.worker_memory_bytes() if (self.settings and self.limit_memory) else 0
        cpu = self.settings.worker_cpu_s if self.settings else 0
        _send(self.proc.stdin.fileno(), ("init", {
            "backend": self.backend, "device": self.device, "options": self.options,
            "memory_bytes": mem, "cpu_s": cpu, "nice": self.nice, "file_bytes": LOG_LIMIT,
            "write_dirs": write_dirs(str(Path(self.log_path).parent) if self.log_path else None, self.settings)}))

    def _env(self) -> dict[str, str]:
        env = scrubbed_env()
        # One thread per compile process: with MLIR's pass-manager threads and OpenMP's on, 32
        # compile processes kept ~90 threads runnable on 32 cores, and every timing process
        # waited for a CPU (a two-GPU sweep: 26.7 -> 20.8 s, verification 41 -> 27 ms per
        # candidate; bench/RESULTS.md, Ray, fifth run). MLIR's switch is part of Triton's
        # cache key, so the timing processes (which look the compiled kernels up) get it too;
        # they compile nothing themselves.
        env["MLIR_DISABLE_MULTITHREADING"] = "1"
        if self.nice:
            env["OMP_NUM_THREADS"] = "1"
            return env
        from tuner.backends import backend_class
        return backend_class(self.backend).bench_env(env)

    def call(self, method: str, timeout: float | None, **kwargs) -> Any:
        with self._calling:
            return self._call(method, timeout, **kwargs)

    def _call(self, method: str, timeout: float | None, **kwargs) -> Any:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
            self.started += 1
        assert self.proc is not None and self.proc.stdin and self.proc.stdout
        try:
            _send(self.proc.stdin.fileno(), (method, kwargs))
            deadline = None if timeout is None else time.monotonic() + timeout
            proc = self.proc
            status, value = _recv(proc.stdout.fileno(), deadline, alive=lambda: proc.poll() is None)
        except TimeoutError:
            self.kill()
            raise WorkerFailure("timeout", f"no answer after {timeout:g} s; worker killed") from None
        except (EOFError, BrokenPipeError, OSError):
            why = self._death()
            raise WorkerFailure("outside" if why.startswith(_OUTSIDE) else "crash", why) from None
        if status == "outside":  # the kernel's own process was killed from outside
            raise WorkerFailure("outside", value)
        if status == "last":  # the worker's device context is gone: replace it before reuse
            self.kill()
        elif status == "error":
            raise WorkerError(value)
        return value

    def _death(self) -> str:
        assert self.proc is not None
        self.deaths += 1
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            return "worker stopped answering; killed"
        try:  # what the kernel started (a forked child holding the pipe) goes with it
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc = None
        if code < 0:
            try:
                sig = signal.Signals(-code)
            except ValueError:
                return f"worker died with signal {-code}"
            if sig in OUTSIDE_SIGNALS:  # this handle sends SIGKILL only in kill(), which is not here
                return f"{_OUTSIDE} ({sig.name}: the OOM killer, or an operator)"
            return f"worker died with {sig.name}"
        return f"worker exited with code {code}" + (" (the kernel ended the process: exit() or similar)"
                                                     if code == 0 else "")

    def kill(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            self.proc = None

    close = kill

    @property
    def restarts(self) -> int:
        return max(0, self.started - 1)


# ---- child side --------------------------------------------------------------------------

def _die_with_parent(parent: int) -> None:
    """If the parent is killed (SIGKILL gives it no chance to clean up), exit too, even while
    a hung kernel holds the main thread. A watchdog thread rather than PR_SET_PDEATHSIG,
    which fires when the parent *thread* that started us exits, not the parent process.
    `parent` is the pid the parent gave on the command line, not getppid() read here: a parent
    killed while this process was still starting had already left it to init, and a worker
    that took init for its parent hung on forever (a device actor killed mid-request)."""
    import threading
    if os.getppid() != parent:
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(1)
    threading.Thread(target=watch, daemon=True).start()


# What candidate code prints goes to the run's workers.log. A kernel that prints in its loop
# (a debug printf, a tl.device_print per program) prints once per timed repetition: tens of MB
# per candidate on a 2-core CPU, gigabytes on a GPU. No file a worker writes may exceed
# LOG_LIMIT (RLIMIT_FSIZE; Python ignores SIGXFSZ, so a write past it fails and the kernel's
# output is dropped), and a worker that starts on a log past half of it moves it aside first.
LOG_LIMIT = 256 * 2**20


def _rotate(log_path: str) -> None:
    try:
        if os.path.getsize(log_path) >= LOG_LIMIT // 2:
            os.replace(log_path, log_path + ".1")
            with open(log_path, "ab") as f:
                f.write(f"[tuner] the output before this was moved to {Path(log_path).name}.1; "
                        f"a log stops growing at {LOG_LIMIT >> 20} MiB\n".encode())
    except OSError:
        pass  # no log yet, or one that cannot be moved: it still stops growing at the limit


def _limit(memory_bytes: int, file_bytes: int) -> None:
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a segfaulting kernel leaves no core file
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    if memory_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))


def _cpu_budget(cpu_s: int) -> None:
    """Allow each request `cpu_s` more seconds of CPU (all threads together); past that the
    kernel gets SIGXCPU and the parent records it. The worker lives on, so the soft limit
    moves with the CPU time already spent."""
    import resource
    if cpu_s:
        used = resource.getrusage(resource.RUSAGE_SELF)
        spent = int(used.ru_utime + used.ru_stime)
        resource.setrlimit(resource.RLIMIT_CPU, (spent + cpu_s, resource.RLIM_INFINITY))


def _dump_profile(prof, folder: str) -> None:
    if not prof.getstats():
        return  # nothing measured here yet
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        prof.dump_stats(str(Path(folder) / f"worker-{os.getpid()}.prof"))
    except OSError:
        pass  # a diagnostic: never the run's failure


def main() -> None:
    # Keep the protocol's pipes private; anything the kernel prints goes to stderr (the log).
    out_fd = os.dup(1)
    in_fd = os.dup(0)
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle

    network = isolate_network()  # before any thread starts (see sandbox.py)
    from tuner.core import problem
    problem.CHECKED_ELSEWHERE = True  # its parent loaded and checked every op it is sent
    parent = int(sys.argv[1]) if len(sys.argv) > 1 else os.getppid()
    if os.getppid() != parent:
        os._exit(1)  # see _die_with_parent
    method, init = _recv(in_fd)  # a parent that dies first closes the pipe: EOFError ends us
    assert method == "init"
    from tuner.backends import EXTRA_WRITE_DIRS, UNCONFINED_WRITES
    why_not = UNCONFINED_WRITES.get(init["backend"])  # also before any thread starts:
    writes = (f"not confined ({why_not})" if why_not else
              confine_writes([*init["write_dirs"], *EXTRA_WRITE_DIRS.get(init["backend"], ())]))
    syscalls = restrict_syscalls()  # and this
    _die_with_parent(parent)
    _limit(init["memory_bytes"], init["file_bytes"])
    if init.get("nice"):
        os.nice(init["nice"])  # the compilers it starts (ptxas, cc) inherit it
    from tuner.backends import get_backend
    from tuner.backends.base import OutsideKill
    from tuner.core.values import OpSpec
    from tuner.exec import measure as m
    # TUNER_PROFILE=<folder>: a benchmark Worker profiles its measurements and writes the
    # profile there after each (a diagnostic: where a measurement's time goes inside a run or
    # a sweep; `python -m pstats <file>` reads it). Workers are killed, not asked to exit.
    profile_dir = os.environ.get("TUNER_PROFILE") if not init.get("nice") else None
    prof = None
    if profile_dir:
        import cProfile
        prof = cProfile.Profile()
    try:
        backend = get_backend(init["backend"], init["device"], **init["options"])
    except Exception:
        backend_error = traceback.format_exc()
        backend = None

    while True:
        try:
            method, kw = _recv(in_fd)
        except EOFError:
            return
        # Candidate code runs in these requests; the tool's own (device facts) gets an hour.
        _cpu_budget(init["cpu_s"] if method in ("compile", "measure", "recheck", "time_many") else 3600)
        try:
            if backend is None:
                raise RuntimeError(backend_error)
            if method == "compile":
                value = backend.compile(kw["source"], OpSpec.from_json(kw["op"]), kw["workdir"],
                                        kw["timeout_s"])
            elif method == "measure":
                if prof is not None:
                    prof.enable()
                try:
                    value = m.measure(backend, kw["artifact"], kw["spec"], kw["settings"],
                                      kw.get("best_s"), kw.get("reference_s"), kw.get("floor"))
                finally:
                    if prof is not None:
                        prof.disable()
                        _dump_profile(prof, profile_dir)
            elif method == "device_info":  # with what this process's sandbox could do (run.json, records)
                value = backend.device_info()
                facts = sandbox_facts(network, writes, syscalls, backend.sandbox())
                value = dataclasses.replace(value, toolchain=(*value.toolchain, ("sandbox", facts)))
            elif method == "time_reference":
                value = m.time_reference(backend, kw["spec"], kw["settings"])
            elif method == "memcheck":
                value = backend.memcheck(kw["artifact"], kw["spec"], kw["timeout_s"])
            elif method == "recheck":
                value = m.recheck(backend, kw["artifact"], kw["spec"])
            elif method == "time_many":
                value = m.time_many(backend, kw["artifacts"], kw["spec"], kw["settings"],
                                    with_reference=kw.get("with_reference", False))
            elif method == "stats":
                value = dict(m.TIMES)
            elif method == "ping":
                value = os.getpid()
            elif method == "sandbox":
                value = {"network": network, "writes": writes, "syscalls": syscalls}
            elif method == "warm":  # ahead of the first request: see Runner.warm_up
                op = OpSpec.from_json(kw["op"]) if kw.get("op") else None
                if kw.get("bench") and op is not None:
                    m.prepare(backend, op)
                    backend.memcheck_ahead(op)
                else:
                    backend.warm(op)
                value = os.getpid()
            else:
                raise ValueError(f"unknown worker method {method!r}")
            reply = ("ok", value)
        except OutsideKill as e:
            reply = ("outside", str(e))
        except Exception:
            reply = ("error", traceback.format_exc())
        if reply[0] == "ok" and backend.context_lost():
            reply = ("last", reply[1])  # a kernel fault poisoned the device context
        _send(out_fd, reply)
        if reply[0] == "last":
            return


if __name__ == "__main__":
    main()

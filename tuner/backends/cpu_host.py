"""The judge's side of the cpu backend's kernel host (cpu_host.c): a C kernel runs in a small
native process of its own, never in the Python process that checks and times it.

* `SharedBuffer`: a buffer the harness hands a kernel, in memory shared with the host (a memfd)
  and nothing else of this process. The host maps it between unmapped fences, an input
  read-only (through a read-only descriptor: no mprotect can make it writable).
* `HostKernel`: one loaded kernel, one host process. `call(buffers, flush)` runs it once (the
  caches evicted first, in the host, with `flush`) and returns the seconds it took by the
  host's clock, checked against the judge's own reading of the same clock: the host writes
  when it read the request and when the kernel began to a socket only the judge reads, before
  the kernel runs; calls must begin promptly after they are sent (a kernel that made its
  host answer early and worked on delays the next call's start); and the start and end it
  reports must match when the system stamped their messages sent (a kernel that rewrote its
  host's clock).
* `host_binary()`: the host, built once per machine and compiler with the system C compiler.
* `evictor()`: the host's cache eviction as a function of this process (for what the judge
  times here: the torch reference, the bandwidth copy), or None where the CPU has none.

Contract: a candidate's fault while it runs is `KernelFault` (its process died: the signal and
what it means; a forbidden system call is SIGSYS); a kill from outside (SIGKILL, SIGTERM) is
`OutsideKill`, the machine's failure and not the kernel's; a host whose reported times do not fit
the judge's clock is `ClockMismatch`. Linux; elsewhere `host_binary` raises `HostUnavailable`.
"""

from __future__ import annotations

import array
import errno
import functools
import hashlib
import itertools
import mmap
import os
import re
import select
import signal
import socket
import statistics
import struct
import subprocess
import sys
import time
import weakref
from pathlib import Path

from tuner.backends.base import OUTSIDE_SIGNALS, BackendUnavailable, ClockMismatch, OutsideKill
from tuner.backends.fence import BAND_BYTES, FENCE_BYTES

SOURCE = Path(__file__).with_name("cpu_host.c")
_OP_MAP, _OP_CALL, _OP_EXIT = 1, 2, 3
_HELD_SECCOMP, _HELD_USER_DROPPED, _HELD_NOT_ROOT, _HELD_NO_NEW_PRIVS, _HELD_FIXED_READ_ONLY = 1, 2, 4, 8, 16
_HELD_KERNEL_HEAP = 32
_REPLY = struct.Struct("<qq")
_MAX_ARGS = 16
_START_S = 60.0  # the host's set-up (dlopen, OpenMP's threads) answers within this
# A call's start after it was sent (the host waking to read it: tens of microseconds) may not
# be late by more than this, or a quarter of the kernel's own time, in the median of the last
# _LATE_WINDOW calls, with the host's main thread busy in most of them: the host was still
# working when it was asked. Busy: on a core for at least _BUSY_SHARE of the lateness before it
# read the call (/proc/<host>/schedstat over the send to the reply, less the read to the reply:
# what the host spent before the read, at least). A host that
# was preempted (its reply woke the judge, which took its core; other work on a loaded machine)
# or asleep spends none of that time on a core; one that works on after answering spends it all.
_LATE_S = 200e-6
_LATE_WINDOW = 16
_BUSY_SHARE = 0.25
# A call's reported span (t0 to t1) is the host's word, and a kernel controls its process (shown:
# one that rewrote the host's clock slot reported a quarter of its time; after its first call the
# next call's start is its doing too). So the judge holds t0 and t1 to when the host sent them, as
# the system stamped each message on the judge's sockets (SO_TIMESTAMPNS, which Linux sets on
# Unix sockets; the judge's own reading of the clock would add its wake-up, up to a millisecond on
# a virtual machine): what they leave out, in the median of the last _LATE_WINDOW calls, may not
# pass _HIDDEN_S or a tenth of the call. An honest host sends each microseconds after reading it.
_HIDDEN_S = 100e-6
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux's number where Python lacks the name
# OpenMP's wait settings: the judge's own in its benchmark workers (CpuBackend.bench_env), the
# user's in a kernel's host.
WAIT_SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
_HOST_ENV = re.compile(r"^(OMP_\w+|GOMP_\w+|KMP_\w+|LD_LIBRARY_PATH)$")


class HostUnavailable(BackendUnavailable):
    """The kernel host cannot be built or started here (not Linux, no compiler)."""


class KernelFault(RuntimeError):
    """The kernel's process died under it (the candidate's fault)."""


class LoadError(RuntimeError):
    """The kernel's object did not load (an unknown symbol, no entry)."""


# ---- the binary -------------------------------------------------------------------------------

@functools.lru_cache(maxsize=4)
def host_binary(cc: str, cache_dir: str | None = None) -> tuple[str, str]:
    """(path to the host, a note: "" or why seccomp is missing from this build), built with the
    C compiler `cc`. Built once per source, compiler and machine under the cache folder (and
    looked up once per process); a concurrent build by another worker is harmless (each writes
    its own file and renames it into place)."""
    folder = _build_folder(cc, cache_dir)
    exe, note_file = folder / "cpu_host", folder / "note.txt"
    if exe.is_file() and note_file.is_file():
        return str(exe), note_file.read_text()
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f"cpu_host.{os.getpid()}.tmp"
    note = ""
    for extra in ([], ["-DTUNER_NO_SECCOMP"]):
        proc = subprocess.run([cc, *_HOST_FLAGS, *extra, str(SOURCE), "-o", str(tmp), "-ldl", "-lpthread"],
                              capture_output=True, text=True, timeout=120)
        if proc.returncode == 0:
            break
        note = "seccomp: not built in (" + (proc.stderr.strip().splitlines() or ["?"])[0][:200] + ")"
    else:
        raise HostUnavailable(f"the kernel host did not compile with {cc}: {proc.stderr.strip()[:1000]}")
    note_file.write_text(note)
    os.chmod(tmp, 0o755)
    os.replace(tmp, exe)
    return str(exe), note


# Full RELRO: the host's slots for the functions it calls (clock_gettime's among them) are
# read-only once it has started, so a kernel cannot rewrite one with a store; it would need a
# system call the host also makes. The judge's check of a call's end stands behind that.
_HOST_FLAGS = ("-O2", "-std=gnu11", "-fopenmp", "-rdynamic", "-Wl,-z,relro,-z,now")


def _build_folder(cc: str, cache_dir: str | None) -> Path:
    """Where the host and its library are built for this source, compiler and machine."""
    if not sys.platform.startswith("linux"):
        raise HostUnavailable(f"the kernel host needs Linux (memfd, seccomp); this is {sys.platform}")
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HostUnavailable(f"{cc} --version failed: {e}") from None
    key = hashlib.sha256(SOURCE.read_bytes() + version.encode() + os.uname().machine.encode()
                         + " ".join(_HOST_FLAGS).encode()).hexdigest()[:16]
    return Path(cache_dir or Path.home() / ".cache" / "tuner") / "cpu_host" / key


@functools.lru_cache(maxsize=4)
def evictor(cc: str, cache_dir: str | None = None):
    """`evict(address, nbytes)`: the host's eviction of a range from every cache level, in this
    process (cpu_host.c built as a library), or None where this CPU has no instruction for it
    (the caller then writes a buffer larger than the caches) or it does not build."""
    import ctypes
    try:
        folder = _build_folder(cc, cache_dir)
    except HostUnavailable:
        return None
    lib = folder / "libtuner_evict.so"
    if not lib.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"libtuner_evict.{os.getpid()}.tmp"
        proc = subprocess.run([cc, "-O2", "-std=gnu11", "-shared", "-fPIC", "-DTUNER_EVICT_LIBRARY", str(SOURCE),
                               "-o", str(tmp)], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            return None
        os.replace(tmp, lib)
    try:
        fn = ctypes.CDLL(str(lib)).tuner_evict
    except (OSError, AttributeError):  # a cache folder mounted noexec, a truncated file
        return None
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t], ctypes.c_int
    probe = ctypes.create_string_buffer(64)
    return fn if fn(ctypes.addressof(probe), 64) == 0 else None


# ---- shared buffers ---------------------------------------------------------------------------

_ids = itertools.count(1)


class SharedBuffer:
    """`open_bytes` of shared memory (the caller's data plus BAND_BYTES of band on each side,
    rounded to pages) in `raw`, a writable buffer of this process. `read_only()`: the kernel
    gets it read-only from its next mapping on (the harness fills inputs first)."""

    def __init__(self, nbytes: int):
        self.open_bytes = -(-(BAND_BYTES + nbytes + BAND_BYTES) // mmap.PAGESIZE) * mmap.PAGESIZE
        self.id = next(_ids)
        self.fd = os.memfd_create(f"tuner-buffer-{self.id}", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, self.open_bytes)
        self.raw = mmap.mmap(self.fd, self.open_bytes)
        import ctypes
        view = ctypes.c_char.from_buffer(self.raw)
        self.start = ctypes.addressof(view)
        del view  # a live export would keep the mapping from ever closing
        self.readonly = False
        weakref.finalize(self, os.close, self.fd)

    def read_only(self) -> None:
        self.readonly = True

    def holds(self, addr: int) -> bool:
        return self.start <= addr < self.start + self.open_bytes


class Buffers:
    """The live shared buffers of a process, found by address (a tensor's data_ptr)."""

    def __init__(self):
        self._live: weakref.WeakValueDictionary[int, SharedBuffer] = weakref.WeakValueDictionary()

    def new(self, nbytes: int) -> SharedBuffer:
        b = SharedBuffer(nbytes)
        self._live[b.id] = b
        return b

    def find(self, addr: int) -> SharedBuffer | None:
        for b in list(self._live.values()):
            if b.holds(addr):
                return b
        return None


# ---- the host process -------------------------------------------------------------------------

def _host_env() -> dict[str, str]:
    """Empty but for the OpenMP runtime's settings (and where its libraries are): the user's,
    not the judge's own wait policy (CpuBackend.bench_env)."""
    env = {k: v for k, v in os.environ.items() if _HOST_ENV.match(k) and k not in WAIT_SETTINGS}
    for name in WAIT_SETTINGS:
        if "TUNER_KERNEL_" + name in os.environ:
            env[name] = os.environ["TUNER_KERNEL_" + name]
    if "OMP_THREAD_LIMIT" not in env:
        # Every thread a kernel's team can have is one the host clears the stack of before each
        # call (cpu_host.c); a thread past the limit would keep what a call left there. The
        # library's spaces ask for at most the cores.
        first = env.get("OMP_NUM_THREADS", "").split(",")[0].strip()
        env["OMP_THREAD_LIMIT"] = str(max(os.cpu_count() or 1, int(first) if first.isdigit() else 0))
    return env


class HostKernel:
    """One kernel in its own host process. Not thread-safe (a benchmark worker is one thread)."""

    def __init__(self, binary: str, artifact: str, buffers: Buffers, flush_bytes: int = 0):
        self.artifact, self.buffers = artifact, buffers
        self._late: list[int] = []  # ns from sending each recent call to the host reading it
        self._took: list[int] = []  # ns each recent call took by the host's clock
        self._ran: list[bool] = []  # whether the host's main thread was busy while each was late
        self._stat = None  # /proc/<host>/stat, opened at the first call that needs it
        self._schedstat = None  # /proc/<host>/schedstat, opened at the first call; False: unreadable
        self._sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # The clock channel: a socket, not a pipe, so that the system stamps when each start
        # was sent (below); only the judge holds its other end.
        self._clock, clock_w = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [binary, artifact, str(os.getpid()), str(FENCE_BYTES), str(child.fileno()), str(clock_w.fileno()),
                 str(flush_bytes)],
                stdin=subprocess.DEVNULL, env=_host_env(), pass_fds=(child.fileno(), clock_w.fileno()),
                close_fds=True)
        finally:
            child.close()
            clock_w.close()
        self._mapped: set[int] = set()
        self._finalizer = weakref.finalize(self, _stop, self.proc, self._sock, self._clock)
        self._sock.settimeout(_START_S)
        try:
            held, value = self._reply()
        except socket.timeout:
            self.close()
            raise HostUnavailable(f"the kernel host did not start within {_START_S:g} s") from None
        finally:
            self._sock.settimeout(None)
        if held < 0:
            msg = self._sock.recv(4096).decode(errors="replace") if value > 0 else "?"
            self.close()
            raise LoadError(msg)
        self.threads = value & 0xFFFFFFFF
        self.facts = _facts(held, value >> 32)
        self._hidden: list[int] = []  # ns of each recent call that its reported span left out
        for channel in (self._sock, self._clock):
            try:
                channel.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            except OSError:
                pass  # no stamps: the check in `call` has nothing to hold the times to

    def _stamped_reply(self) -> tuple[int, int, int | None]:
        """A reply with when it was sent (see _stamped)."""
        try:
            data, stamp = _stamped(self._sock, _REPLY.size)
        except OSError:
            data, stamp = b"", None
        if len(data) != _REPLY.size:
            raise self._death()
        return (*_REPLY.unpack(data), stamp)

    def _reply(self) -> tuple[int, int]:
        try:
            data = self._sock.recv(_REPLY.size)
        except socket.timeout:
            raise
        except OSError:
            data = b""
        if len(data) != _REPLY.size:
            raise self._death()
        return _REPLY.unpack(data)

    def _death(self) -> Exception:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return KernelFault("the kernel's process stopped answering (its channel closed); killed")
        if code == _EXIT_KEPT_HEAP:
            return KernelFault("the kernel returned holding heap memory it had allocated and not freed: "
                               "a kernel keeps nothing from one call to the next, so every block it "
                               "allocates it frees before it returns")
        if code == _EXIT_TEAM_LEFT_RUNNING:
            return KernelFault("the kernel returned with an OpenMP team of its own still running (work "
                               "that would go on after the call, untimed): every parallel region a "
                               "kernel starts must end before it returns")
        if code >= 0:
            return KernelFault(f"the kernel's process exited with code {code}")
        sig = signal.Signals(-code)
        if sig in OUTSIDE_SIGNALS:
            return OutsideKill(f"the kernel's process was killed from outside ({sig.name}: the OOM "
                               f"killer, or an operator)")
        return KernelFault(f"the kernel's process died with {sig.name}" + _MEANING.get(sig, ""))

    def _send(self, header: bytes, fd: int | None = None) -> None:
        try:
            if fd is None:
                self._sock.sendmsg([header])
            else:
                self._sock.sendmsg([header], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
        except (BrokenPipeError, ConnectionResetError):
            raise self._death() from None

    def _map(self, b: SharedBuffer) -> None:
        # A read-only buffer goes as a read-only descriptor: its mapping can never be made writable.
        fd = os.open(f"/proc/self/fd/{b.fd}", os.O_RDONLY) if b.readonly else b.fd
        try:
            self._send(struct.pack("<IIQQ", _OP_MAP, b.id, b.open_bytes, int(b.readonly)), fd)
        finally:
            if fd != b.fd:
                os.close(fd)
        status, _ = self._reply()
        if status < 0:
            raise OSError(-status, f"the kernel host could not map a buffer of {b.open_bytes} bytes: "
                                   f"{os.strerror(-status)}")
        self._mapped.add(b.id)

    def call(self, tensors: list, flush: bool = False) -> float:
        """Run the kernel once on `tensors` (views into SharedBuffers), with the caches evicted
        first (in the host, untimed) when `flush`; its seconds by the host's clock, checked
        against the judge's. Raises ClockMismatch when they disagree."""
        if len(tensors) > _MAX_ARGS:
            raise ValueError(f"a C kernel takes at most {_MAX_ARGS} buffers; this op has {len(tensors)}")
        args = []
        for t in tensors:
            addr = t.data_ptr()
            b = self.buffers.find(addr)
            if b is None:
                raise ValueError("a cpu kernel runs only on buffers made by CpuBackend.host_buffer")
            if b.id not in self._mapped:
                self._map(b)
            args.append(struct.pack("<IIQQ", b.id, 0, addr - b.start, b.open_bytes))
        cpu0 = self._cpu_ns()
        ran = self._running() if cpu0 is None else False
        sent = time.monotonic_ns()
        self._send(struct.pack("<IIQQ", _OP_CALL, len(args), int(flush), 0) + b"".join(args))
        status, t1, stamp = self._stamped_reply()
        came = time.monotonic_ns()
        cpu1 = self._cpu_ns() if cpu0 is not None else None
        if status == -errno.ESTALE:
            raise KernelFault("the kernel host refused a call: its table of buffer sizes no longer matched the "
                              "judge's (the kernel wrote over the host's memory, which would have left part "
                              "of its buffers in the caches for the next timed call)")
        if status < 0:
            raise OSError(-status, f"the kernel host refused a call: {os.strerror(-status)}")
        ready, _, _ = select.select([self._clock], [], [], 0)
        raw, begun = _stamped(self._clock, 16) if ready else (b"", None)
        if len(raw) != 16:
            raise ClockMismatch("the kernel's process answered a call without first reporting when it began")
        read, t0 = struct.unpack("<qq", raw)
        if not sent <= read <= t0 <= t1 <= came:
            raise ClockMismatch(f"the kernel's process reported a call read at {read}, run from {t0} to {t1} "
                                f"ns, outside the judge's own reading of the clock ({sent} to {came} ns)")
        if cpu0 is not None and cpu1 is not None:
            # Time on a core before the host read the call: all it spent, less the most it could
            # have spent from the read to the reply (the wall time between them: the flush, the
            # stacks cleared, the kernel, the heap zeroed, all on this thread). Less only the
            # kernel's own time, as before, counted the host's untimed work after the read as
            # busy: every late call looked busy, and an honest kernel on a loaded machine (two
            # busy loops on two cores) was SUSPECT once in four evaluations.
            ran = (cpu1 - cpu0) - (came - read) >= _BUSY_SHARE * (read - sent)
        if stamp is not None and begun is not None:
            # What the reported span left out: an end reported before the reply was sent, or a
            # start reported after it was (the host reads t0, sends it, then runs the kernel).
            self._hidden = [*self._hidden[1 - _LATE_WINDOW:], max(stamp - t1, t0 - begun)]
        if len(self._hidden) == _LATE_WINDOW:
            left = statistics.median(self._hidden) * 1e-9
            took = statistics.median([*self._took[2 - _LATE_WINDOW:], t1 - t0]) * 1e-9
            if left > max(_HIDDEN_S, 0.1 * took):
                self._hidden = []
                raise ClockMismatch(
                    f"the kernel's process reported its calls shorter than they were: {left * 1e6:.0f} us "
                    f"of each (the median of {_LATE_WINDOW}; {took * 1e6:.0f} us a call) lay between the "
                    f"start and end it reported and when it sent them, as the system stamped its "
                    f"messages, where an honest host sends each at once: a kernel that rewrites its "
                    f"host's clock or returns past it")
        self._late = [*self._late[1 - _LATE_WINDOW:], read - sent]
        self._took = [*self._took[1 - _LATE_WINDOW:], t1 - t0]
        self._ran = [*self._ran[1 - _LATE_WINDOW:], ran]
        if len(self._late) == _LATE_WINDOW:
            late, took = statistics.median(self._late) * 1e-9, statistics.median(self._took) * 1e-9
            # Late but not busy: the wake-up of an idle core (a virtual machine's halted vCPU
            # takes ~300 us) or a wait for a core on a loaded machine, not a host busy after
            # answering.
            busy = sum(self._ran)
            if late > max(_LATE_S, 0.25 * took) and 2 * busy >= _LATE_WINDOW:
                self._late, self._took, self._ran = [], [], []  # the calls after: a window of their own
                raise ClockMismatch(
                    f"the kernel's process began its calls late: {late * 1e6:.0f} us after they were sent "
                    f"(the median of {_LATE_WINDOW}), against {took * 1e6:.0f} us a call, its main thread "
                    f"on a core through {busy} of those waits: it was still busy after it had answered "
                    f"(an answer sent early, the work finished after)")
        return (t1 - t0) * 1e-9

    def _cpu_ns(self) -> int | None:
        """Nanoseconds the host's main thread has spent on a core (/proc/<host>/schedstat), or
        None where the kernel keeps no such figure (then `_running` judges)."""
        if self._schedstat is False:
            return None
        try:
            if self._schedstat is None:
                self._schedstat = open(f"/proc/{self.proc.pid}/schedstat", "rb", buffering=0)
            return int(os.pread(self._schedstat.fileno(), 128, 0).split()[0])
        except (OSError, ValueError, IndexError):
            self._schedstat = False
            return None

    def _running(self) -> bool:
        """Whether the host's main thread is runnable now (not asleep in its read of the next
        call), from /proc; True where that cannot be read (the check then judges by time alone).
        Runnable includes waiting for a core: the coarser signal, where schedstat is missing."""
        try:
            if self._stat is None:
                self._stat = open(f"/proc/{self.proc.pid}/stat", "rb", buffering=0)
            raw = os.pread(self._stat.fileno(), 512, 0)
            return raw[raw.rindex(b")") + 2:raw.rindex(b")") + 3] == b"R"
        except (OSError, ValueError):
            return True

    def close(self) -> None:
        for f in (self._stat, self._schedstat):
            if f:
                f.close()
        self._finalizer()


def _stamped(channel: socket.socket, size: int) -> tuple[bytes, int | None]:
    """One message and when it was sent (CLOCK_MONOTONIC ns, from the system's stamp:
    SO_TIMESTAMPNS, in CLOCK_REALTIME), or None where the system stamped nothing."""
    data, anc, _, _ = channel.recvmsg(size, socket.CMSG_SPACE(16))
    real, mono = time.clock_gettime_ns(time.CLOCK_REALTIME), time.monotonic_ns()
    for level, kind, raw in anc:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(raw) >= 16:
            sec, ns = struct.unpack("<qq", raw[:16])
            return data, sec * 1_000_000_000 + ns - (real - mono)
    return data, None


def _stop(proc: subprocess.Popen, sock: socket.socket, clock: socket.socket) -> None:
    try:
        sock.sendmsg([struct.pack("<IIQQ", _OP_EXIT, 0, 0, 0)])
    except OSError:
        pass
    sock.close()
    clock.close()
    try:
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


_EXIT_TEAM_LEFT_RUNNING = 6  # cpu_host.c's EXIT_TEAM_LEFT_RUNNING
_EXIT_KEPT_HEAP = 7  # cpu_host.c's EXIT_KEPT_HEAP
_MEANING = {
    signal.SIGSEGV: " (a store outside its buffers, or to a read-only input, faults: its inputs were "
                    "read-only and every buffer fenced by unmapped pages)",
    signal.SIGBUS: " (a store outside its buffers, or a misaligned access)",
    signal.SIGSYS: " (it made a system call the sandbox forbids: a kernel may not open files or "
                   "sockets, start processes or signal them)",
    signal.SIGXCPU: " (it ran past its CPU time)",
    signal.SIGFPE: " (an integer division by zero, or an arithmetic trap)",
    signal.SIGILL: " (an illegal instruction: compiled for another CPU?)",
    signal.SIGABRT: " (it aborted: an assert, or the C library found its heap corrupt)",
}


def _facts(held: int, err: int) -> str:
    """What held in a host, in words (records' toolchain, the run summary)."""
    parts = ["kernel process: native, no interpreter, judged from another process"]
    if held & _HELD_SECCOMP:
        parts.append("seccomp: on (files, sockets, exec, fork, ptrace, signals refused)")
    else:
        parts.append(f"seccomp: MISSING ({os.strerror(err) if err else 'not built in'})")
    if held & _HELD_USER_DROPPED:
        parts.append("user: nobody (dropped from root)")
    elif held & _HELD_NOT_ROOT:
        parts.append(f"user: {os.getuid()} (not root)")
    else:
        parts.append("user: root (MISSING: could not drop to nobody)")
    if not held & _HELD_FIXED_READ_ONLY:
        parts.append("host settings: writable (MISSING: the page could not be made read-only)")
    if held & _HELD_KERNEL_HEAP:
        parts.append("kernel heap and stacks: cleared between calls")
    else:
        parts.append("kernel heap: the C library's (MISSING: no arena of the host's, so a freed block "
                     "keeps its contents for the next call; stacks are still cleared)")
    return "; ".join(parts)


def probe(binary: str) -> str:
    """What the sandbox holds for a kernel host on this machine, in words (starts one, loads
    nothing)."""
    host = HostKernel(binary, "-", Buffers())
    try:
        return host.facts
    finally:
        host.close()

"""What candidate code can see of the tool and the machine: the parts of the sandbox that do not
depend on a static check of the code.

* `worker_env()`: a worker's environment is an allowlist (what Python, torch, Triton, the
  compilers and the device runtimes read), not the user's environment with secret-looking
  names removed: a secret in a variable with an innocent name stays out too.
* `hide_from_proc(argv)`: the tool's own process keeps its environment and command line in
  memory that any process of the same user (or root) reads through /proc/<pid>/environ and
  /proc/<pid>/cmdline, a worker through /proc/<its parent>/. Once Python has copied both,
  the original environment block is cleared (the C library's environment is moved to copies
  first, so getenv in the process still works) and the value of a secret flag in the
  command line is overwritten.
* `not_dumpable()`: the tool's process is not dumpable, so a worker running as the same
  (non-root) user cannot read its memory or /proc files at all.
* `isolate_network()`: a worker gives itself a network namespace of its own before it runs
  any candidate code (no interface but a loopback that is down): no socket reaches anything.
  Where the kernel refuses (no CAP_SYS_ADMIN and no unprivileged user namespaces) it says why
  and the worker goes on without it.
* `restrict_syscalls()`: a seccomp filter: no internet or raw socket (the network, also where
  no namespace could be had) and no access to another process's memory (process_vm_*). Exec
  and fork stay: workers run compilers.
* `confine_writes(dirs)`: Landlock: from then on the worker and everything it starts (the
  compilers) may create, write, truncate, rename or remove files only under `dirs` (the run
  folder, the caches, the temporary folder, /dev for device nodes). Root is confined too.
  Where the kernel has no Landlock it says so and the worker goes on without it.

The cpu backend's kernels run in a process confined further (a seccomp filter, user nobody:
tuner/backends/cpu_host.c). Linux. Elsewhere each is a no-op that says so.
"""

from __future__ import annotations

import ctypes
import os
import re
import struct
import sys
from pathlib import Path

# What a worker's environment keeps: the runtime's own variables and the tool's.
_KEEP = re.compile(r"^(PATH|HOME|USER|LOGNAME|SHELL|LANG|LANGUAGE|TERM|TZ|TMPDIR|PWD|LC_\w+|"
                   r"LD_LIBRARY_PATH|LIBRARY_PATH|CPATH|C_INCLUDE_PATH|PYTHONPATH|PYTHONHOME|"
                   r"VIRTUAL_ENV|CONDA_\w+|XDG_CACHE_HOME|CC|CXX|CFLAGS|OMP_\w+|GOMP_\w+|KMP_\w+|"
                   r"MKL_\w+|OPENBLAS_\w+|CUDA_\w+|NVIDIA_\w+|NV_\w+|CUBLAS_\w+|CUDNN_\w+|PTXAS_\w+|"
                   r"TRITON_\w+|TORCH_\w+|PYTORCH_\w+|ASCEND_\w+|ASCEND|NPU_\w+|TUNER_\w+|MLIR_\w+|"
                   r"HIP_\w+|ROCM_\w+|RAY_\w+)$")
# Names that look secret: never kept, even where the pattern above would keep them.
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION", re.I)
SECRET_FLAGS = ("--llm-api-key",)

_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000


def worker_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if environ is None else environ)
    return {k: v for k, v in env.items() if _KEEP.match(k) and not SECRET_NAME.search(k)}


def _stat_fields() -> list[str] | None:
    try:
        with open("/proc/self/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].decode().split()
    except OSError:
        return None


def hide_from_proc(argv: list[str] | None = None) -> bool:
    """Clear this process's original environment block and the values of secret flags in its
    original command line. True when done (Linux), False where /proc does not say where they
    are."""
    fields = _stat_fields()
    if fields is None or len(fields) < 49:
        return False
    # proc(5): fields 48-51 are arg_start, arg_end, env_start, env_end; `fields` starts at 3.
    arg_start, arg_end, env_start, env_end = (int(x) for x in fields[45:49])
    for k, v in os.environ.items():  # the C library's environment: copies, not the block
        os.putenv(k, v)
    if env_end > env_start:
        ctypes.memset(env_start, 0, env_end - env_start)
    if arg_end > arg_start:  # "--llm-api-key VALUE" and "--llm-api-key=VALUE"
        words = ctypes.string_at(arg_start, arg_end - arg_start).split(b"\0")
        pos, hide_next = 0, False
        for w in words:
            flag, eq, value = w.partition(b"=")
            if hide_next:
                ctypes.memset(arg_start + pos, ord("*"), len(w))
            elif flag.decode(errors="replace") in SECRET_FLAGS and eq:
                ctypes.memset(arg_start + pos + len(flag) + 1, ord("*"), len(value))
            hide_next = not hide_next and not eq and flag.decode(errors="replace") in SECRET_FLAGS
            pos += len(w) + 1
    return True


def isolate_network() -> str:
    """Move this process into a network namespace of its own. Must run before any thread
    starts (the kernel refuses a user namespace to a threaded process). Returns
    "isolated", or why not."""
    if not sys.platform.startswith("linux"):
        return f"not isolated: {sys.platform} has no network namespaces"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNET) == 0:
        return "isolated"
    first = os.strerror(ctypes.get_errno())
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) == 0:
        try:  # the same uid and gid inside as outside: files keep their owners
            with open("/proc/self/setgroups", "w") as f:
                f.write("deny")
            with open("/proc/self/uid_map", "w") as f:
                f.write(f"{uid} {uid} 1")
            with open("/proc/self/gid_map", "w") as f:
                f.write(f"{gid} {gid} 1")
        except OSError as e:
            return f"isolated, but the user namespace has no uid map ({e})"
        return "isolated"
    return (f"not isolated: the kernel refused a network namespace ({first}) and a user namespace "
            f"({os.strerror(ctypes.get_errno())})")


# Landlock's write rights (linux/landlock.h): WRITE_FILE, REMOVE_DIR, REMOVE_FILE, MAKE_CHAR,
# MAKE_DIR, MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM; REFER from ABI 2, TRUNCATE
# from ABI 3. Reading and executing are not handled: compilers read the whole system.
_LL_WRITE = sum(1 << b for b in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12))
_LL_CREATE_RULESET, _LL_ADD_RULE, _LL_RESTRICT_SELF = 444, 445, 446  # the same on every architecture
_PR_SET_NO_NEW_PRIVS = 38


def confine_writes(dirs: list[str]) -> str:
    """Allow file writes only under `dirs` from now on, for this process and what it starts.
    Must run before any thread starts (Landlock confines the calling thread and its future
    children). Returns what held, in words."""
    if not sys.platform.startswith("linux"):
        return f"not confined ({sys.platform} has no Landlock)"
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(ctypes.c_long(_LL_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 1:
        return f"not confined (the kernel has no Landlock: {os.strerror(ctypes.get_errno())})"
    handled = _LL_WRITE | (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0)
    attr = ctypes.c_uint64(handled)
    ruleset = libc.syscall(ctypes.c_long(_LL_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(8),
                           ctypes.c_uint32(0))
    if ruleset < 0:
        return f"not confined (Landlock refused a ruleset: {os.strerror(ctypes.get_errno())})"
    kept = []
    # The process's own /proc entries: the CUDA driver writes there (cudaGetDeviceCount fails
    # with "OS call failed" without), and they are no one else's.
    own = f"/proc/{os.getpid()}"
    try:
        for d in dict.fromkeys([*(os.path.realpath(d) for d in dirs if d), own]):
            try:
                fd = os.open(d, os.O_PATH | os.O_CLOEXEC | os.O_DIRECTORY)
            except OSError:
                continue  # a folder that does not exist cannot be written under either
            try:
                rule = struct.pack("<Qi", handled, fd)  # landlock_path_beneath_attr, packed
                if libc.syscall(ctypes.c_long(_LL_ADD_RULE), ctypes.c_int(ruleset), ctypes.c_int(1),
                                ctypes.c_char_p(rule), ctypes.c_uint32(0)) == 0:
                    kept.append(d)
            finally:
                os.close(fd)
        libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if libc.syscall(ctypes.c_long(_LL_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            return f"not confined (Landlock: {os.strerror(ctypes.get_errno())})"
    finally:
        os.close(ruleset)
    return f"Landlock ABI {abi}: only under {', '.join(kept)}"


def write_dirs(run_dir: str | None, settings=None) -> list[str]:
    """Where a worker may write: its run folder (builds, logs), the runs folder, the tool's
    cache, Triton's and CUDA's caches, the temporary folder, /dev (device nodes are opened for
    writing) and a profile folder if one is asked for. Made here if missing, so that a cache
    created later is still writable."""
    import tempfile
    home = Path.home()
    dirs = [run_dir, getattr(settings, "runs_dir", None),
            getattr(settings, "cache_dir", None) or str(home / ".cache" / "tuner"),
            os.environ.get("TRITON_CACHE_DIR") or str(home / ".triton"), str(home / ".nv"),
            tempfile.gettempdir(), "/dev", os.environ.get("TUNER_PROFILE")]
    out = []
    for d in dirs:
        if not d:
            continue
        try:
            Path(d).mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        out.append(str(Path(d).resolve()))
    return out


def sandbox_facts(network: str, writes: str, syscalls: str = "", device: str = "") -> str:
    """One line for a record's toolchain: which of the sandbox's parts held in this worker (and,
    from the device, in the processes that run its kernels). "MISSING" or "not confined" marks
    what did not hold here (the run summary lists them)."""
    return "; ".join(x for x in (
        "environment: allowlist", f"network: {network}", f"file writes: {writes}",
        f"worker seccomp: {syscalls}" if syscalls else "", "limits: memory, CPU time, file size", device) if x)


# seccomp for a worker: sockets of the internet and raw packets refused (the network where no
# namespace could be had, and in depth where it could), and reading or writing another
# process's memory. Not exec or fork: workers run compilers. Per architecture: its audit value,
# then socket, process_vm_readv, process_vm_writev.
_SECCOMP_ARCH = {"x86_64": (0xC000003E, 41, 310, 311), "aarch64": (0xC00000B7, 198, 270, 271)}
_NET_FAMILIES = (2, 10, 17)  # AF_INET, AF_INET6, AF_PACKET


def restrict_syscalls() -> str:
    """Install this worker's seccomp filter (inherited by everything it starts). Returns what
    held, in words. Must run before any thread starts."""
    import platform
    if not sys.platform.startswith("linux"):
        return f"not confined ({sys.platform} has no seccomp)"
    arch = _SECCOMP_ARCH.get(platform.machine())
    if arch is None:
        return f"not confined (no filter written for {platform.machine()})"
    audit, nr_socket, nr_vm_read, nr_vm_write = arch
    ld, jeq, ret = 0x20, 0x15, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K
    allow, deny = 0x7FFF0000, 0x00050000  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO
    eacces, eperm = 13, 1
    prog = [(ld, 0, 0, 4),                       # arch
            (jeq, 1, 0, audit), (ret, 0, 0, deny | eperm),
            (ld, 0, 0, 0),                       # nr
            (jeq, 0, 1 + 2 * len(_NET_FAMILIES) + 1, nr_socket), (ld, 0, 0, 16)]  # args[0]: the family
    for fam in _NET_FAMILIES:
        prog += [(jeq, 0, 1, fam), (ret, 0, 0, deny | eacces)]
    prog += [(ret, 0, 0, allow),
             (jeq, 0, 1, nr_vm_read), (ret, 0, 0, deny | eperm),
             (jeq, 0, 1, nr_vm_write), (ret, 0, 0, deny | eperm),
             (ret, 0, 0, allow)]
    if platform.machine() == "x86_64":  # x32 system call numbers: refused
        prog[4:4] = [(0x35, 0, 1, 0x40000000), (ret, 0, 0, deny | eperm)]  # BPF_JMP|BPF_JGE|BPF_K
    filt = (ctypes.c_uint8 * (8 * len(prog)))()
    for i, (code, jt, jf, k) in enumerate(prog):
        struct.pack_into("<HBBI", filt, 8 * i, code, jt, jf, k)

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    fprog = Fprog(len(prog), ctypes.addressof(filt))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        return f"not confined (seccomp: {os.strerror(ctypes.get_errno())})"
    return "on (internet sockets, other processes' memory refused)"


def missing(facts: str) -> list[str]:
    """The parts of a sandbox line (`sandbox_facts`) that did not hold: what the run summary
    lists so that a user sees what this machine could not confine."""
    return [part.strip() for part in facts.split("; ")
            if any(w in part for w in ("MISSING", "not confined", "not isolated"))]


def not_dumpable() -> bool:
    """Make this process non-dumpable: processes of the same user (a worker) can no longer read
    its memory or /proc/<pid>/environ (root still can). True when done."""
    if not sys.platform.startswith("linux"):
        return False
    return ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE

"""What candidate code can see of the tool and the machine (tuner/exec/sandbox.py): a worker's
environment is an allowlist, the tool's keys are out of /proc, and workers have no network."""

import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from tuner.exec.worker import Worker


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(x.decode(errors="replace").split("=", 1) for x in raw if b"=" in x)


def test_a_worker_starts_with_the_allowlisted_environment_only(fast_settings, tmp_path, monkeypatch):
    monkeypatch.setenv("MY_API_KEY", "k-123")
    monkeypatch.setenv("INNOCENT_LOOKING", "also-secret")
    monkeypatch.setenv("TUNER_SOMETHING", "kept")
    w = Worker("null", 0, {}, fast_settings, str(tmp_path / "w.log"))
    try:
        env = _environ(w.call("ping", timeout=60))
    finally:
        w.close()
    assert "MY_API_KEY" not in env and "INNOCENT_LOOKING" not in env
    assert env["TUNER_SOMETHING"] == "kept" and "PATH" in env


HIDE = """
import ctypes, os, subprocess, sys
from tuner.exec.sandbox import hide_from_proc
assert hide_from_proc()
me = open("/proc/self/environ", "rb").read() + open("/proc/self/cmdline", "rb").read()
child = subprocess.run([sys.executable, "-c", "import os; print(open(f'/proc/{os.getppid()}/environ', 'rb').read()"
                        " + open(f'/proc/{os.getppid()}/cmdline', 'rb').read())"],
                       capture_output=True, text=True, env={"PATH": os.environ["PATH"]}).stdout
libc = ctypes.CDLL(None); libc.getenv.restype = ctypes.c_char_p
marks = ["hun" + "ter" + n for n in "234"]  # not spelled out: this code is on the command line too
print(sum(me.count(s.encode()) for s in marks), sum(child.count(s) for s in marks),
      os.environ["SOME_VAR"], libc.getenv(b"SOME_VAR").decode(), sys.argv[1:])
"""


def test_the_tools_keys_are_out_of_proc_and_still_its_own():
    """/proc/<pid>/environ and cmdline of the tool's process (a worker's parent) no longer hold
    a key from its environment or its command line; the process itself still has them."""
    out = subprocess.run([sys.executable, "-c", HIDE, "--llm-api-key", "hunter3", "--llm-api-key=hunter4", "x"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60,
                         env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "SOME_VAR": "hunter2"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:4] == ["0", "0", "hunter2", "hunter2"], out.stdout
    assert "hunter3" in out.stdout and "hunter4" in out.stdout  # sys.argv: Python's copy


PROBE = """
import socket, sys
from tuner.exec.sandbox import isolate_network
state = isolate_network()
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=3).close()
    reached = "reached"
except OSError:
    reached = "unreachable"
print("isolated" if state.startswith("isolated") else "not-isolated", reached)
"""


def test_a_worker_has_no_network_where_the_kernel_allows_a_namespace(fast_settings, tmp_path):
    """Where the worker says it is isolated, nothing on this machine's loopback answers it;
    where it cannot be (a container without the capability), it says why."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        out = subprocess.run([sys.executable, "-c", PROBE, str(port)], capture_output=True, text=True,
                             cwd=ROOT, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        server.close()
    assert out.returncode == 0, out.stderr
    state, reached = out.stdout.split()
    assert (state, reached) in (("isolated", "unreachable"), ("not-isolated", "reached")), out.stdout
    w = Worker("null", 0, {}, fast_settings, str(tmp_path / "w.log"))
    try:
        said = w.call("sandbox", timeout=60)["network"]
    finally:
        w.close()
    assert ("isolated" if said.startswith("isolated") else "not-isolated") == state, said


WRITES = """
import os, sys
from tuner.exec.sandbox import confine_writes
said = confine_writes([sys.argv[1]])
out = []
for path in (os.path.join(sys.argv[1], "inside"), sys.argv[2]):
    try:
        with open(path, "w") as f:
            f.write("x")
        out.append("written")
    except OSError:
        out.append("refused")
print("confined" if said.startswith("Landlock") else "not-confined", *out)
"""


def test_a_worker_writes_files_only_where_it_is_allowed(fast_settings, tmp_path):
    """Where the kernel has Landlock: a write under the allowed folder works, one outside it is
    refused (root included); where it has none, the worker says so."""
    allowed, outside = tmp_path / "run", tmp_path / "elsewhere.txt"
    allowed.mkdir()
    out = subprocess.run([sys.executable, "-c", WRITES, str(allowed), str(outside)], capture_output=True,
                         text=True, cwd=ROOT, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    state, inside, elsewhere = out.stdout.split()
    assert inside == "written"
    assert (state, elsewhere) in (("confined", "refused"), ("not-confined", "written")), out.stdout
    assert (state == "confined") == (not outside.exists())
    w = Worker("null", 0, {}, fast_settings, str(tmp_path / "w" / "w.log"))
    (tmp_path / "w").mkdir()
    try:
        said = w.call("sandbox", timeout=60)["writes"]
    finally:
        w.close()
    assert said.startswith("Landlock") == (state == "confined"), said
    if state == "confined":
        assert str((tmp_path / "w").resolve()) in said


def test_a_worker_opens_no_internet_socket_even_without_a_namespace(fast_settings, tmp_path):
    """The worker's seccomp filter refuses internet and raw sockets (EACCES) whatever the
    namespace did, and says it holds."""
    code = ("import socket, sys\nfrom tuner.exec.sandbox import restrict_syscalls\nsaid = restrict_syscalls()\n"
            "out = []\nfor fam in (socket.AF_INET, socket.AF_INET6, socket.AF_UNIX):\n"
            "    try:\n        socket.socket(fam, socket.SOCK_STREAM).close(); out.append('open')\n"
            "    except OSError:\n        out.append('refused')\n"
            "print('on' if said.startswith('on') else 'off', *out)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    state, inet, inet6, unix = out.stdout.split()
    assert unix == "open"
    assert (state, inet, inet6) in (("on", "refused", "refused"), ("off", "open", "open")), out.stdout
    w = Worker("null", 0, {}, fast_settings, str(tmp_path / "w.log"))
    try:
        said = w.call("sandbox", timeout=60)["syscalls"]
    finally:
        w.close()
    assert said.startswith("on") == (state == "on"), said

"""Runs last (named so): no worker process outlives the tool that started it, after every
fault case the suite has run (crashes, hangs, killed actors, forked children), and no C kernel's
host process outlives the worker that started it."""

import os
import time
from pathlib import Path


def _orphaned_workers() -> list[str]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        exe = cmd.split(" ", 1)[0]
        if ("tuner.exec.worker" in cmd or exe.endswith("/cpu_host")) and ppid == 1:
            out.append(f"{pid}: {cmd}")
    return out


def test_no_worker_outlives_its_tool():
    deadline = time.monotonic() + 10  # a worker whose parent just ended notices within a second
    while _orphaned_workers() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _orphaned_workers()

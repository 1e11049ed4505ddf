"""compute-sanitizer's memcheck of one checked launch, for the cuda backend's winner.

`Memcheck.run(artifact, op, timeout_s)` launches the kernel once under compute-sanitizer
(`tuner.exec.memcheck`) and says "clean", "errors: <what it found>" or "not run: <why>": an
out-of-bounds or misaligned access anywhere in device memory, which the guard bands near the
buffers do not see. `start_ahead(op)` starts the checker's process while the search runs
(imports, the op and the CUDA context made, waiting on stdin for an artifact's path), so the
winner's check costs its launch, not a process's start. One process ahead at a time; one for
another op is ended.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tuner.core.values import OpSpec


def sanitizer() -> str | None:
    """The compute-sanitizer executable (PATH, then the CUDA toolkit's), or None."""
    return shutil.which("compute-sanitizer") or next(
        (str(p) for p in (Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "compute-sanitizer",
                          Path("/usr/local/cuda/bin/compute-sanitizer")) if p.is_file()), None)


class Memcheck:
    def __init__(self, device: int) -> None:
        self.device = device
        self._ahead: tuple[str, subprocess.Popen] | None = None  # (op's key, its checker waiting)

    def _cmd(self, artifact: str, op: OpSpec) -> list[str] | None:
        tool = sanitizer()
        if tool is None:
            return None
        return [tool, "--tool", "memcheck", "--error-exitcode", "9", "--print-limit", "5", sys.executable,
                "-m", "tuner.exec.memcheck", "cuda", artifact, json.dumps(op.to_json())]

    def _popen(self, cmd: list[str]) -> subprocess.Popen:
        # Without torch's caching allocator every tensor is its own allocation, so a store past a
        # buffer's guard bands is outside any allocation, which is what memcheck sees.
        env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1",
               "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", str(self.device))}
        return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env)

    def start_ahead(self, op: OpSpec) -> None:
        """A checker's process for `op`, reading the artifact's path from its stdin
        (`tuner.exec.memcheck -`). It ends by itself when this process does."""
        key = json.dumps(op.to_json(), sort_keys=True)
        ahead = self._ahead
        if ahead is not None and ahead[0] == key and ahead[1].poll() is None:
            return
        self._end_ahead()
        cmd = self._cmd("-", op)
        if cmd is not None:
            self._ahead = (key, self._popen(cmd))

    def _end_ahead(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            _end(ahead[1])

    def run(self, artifact: str, op: OpSpec, timeout_s: float) -> str:
        """The check of one launch of `artifact`; minutes at most. In the process started ahead
        for this op where there is one."""
        cmd = self._cmd(artifact, op)
        if cmd is None:
            return "not run: compute-sanitizer not found (it comes with the CUDA toolkit)"
        key = json.dumps(op.to_json(), sort_keys=True)
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == key and ahead[1].poll() is None:
            said = self._communicate(ahead[1], artifact + "\n", timeout_s)
            if said == "clean" or said.startswith("errors"):
                return said
            # Anything else from the process started ahead (it timed out, ended early, exited
            # oddly): a fresh one, the path on its command line, decides.
        elif ahead is not None:
            _end(ahead[1])
        return self._communicate(self._popen(cmd), None, timeout_s)

    @staticmethod
    def _communicate(proc: subprocess.Popen, given: str | None, timeout_s: float) -> str:
        try:
            stdout, stderr = proc.communicate(given, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _end(proc)
            return f"not run: memcheck took more than {timeout_s:g} s"
        except (BrokenPipeError, OSError) as e:  # it ended between the poll and the write
            _end(proc)
            return f"not run: the checker's process ended early ({e})"
        text = (stdout + stderr).strip()
        if proc.returncode == 0:
            return "clean"
        found = [ln.strip() for ln in text.splitlines() if "=========" in ln and ("Invalid" in ln or "Error" in ln)]
        if proc.returncode == 9 or found:
            return "errors: " + "; ".join(found[:3] or text.splitlines()[-3:])[:600]
        if proc.returncode == 3:
            return "errors: " + text.splitlines()[-1][:600]
        return f"not run: the checker exited {proc.returncode}: " + " ".join(text.splitlines()[-2:])[:400]


def _end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    with contextlib.suppress(Exception):
        proc.communicate(timeout=10)

"""triton-ascend's own compiler on any machine: its front end (Python -> TTIR) and its adapter
(`triton-adapter-opt`, shipped in the wheel: TTIR -> Ascend linalg MLIR) need neither an NPU
nor CANN; only the last step, `bishengir-compile` (linalg -> binary), is part of CANN.

Run as `python -m tuner.backends.ascend_frontend` by an interpreter that has triton-ascend
(it replaces triton, so it usually lives in an environment of its own: `AscendFrontend` in
npu.py finds it and starts this module with the tuner package on its path). Request on stdin,
one JSON object: `source` (the rendered module's path), `args` ([[shape], "dtype"] of the
launch's inputs then outputs), `n_inputs`, `soc` (e.g. "Ascend910B2"), `cache_dir` (an empty
folder: each kernel's TTIR and adapter output land there). Answer on stdout, the last line:

    {"status": "ok" | "error", "stage": "bishengir" | "adapter" | "front end",
     "message": the compiler's error with its diagnostics, "kernels": [{"name", "mix_mode",
     "parallel_mode", "ttadapter"}], "triton_ascend": version, "stopped_before_bishengir": bool}

"ok" with stopped_before_bishengir: the real front end and adapter accepted every kernel the
launch compiled, and no bishengir was there to go on; without it, bishengir built them too.
Imports here: the standard library, torch, triton and tuner's loader (tuner.backends.
triton_source, which needs only the standard library), nothing else of tuner's dependencies.
"""

from __future__ import annotations

import json
import os
import re
import sys
import traceback
from pathlib import Path

# The adapter stage's output names the kernel's kind: mix_mode "aiv" (vector cores), "aic"
# (cube) or "mix" (both, with UB in between); parallel_mode "simd" or "simt".
_ATTR = re.compile(r'\b(mix_mode|parallel_mode)\s*=\s*"([^"]*)"')
_FUNC = re.compile(r"func\.func\s+@([\w$.]+)")
# What triton-ascend says when it reaches the binary stage without CANN.
_NO_CANN = re.compile(r"ASCEND_HOME_PATH is not set|bishengir-compile.*(not found|No such file)|"
                      r"npucompiler.*not found", re.I)


def _text(e: BaseException) -> str:
    parts, cur = [], e
    while cur is not None and len(parts) < 4:
        parts.append("".join(traceback.format_exception_only(type(cur), cur)).strip())
        cur = cur.__cause__ or cur.__context__
    return "\n".join(parts)


def _stage(text: str) -> str:
    if "ConvertLinalgRToBinary" in text or "bishengir" in text.lower():
        return "bishengir"
    if "ConvertTritonIRToLinalgIR" in text or "triton-adapter-opt" in text or "ttadapter" in text:
        return "adapter"
    return "front end"


def kernel_facts(cache_dir: Path) -> list[dict]:
    """What the adapter wrote for each kernel under `cache_dir` (its *.ttadapter files)."""
    out = []
    for f in sorted(cache_dir.rglob("*.ttadapter")):
        text = f.read_text(errors="replace")
        attrs = dict(_ATTR.findall(text))
        m = _FUNC.search(text)
        out.append({"name": m.group(1) if m else f.stem, "mix_mode": attrs.get("mix_mode", ""),
                    "parallel_mode": attrs.get("parallel_mode", ""), "ttadapter": str(f)})
    return out


def compile_request(req: dict) -> dict:
    cache = Path(req["cache_dir"])
    cache.mkdir(parents=True, exist_ok=True)
    os.environ["TRITON_CACHE_DIR"] = str(cache)
    import torch
    import triton
    from triton.runtime import jit

    from tuner.backends.base import (COMPILER_CRASH_TRIES, compiler_crash, retrying_compiler_crashes,
                                     without_stack_frames)
    from tuner.backends.triton_source import compile_only, load_module

    version = getattr(triton, "__version__", "?")
    result = {"status": "ok", "stage": "bishengir", "message": "", "kernels": [], "triton_ascend": version,
              "stopped_before_bishengir": False}
    args = [torch.empty(tuple(shape), dtype=getattr(torch, dtype), device="meta") for shape, dtype in req["args"]]
    n_in = int(req["n_inputs"])
    original = jit.JITFunction.run

    def run(fn, *a, grid, warmup, **kw):  # each launch compiled only; one without CANN goes on
        try:
            return original(fn, *a, grid=grid, warmup=True, **kw)
        except Exception as e:  # noqa: BLE001 - sorted below: no CANN, or the kernel's error
            text = _text(e)
            if _stage(text) == "bishengir" and _NO_CANN.search(text):
                result["stopped_before_bishengir"] = True
                return None
            raise

    def once(attempt: int) -> None:
        module = load_module(req["source"], f'{req.get("module_name", "tuner_ascend_frontend")}_{attempt}',
                             "triton_ascend")
        jit.JITFunction.run = run
        try:
            with torch.no_grad(), compile_only("npu", req["soc"], 0):  # nothing here opens an NPU
                module.launch(*args[:n_in], *args[n_in:])
        finally:
            jit.JITFunction.run = original
    try:
        retrying_compiler_crashes(once)
    except Exception as e:  # noqa: BLE001 - the kernel's own compile error, reported as the compiler said
        text = _text(e)
        signal = compiler_crash(text)
        said = (f"the compiler itself crashed ({signal}) {COMPILER_CRASH_TRIES} times in a row: a fault in "
                "triton-ascend, not a message about the kernel; another config may avoid it.\n") if signal else ""
        result.update(status="error", stage=_stage(text), message=said + without_stack_frames(text)[-(6000 - len(said)):])
    result["kernels"] = kernel_facts(cache)
    if result["status"] == "ok" and result["stopped_before_bishengir"]:
        result["stage"] = "adapter"
    return result


def main() -> None:
    """Serve requests, one JSON line in, one JSON line out (after a line "ascend-frontend-ready"),
    until stdin closes: the interpreter, torch and triton-ascend are imported once, not per
    kernel. What the compiler writes to stderr for a request is added to its error."""
    from tuner.backends.base import CapturedStderr
    out_fd = os.dup(1)
    os.dup2(2, 1)  # anything printed by the compiler goes to stderr, never into the answers
    answers = os.fdopen(out_fd, "w")
    import torch  # noqa: F401 - imported before "ready": the first request pays no import
    import triton  # noqa: F401
    answers.write("ascend-frontend-ready\n")
    answers.flush()
    for n, line in enumerate(sys.stdin):
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            req["module_name"] = f"tuner_ascend_frontend_{n}"
            with CapturedStderr() as captured:
                out = compile_request(req)
            diag = [ln for ln in captured.text.splitlines() if re.search(r"\berror\b|loc\(", ln)]
            if out.get("status") == "error" and diag:  # MLIR's diagnostics: stderr, not the exception
                out["message"] = (out.get("message", "") + "\n" + "\n".join(diag[:20]))[-6000:]
        except Exception as e:  # noqa: BLE001 - the stage itself failed: said as such, not as the kernel's
            out = {"status": "unavailable", "message": _text(e)[-3000:]}
        answers.write(json.dumps(out) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()


# ---- the caller's side (imported by the sim and npu backends; runs in tuner's own environment)

class AscendFrontend:
    """An interpreter with triton-ascend, and the way to compile a module through it.

    `find()` picks TUNER_ASCEND_PYTHON (a python whose environment has triton-ascend, torch and
    pybind11), else this interpreter when its triton is triton-ascend; None when neither
    works, with the reason in `why_not()`. Each compile is a fresh process (triton-ascend and
    tuner's own triton cannot share one), bounded by the caller's timeout."""

    _found: "AscendFrontend | None | bool" = False
    _why_not = ""

    def __init__(self, python: str, version: str):
        import threading
        self.python, self.version = python, version
        self._lock = threading.Lock()  # one request at a time on the one server process
        self._proc = None
        import atexit
        atexit.register(self._stop)  # the server ends with its caller (it also ends at EOF)

    @classmethod
    def find(cls) -> "AscendFrontend | None":
        if cls._found is False:
            cls._found = cls._probe()
        return cls._found  # type: ignore[return-value]

    @classmethod
    def why_not(cls) -> str:
        cls.find()
        return cls._why_not

    @classmethod
    def _probe(cls) -> "AscendFrontend | None":
        import importlib.util
        import subprocess
        python = os.environ.get("TUNER_ASCEND_PYTHON", "")
        if not python:
            try:
                here = importlib.util.find_spec("triton.backends.ascend") is not None
            except (ImportError, ValueError):
                here = False
            if not here:
                cls._why_not = ("triton-ascend is not installed here; set TUNER_ASCEND_PYTHON to a python "
                                "whose environment has triton-ascend, torch and pybind11 (README, 'Ascend')")
                return None
            python = sys.executable
        probe = ("import json, triton, torch, triton.backends.ascend.compiler; "
                 "print(json.dumps(getattr(triton, '__version__', '?')))")
        try:
            done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120,
                                  env=_env(), stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            cls._why_not = f"{python} could not be started to import triton-ascend: {e}"
            return None
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["?"])[-1]
            cls._why_not = f"{python} cannot import triton-ascend: {tail}"
            return None
        return cls(python, json.loads(done.stdout.strip().splitlines()[-1]))

    def compile(self, source_path: str, args: list, n_inputs: int, soc: str, cache_dir: str,
                timeout_s: float) -> dict:
        """The answer of `compile_request` for this module (see the module docstring); status
        "timeout" or "unavailable" when the process did not answer. One server process per
        caller process, started at the first request and started again after a failure."""
        import select
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        req = {"source": str(Path(source_path).resolve()), "args": args, "n_inputs": n_inputs, "soc": soc,
               "cache_dir": str(Path(cache_dir).resolve())}
        with self._lock:
            try:
                proc = self._server(timeout_s)
                proc.stdin.write(json.dumps(req) + "\n")
                proc.stdin.flush()
                ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
                line = proc.stdout.readline() if ready else None
            except (OSError, ValueError) as e:
                self._stop()
                return {"status": "unavailable", "message": f"triton-ascend's front end: {e}"}
            if line is None:
                self._stop()
                return {"status": "timeout", "message": f"triton-ascend's front end ran past {timeout_s:g} s"}
            if not line:
                tail = self._stderr_tail()
                self._stop()
                return {"status": "unavailable", "message": f"triton-ascend's front end ended: {tail}"}
        try:
            out = json.loads(line)
        except ValueError:
            return {"status": "unavailable", "message": f"triton-ascend's front end answered {line[:300]!r}"}
        return out if isinstance(out, dict) else {"status": "unavailable", "message": repr(out)[:300]}

    def _server(self, timeout_s: float):
        import select
        import subprocess
        import tempfile
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            return proc
        self._err = tempfile.TemporaryFile()
        proc = subprocess.Popen([self.python, "-m", "tuner.backends.ascend_frontend"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=self._err, text=True, env=_env())
        ready, _, _ = select.select([proc.stdout], [], [], max(120.0, timeout_s))
        if not ready or proc.stdout.readline().strip() != "ascend-frontend-ready":
            self._proc = proc
            tail = self._stderr_tail()
            self._stop()
            raise OSError(f"it did not start: {tail}")
        self._proc = proc
        return proc

    def _stderr_tail(self) -> str:
        err = getattr(self, "_err", None)
        if err is None:
            return ""
        err.seek(0)
        return err.read().decode(errors="replace").strip()[-1500:]

    def _stop(self) -> None:
        proc, self._proc = getattr(self, "_proc", None), None
        if proc is not None:
            proc.kill()
            proc.wait()


def _env() -> dict:
    """The caller's environment with tuner's package root on the path (the other interpreter
    imports tuner.backends.ascend_frontend and tuner's loader from this checkout)."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env

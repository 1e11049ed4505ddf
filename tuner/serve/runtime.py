"""Serve tuned kernels at run time: look up the best config for a call's shapes, build the kernel
once, launch it.

    from tuner import runtime
    table = runtime.Table.load("exported/tuning.json")    # written by `tuner export --db ...`
    y = table("softmax", x)                               # sizes and dtype read from x
    k = table.kernel("matmul", {"M": 512, "N": 512, "K": 256}, "fp32")   # or ask for one

Which entry serves a call (the rule, in order):

1. Candidates are the table's entries for the op and dtype, with the same size names, whose
   device model is this machine's (the backend's `device_info().name`) and whose toolchain
   fingerprint is the live one (`tuner.serve.db.fingerprint`): a kernel tuned under another compiler,
   torch, Triton or driver is never served; nor is one this version's code check refuses (a
   served kernel runs in the caller's process, outside the tuner's sandbox). Pass `backend=`
   to choose among several backends; by default the first backend of the table whose device
   is here, accelerators first.
2. An entry tuned at exactly the call's sizes is used as it was verified (its stored source).
3. Otherwise the *nearest* tuned shape: the smallest sum over the sizes of |log2(call / tuned)|
   (so 2048 is as far from 1024 as 512 is); ties go to a tuned shape at least as large as the
   call in every size, then to the closer total size, then to the faster entry. Its config is
   rendered at the call's sizes and must pass the skeleton's constraints and the device's
   resource limits there; the first candidate that does is used.
4. With `verify="nearest"` (the default) a config borrowed from another shape is checked once
   against the reference on random inputs of the call's shape before its first use; a wrong one
   is skipped for the next candidate (`verify="always"` checks exact ones too, `"never"` none).
5. An entry whose kernel ran slower than the op's torch implementation in its run's final
   timing (its `speedup_vs_reference` < 1: the same interleave, the call it would replace)
   serves nothing: at exactly its sizes torch's implementation runs (it was measured faster
   there, and a config borrowed from another shape was not measured at all), and it is no
   other shape's nearest. `serve_slower=True` serves such entries as any other.
6. When nothing serves, a call runs the op's torch implementation (or raises `LookupError`
   with `strict=True`); `Table.explain` says why each candidate was passed over.

Built kernels are cached in memory per (op, sizes, dtype, backend) and their compiled artifacts
on disk under `<cache_dir>/runtime/` (default `~/.cache/tuner/runtime`). On a GPU a kernel's
launch on buffers it has launched on before is replayed as a CUDA graph (`LaunchGraphs`).
"""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.backends import BackendUnavailable, backend_class, get_backend
from tuner.core.ops import load_op, render_context
from tuner.core.settings import Settings
from tuner.core.skeleton import Skeleton, SkeletonError
from tuner.core.values import Config, OpSpec, Status
from tuner.serve.db import fingerprint, slower_than_reference
from tuner.serve.kernel import Kernel, verified_here

# Where a built-in op's sizes are read from its inputs: (input index, size name per dim).
SIZES_FROM_INPUTS: dict[str, list[tuple[int, tuple[str | None, ...]]]] = {
    "softmax": [(0, ("M", "N"))], "rmsnorm": [(0, ("M", "N"))], "layernorm": [(0, ("M", "N"))],
    "matmul": [(0, ("M", "K")), (1, ("K", "N"))], "add_rmsnorm": [(0, ("M", "N"))],
    "swiglu": [(0, ("M", "N"))], "rope": [(0, ("T", "H", "D"))], "cross_entropy": [(0, ("M", "V"))],
    "attention": [(0, ("B", "H", "S", "D"))], "attention_causal": [(0, ("B", "H", "S", "D"))],
    "attention_decode": [(0, ("B", "H", "D")), (1, ("B", "KH", "S", "D")), (2, ("B", "KH", "S", "D"))],
}
BACKEND_ORDER = ("npu", "cuda", "cpu", "null")
VERIFY = ("nearest", "always", "never")


def _read_table(path: Path) -> dict:
    """An export's tuning.json, or a clear error (a path mistyped, a file cut short)."""
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise FileNotFoundError(f"cannot read the tuning table {path}: {e.strerror}; write one with "
                                f"`tuner export --db tuning-db.json --out DIR` (DIR/tuning.json)") from None
    except ValueError as e:
        raise ValueError(f"{path} is not a tuning table: not JSON ({e}); write one with `tuner export "
                         f"--db tuning-db.json --out DIR` (DIR/tuning.json)") from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise ValueError(f"{path} is not a tuning table: no `entries` list; write one with `tuner export "
                         f"--db tuning-db.json --out DIR` (DIR/tuning.json)")
    return data


_ENTRY_KEYS = {"op": str, "dtype": str, "backend": str, "device": str, "fingerprint": str, "kernel": str,
               "skeleton": str, "config": dict, "sizes": dict, "median_s": (int, float)}


def _checked_entries(entries) -> list[dict]:
    """The table's entries, or a ValueError naming the first one a hand edit (or a cut-short
    file) broke: the lookup read them key by key and failed with a bare KeyError."""
    if not isinstance(entries, list):
        raise ValueError(f"the tuning table's `entries` is a {type(entries).__name__}, not a list")
    for n, e in enumerate(entries):
        if not isinstance(e, dict):
            raise ValueError(f"tuning table entry {n} is a {type(e).__name__}, not a mapping")
        for key, kind in _ENTRY_KEYS.items():
            if not isinstance(e.get(key), kind):
                raise ValueError(f"tuning table entry {n} ({e.get('op', '?')}): {key!r} is "
                                 f"{'missing' if key not in e else type(e[key]).__name__}; export the table again "
                                 f"(`tuner export --db DB --out DIR`)")
        if not all(isinstance(k, str) and isinstance(v, int) and v > 0 for k, v in e["sizes"].items()):
            raise ValueError(f"tuning table entry {n} ({e['op']}): sizes {e['sizes']} are not positive integers")
    return list(entries)


def sizes_of(op: str, inputs) -> dict[str, int]:
    if op not in SIZES_FROM_INPUTS:
        raise LookupError(f"cannot read {op!r}'s sizes from its inputs; pass sizes={{...}}")
    out: dict[str, int] = {}
    for i, names in SIZES_FROM_INPUTS[op]:
        if i >= len(inputs) or not hasattr(inputs[i], "shape"):
            raise LookupError(f"{op}: input {i} is missing or not a tensor")
        shape = tuple(inputs[i].shape)
        if len(shape) != len(names):
            raise LookupError(f"{op}: input {i} has shape {shape}, expected {len(names)} dims ({', '.join(n or '_' for n in names)})")
        for n, d in zip(names, shape):
            if n is not None and out.setdefault(n, int(d)) != int(d):
                raise LookupError(f"{op}: {n} is {out[n]} in one input and {int(d)} in input {i}")
    return out


def dtype_name(tensor) -> str:
    import torch
    names = {torch.float32: "fp32", torch.float64: "fp64", torch.float16: "fp16", torch.bfloat16: "bf16"}
    if tensor.dtype not in names:
        raise LookupError(f"no tuned kernels for dtype {tensor.dtype}")
    return names[tensor.dtype]


def distance(call: dict[str, int], tuned: dict[str, int]) -> float:
    return sum(abs(math.log2(call[k] / tuned[k])) for k in call)


def rank(call: dict[str, int], tuned: dict[str, int], median_s: float) -> tuple:
    covers = all(tuned[k] >= call[k] for k in call)
    total = abs(math.log2(math.prod(call.values()) / math.prod(tuned.values())))
    return (round(distance(call, tuned), 9), not covers, round(total, 9), median_s)


@dataclass
class Candidate:
    entry: dict
    distance: float
    exact: bool
    why_not: str = ""


class Table:
    """The served entries of an export (or a `TuningDB`), with the lookup rule above."""

    def __init__(self, data: dict | str | Path, backend: str | None = None, verify: str = "nearest",
                 strict: bool = False, cache_dir: str | None = None, check_toolchain: bool = True,
                 base_dir: str | Path | None = None, serve_slower: bool = False):
        if not isinstance(data, dict):
            base_dir = base_dir or Path(data).parent
            data = _read_table(Path(data))
        self.base_dir = Path(base_dir) if base_dir else None  # where an export's problems/ copies are
        if verify not in VERIFY:
            raise ValueError(f"verify must be one of {', '.join(VERIFY)}")
        self.entries: list[dict] = _checked_entries(data.get("entries", []))
        self.skeletons: dict[str, dict] = dict(data.get("skeletons", {}))
        self.backend, self.verify, self.strict = backend, verify, strict
        self.check_toolchain, self.serve_slower = check_toolchain, serve_slower
        self.cache_dir = Path(cache_dir or Settings().cache_dir)
        self._devices: dict[str, Any] = {}
        self._kernels: dict[tuple, Kernel | None] = {}
        self._positions: dict[str, dict | str] = {}  # problem file op -> `problem.size_positions` (or why not)
        self._refused: dict[tuple[str, str], str | None] = {}  # (language, source digest) -> `_forbidden`
        self._lock = threading.RLock()
        self.last: Kernel | None = None  # the kernel of the last call (None: the torch fallback)

    @classmethod
    def load(cls, path: str | Path, **options) -> "Table":
        return cls(_read_table(Path(path)), **{"base_dir": Path(path).parent, **options})

    def source(self, entry: dict) -> str:
        """A problem file's path for this entry: the export's copy when it has one (the tuned
        version, and there wherever the export was moved), else the path it was tuned from."""
        copy = entry.get("source_copy")
        if copy and self.base_dir is not None and (self.base_dir / copy).is_file():
            return str(self.base_dir / copy)
        return entry["source"]

    @classmethod
    def from_db(cls, db, **options) -> "Table":
        return cls({"entries": db.entries, "skeletons": db.data["skeletons"]}, **options)

    # ---- where we are ------------------------------------------------------------------

    def device(self, backend: str):
        """This machine's DeviceInfo for `backend`, or None when the backend cannot run here."""
        with self._lock:
            if backend not in self._devices:
                try:
                    # The name and toolchain only: no copy or matmul benchmark in the user's process.
                    self._devices[backend] = get_backend(backend, 0, cache_dir=str(self.cache_dir)).device_info(peaks=False)
                except (BackendUnavailable, ImportError, RuntimeError, OSError):
                    self._devices[backend] = None
            return self._devices[backend]

    def backends(self) -> list[str]:
        have = {e["backend"] for e in self.entries}
        if self.backend:
            return [self.backend]
        ordered = [b for b in BACKEND_ORDER if b in have] + sorted(have - set(BACKEND_ORDER))
        return [b for b in ordered if self.device(b) is not None]

    # ---- lookup ------------------------------------------------------------------------

    def slower(self, entry: dict) -> str:
        """Why `entry` serves nothing because torch's own implementation beat it (rule 5), or ""."""
        if self.serve_slower or not slower_than_reference(entry):
            return ""
        return (f"ran at {entry['speedup_vs_reference']:.2f}x torch's own implementation in its run "
                f"({entry.get('run_id', '?')}): torch's runs at its sizes")

    def ops(self) -> set[str]:
        """The ops some entry of the table may serve here: on a backend it uses (`backends`), not
        one that torch beat."""
        backends = set(self.backends())
        return {e["op"] for e in self.entries if e["backend"] in backends and not self.slower(e)}

    def candidates(self, op: str, sizes: dict[str, int], dtype: str = "fp32",
                   backend: str | None = None) -> list[Candidate]:
        """Every entry of the op and dtype, best first by the rule; `why_not` set on those that
        cannot serve here (another device or toolchain, other size names)."""
        out = []
        backends = [backend] if backend else self.backends()
        for b in backends:
            info = self.device(b)
            for e in self.entries:
                if e["op"] != op or e["dtype"] != dtype or e["backend"] != b:
                    continue
                why = ""
                if set(e["sizes"]) != set(sizes):
                    why = f"other size names {sorted(e['sizes'])}"
                elif info is None:
                    why = f"the {b} backend cannot run here"
                elif e["device"] != info.name:
                    why = f"tuned on {e['device']}, this is {info.name}"
                elif self.check_toolchain and e["fingerprint"] != fingerprint(dict(info.toolchain)):
                    why = (f"tuned with another toolchain ({_diff(e['toolchain'], dict(info.toolchain))}): "
                           f"stale here, never served")
                else:
                    why = self._forbidden(e, e["kernel"]) or self.slower(e)
                d = distance(sizes, e["sizes"]) if not why or "size names" not in why else math.inf
                out.append(Candidate(e, d, d == 0, why))
            # Torch beat every kernel tuned at exactly these sizes on this backend: it runs them.
            exact = [c for c in out if c.exact and c.entry["backend"] == b and c.why_not in ("", self.slower(c.entry))]
            if exact and all(c.why_not for c in exact):
                beaten = (f"torch's own implementation beat the kernel tuned at exactly these sizes "
                          f"({exact[0].entry['speedup_vs_reference']:.2f}x in run {exact[0].entry.get('run_id', '?')}): "
                          f"torch's runs them")
                for c in out:
                    if c.entry["backend"] == b and not c.why_not:
                        c.why_not = beaten
        out.sort(key=lambda c: (bool(c.why_not), rank(sizes, c.entry["sizes"], c.entry["median_s"])
                                if "size names" not in c.why_not else (math.inf,)))
        return out

    def lookup(self, op: str, sizes: dict[str, int], dtype: str = "fp32",
               backend: str | None = None) -> Candidate | None:
        """The entry that serves these sizes (the rule's steps 1-3, without building it)."""
        for c in self.candidates(op, sizes, dtype, backend):
            if c.why_not:
                return None
            if c.exact:
                return c
            why = self._invalid(c, sizes)
            if why is None:
                return c
        return None

    def explain(self, op: str, sizes: dict[str, int], dtype: str = "fp32", backend: str | None = None) -> list[str]:
        lines = []
        for c in self.candidates(op, sizes, dtype, backend):
            why = c.why_not or ("" if c.exact else self._invalid(c, sizes) or "")
            lines.append(f"{c.entry['backend']} {c.entry['sizes']} distance {c.distance:.2f}: "
                         + (f"passed over: {why}" if why else "can serve"))
        return lines

    def kernel(self, op: str, sizes: dict[str, int], dtype: str = "fp32",
               backend: str | None = None) -> Kernel | None:
        key = (op, json.dumps(sizes, sort_keys=True), dtype, backend)
        with self._lock:
            if key in self._kernels:
                return self._kernels[key]
            k = None
            for c in self.candidates(op, sizes, dtype, backend):
                if c.why_not:
                    break
                k = self._build(c, sizes)
                if k is not None:
                    break
            self._kernels[key] = k
            return k

    def __call__(self, op: str, *inputs, sizes: dict[str, int] | None = None, backend: str | None = None,
                 out=None):
        if not sizes and op not in SIZES_FROM_INPUTS and all(e["op"] != op for e in self.entries):
            have = sorted({e["op"] for e in self.entries})
            raise LookupError(f"unknown op {op!r}: not a built-in op, and this table has "
                              f"{'only ' + ', '.join(have) if have else 'no entries'}")
        sizes = sizes or self.sizes_of(op, inputs)
        dtype = dtype_name(inputs[0]) if inputs and getattr(inputs[0], "is_floating_point", bool)() else "fp32"
        # An empty call (a size 0) has nothing to tune: torch's implementation handles it.
        k = self.kernel(op, sizes, dtype, backend) if all(v > 0 for v in sizes.values()) else None
        why = k.mismatch(inputs) if k is not None else None
        self.last = None if why else k
        if k is not None and not why:
            return k._launch(inputs, out)
        if self.strict:
            if why:
                raise LookupError(f"the tuned kernel for {op} {sizes} {dtype} cannot take these inputs: {why}")
            raise LookupError(f"no tuned kernel serves {op} {sizes} {dtype} here:\n  "
                              + "\n  ".join(self.explain(op, sizes, dtype, backend) or ["no entries for it"]))
        entry = next((e for e in self.entries if e["op"] == op), None)
        spec = OpSpec(op, self.source(entry) if entry else op, tuple(sizes.items()), dtype,
                      entry["kind"] if entry else "builtin")
        fallback = load_op(spec)
        outs = (fallback.torch_call or fallback.torch_impl)(list(inputs))
        if out is not None:
            for o, r in zip(out, outs):
                o.copy_(r)
            outs = list(out)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def sizes_of(self, op: str, inputs) -> dict[str, int]:
        """The call's sizes, read from its inputs' shapes: a built-in op's by its table
        (`SIZES_FROM_INPUTS`), a problem file's where its get_inputs() puts each size
        (`problem.size_positions`, worked out once per op). A size no input's shape shows (a
        constant of the model) is the tuned one, when every entry of the op has the same."""
        if op in SIZES_FROM_INPUTS:
            return sizes_of(op, inputs)
        entries = [e for e in self.entries if e["op"] == op]
        if not entries or entries[0].get("kind") != "kernelbench":
            raise LookupError(f"cannot read {op!r}'s sizes from its inputs; pass sizes={{...}}")
        first = entries[0]
        with self._lock:
            if op not in self._positions:
                from tuner.core.ops import OpError
                from tuner.core.problem import size_positions
                try:
                    self._positions[op] = size_positions(self.source(first), dict(first["sizes"]))
                except OpError as e:
                    self._positions[op] = str(e)
        where = self._positions[op]
        if isinstance(where, str):
            raise LookupError(f"cannot read {op!r}'s sizes from its inputs ({where}); pass sizes={{...}}")
        out: dict[str, int] = {}
        for name in first["sizes"]:
            if name in where:
                i, d = where[name]
                x = inputs[i] if i < len(inputs) else None
                if not hasattr(x, "shape") or len(x.shape) <= d:
                    raise LookupError(f"{op}: its size {name} is dim {d} of input {i}, and the call's input {i} "
                                      f"is {'missing' if x is None else tuple(getattr(x, 'shape', ())) or type(x).__name__}")
                out[name] = int(x.shape[d])
                continue
            tuned = {e["sizes"].get(name) for e in entries}
            if len(tuned) != 1:
                raise LookupError(f"{op}: its size {name} shows in no input's shape and was tuned at "
                                  f"{', '.join(str(v) for v in sorted(tuned, key=str))}; pass sizes={{...}}")
            out[name] = tuned.pop()
        return out

    # ---- building ----------------------------------------------------------------------

    def _spec(self, entry: dict, sizes: dict[str, int]) -> OpSpec:
        return OpSpec(entry["op"], self.source(entry), tuple(sizes.items()), entry["dtype"], entry.get("kind", "builtin"))

    def _skeleton(self, entry: dict) -> Skeleton:
        s = self.skeletons[entry["skeleton"]]
        return Skeleton.from_json({"template": s["template"], "space": s["space"], "language": s["language"],
                                   "name": s.get("name", "")})

    def _context(self, entry: dict, sizes: dict[str, int]):
        spec = self._spec(entry, sizes)
        op = load_op(spec)
        # The entry's language where its backend compiles several (a cuda entry's CUDA C++).
        lang = self.skeletons.get(entry.get("skeleton"), {}).get("language")
        backend = get_backend(entry["backend"], 0, cache_dir=str(self.cache_dir), op=spec.to_json(),
                              **({"language": lang} if lang in backend_class(entry["backend"]).languages else {}))
        return op, backend, {**render_context(op), **backend.render_context(op)}

    def _invalid(self, c: Candidate, sizes: dict[str, int]) -> str | None:
        try:
            op, backend, ctx = self._context(c.entry, sizes)
            return self._skeleton(c.entry).space.check(Config.of(c.entry["config"]), ctx, backend.limits())
        except (SkeletonError, BackendUnavailable, ValueError, KeyError) as e:
            return f"{type(e).__name__}: {e}"

    def _forbidden(self, entry: dict, source: str) -> str | None:
        """Why this version's code check refuses a kernel source of the entry's skeleton, or None.
        A served kernel runs in the caller's own process, outside any sandbox, and a table is a
        file: one written before a check was added, or edited by hand, is checked again here."""
        from tuner.codecheck import Forbidden, require_clean
        language = self.skeletons.get(entry.get("skeleton"), {}).get("language", "")
        key = (language, hashlib.sha256(source.encode()).hexdigest())
        with self._lock:
            if key not in self._refused:
                try:
                    require_clean(language, source)
                    self._refused[key] = None
                except (Forbidden, SyntaxError) as err:
                    self._refused[key] = (f"its kernel fails the code check ({err}); never served: tune "
                                          f"the op again")
            return self._refused[key]

    def _build(self, c: Candidate, sizes: dict[str, int]) -> Kernel | None:
        e = c.entry
        try:
            op, backend, ctx = self._context(e, sizes)
            skel = self._skeleton(e)
            config = Config.of(e["config"])
            if c.exact:
                source = e["kernel"]
            else:
                if skel.space.check(config, ctx, backend.limits()) is not None:
                    return None
                source = skel.render(config, ctx)
        except (SkeletonError, BackendUnavailable, ValueError, KeyError):
            return None
        if self._forbidden(e, source) is not None:
            return None
        artifact = self._artifact(e, backend, skel.language, source, op.spec)
        if artifact is None:
            return None
        fn = backend.load_for_serving(artifact, op)
        k = Kernel(e, dict(sizes), c.exact, c.distance, backend, op, fn)
        if self.verify == "always" or (self.verify == "nearest" and not c.exact):
            if not verified_here(k):
                return None
        return k

    def _artifact(self, entry: dict, backend, language: str, source: str, spec: OpSpec) -> str | None:
        digest = hashlib.sha256(f"{entry['backend']}\0{entry['fingerprint']}\0{source}".encode()).hexdigest()[:20]
        workdir = self.cache_dir / "runtime" / digest
        done = workdir / "artifact.json"
        if done.is_file():
            artifact = json.loads(done.read_text())["artifact"]
            if Path(artifact).exists() and self._object_clean(language, artifact):
                return artifact
        workdir.mkdir(parents=True, exist_ok=True)
        if language in ("triton", "triton_ascend"):
            # Triton compiles at the first launch (its own cache); no ahead-of-time pass here,
            # which would swap the live driver of the caller's process.
            path = workdir / "kernel.py"
            path.write_text(source)
            artifact = str(path)
        else:
            build = backend.compile(source, spec, str(workdir), 300.0)
            if build.status is not Status.OK:
                return None
            artifact = build.artifact
        done.write_text(json.dumps({"artifact": artifact}))
        return artifact

    @staticmethod
    def _object_clean(language: str, artifact: str) -> bool:
        """Whether a cached C kernel's object still passes this version's object check: it is
        loaded into the caller's process (code it runs at load runs there), and the cache may
        be from a version with fewer checks. False: it is built again from the source."""
        if language != "c":
            return True
        from tuner.codecheck import check_object
        try:
            return not check_object(artifact)
        except (FileNotFoundError, OSError, subprocess.SubprocessError):
            return False

def _diff(a: dict, b: dict) -> str:
    keys = sorted(set(a) | set(b))
    d = [f"{k} {a.get(k, '-')} -> {b.get(k, '-')}" for k in keys if str(a.get(k)) != str(b.get(k))]
    return ", ".join(d[:3]) or "same versions"


def load(path: str | Path, **options) -> Table:
    """`Table.load`: the served table of an export's tuning.json."""
    return Table.load(path, **options)

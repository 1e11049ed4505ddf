"""The tuning database: the best verified config per (op, shape, dtype, device model, toolchain),
collected from many runs, and its exports for production.

One JSON file (default `tuning-db.json`), written atomically:

    {"format": 1,
     "current":  {"<backend>|<device model>": {"fingerprint", "toolchain", "created"}},
     "entries":  [entry, ...],   # the current toolchain of each device model: these are served
     "stale":    [entry, ...],   # other toolchains: kept apart, never served
     "skeletons": {hash: {"name", "language", "template", "space"}}}

An entry is one verified winner: op, sizes, dtype, backend, device, toolchain (and its
fingerprint), config, median and IQR, speedup over the reference, % of ceiling, the skeleton's
hash, the kernel source with the config baked in, and the run it came from. Only runs whose
summary names a winner (re-timed, re-checked on fresh inputs) are collected.

Toolchains. The fingerprint hashes a device's toolchain versions (compiler, torch, Triton,
CUDA, driver, ...; not clocks). A device model's *current* toolchain is the one of its newest
collected run (by the run's creation time). When a newer run brings another fingerprint, every
entry of the old one moves to `stale`; a run older than the current toolchain's goes straight to
`stale`. Two runs of one key (op, sizes, dtype, backend, device, language) and fingerprint: the
faster median wins (ties: the newer run); a Triton and a CUDA C++ winner of one shape are both
kept, and the runtime serves the faster.
`tuner.runtime` checks once more, at serve time, that the live toolchain is the entry's.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable

from tuner.core.values import RunMeta, content_hash
from tuner.run.store import Store, StoreError

DB_FORMAT = 1
DEFAULT_DB = "tuning-db.json"
# Toolchain items that describe the device's state or the worker's sandbox, not the software
# that built the kernel.
VOLATILE = frozenset({"sm_clock_max_mhz", "sandbox"})


class DBError(StoreError):
    """A tuning database that cannot be read or written, or an export with nothing in it."""


def fingerprint(toolchain: dict[str, str]) -> str:
    items = sorted((k, str(v)) for k, v in toolchain.items() if k not in VOLATILE)
    return content_hash(json.dumps(items))


def slower_than_reference(entry: dict) -> bool:
    """Whether the entry's kernel lost to the op's torch implementation (the run's reference:
    what a call runs without the kernel) in the same interleave of its run's final timing.
    Unknown (no reference timed): False."""
    sp = entry.get("speedup_vs_reference")
    return isinstance(sp, (int, float)) and not isinstance(sp, bool) and sp < 1.0


def entry_key(e: dict) -> tuple:
    """One entry per key: a backend that compiles two languages (cuda: Triton and CUDA C++)
    keeps the best of each, and the runtime serves the faster (its rank is by median)."""
    return (e["backend"], e["device"], e["op"], json.dumps(e["sizes"], sort_keys=True), e["dtype"],
            e.get("language", ""))


def group_key(backend: str, device: str) -> str:
    return f"{backend}|{device}"


def _created(meta: RunMeta, fallback: float) -> float:
    text = meta.created
    if text:
        try:
            return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S%z").timestamp()
        except ValueError:
            pass
    return fallback


class TuningDB:
    def __init__(self, path: str | Path = DEFAULT_DB):
        self.path = Path(path)
        self.data: dict[str, Any] = {"format": DB_FORMAT, "current": {}, "entries": [], "stale": [],
                                     "skeletons": {}}
        if self.path.exists():
            try:
                data = json.loads(self.path.read_text())
            except (OSError, ValueError) as e:
                raise DBError(f"{self.path} is not a readable tuning database: {e}") from None
            if not isinstance(data, dict):
                raise DBError(f"{self.path} is not a tuning database: a JSON {type(data).__name__}, not the "
                              f"object `tuner db update` writes")
            if data.get("format") != DB_FORMAT:
                raise DBError(f"{self.path} has format {data.get('format')}; this tuner reads {DB_FORMAT}")
            self.data = data

    # ---- reading -----------------------------------------------------------------------

    @property
    def entries(self) -> list[dict]:
        return self.data["entries"]

    @property
    def stale(self) -> list[dict]:
        return self.data["stale"]

    def skeleton(self, h: str) -> dict | None:
        return self.data["skeletons"].get(h)

    def served(self, backend: str | None = None, device: str | None = None) -> list[dict]:
        return [e for e in self.entries if (backend is None or e["backend"] == backend)
                and (device is None or e["device"] == device)]

    # ---- collecting --------------------------------------------------------------------

    def add_run(self, run: str | Path) -> tuple[str, str]:
        """Collect one run directory. Returns (what happened, why): 'added', 'replaced', 'kept'
        (the entry already there is faster), 'stale', or 'skipped'."""
        run = Path(run)
        try:
            meta_json = json.loads((run / "run.json").read_text())
            summary = json.loads((run / "summary.json").read_text())
        except FileNotFoundError:
            return "skipped", "unfinished (no summary.json)"
        except (OSError, ValueError) as e:
            return "skipped", f"unreadable: {e}"
        try:
            meta = RunMeta.from_json(meta_json)
        except ValueError:
            meta = None
        if meta is None or not isinstance(summary, dict):
            return "skipped", "damaged: run.json or summary.json is not what a run writes"
        try:
            best = summary.get("best")
            if not best:
                return "skipped", "no verified winner"
            skel_path = run / "skeleton" / "skeleton.json"
            kernels = sorted((run / "best").glob("kernel.*")) if (run / "best").is_dir() else []
            if not skel_path.is_file() or not kernels:
                return "skipped", "not a single-skeleton run (a multi-round run's rounds are collected instead)"
            device = summary.get("device") or (meta.device.to_json() if meta.device else {})
            toolchain = {k: str(v) for k, v in (device.get("toolchain") or {}).items()}
            skel = json.loads(skel_path.read_text())
            h = content_hash(skel["template"], json.dumps(skel["space"], sort_keys=True), skel["language"])
            self.data["skeletons"].setdefault(h, {"name": skel.get("name", ""), "language": skel["language"],
                                                  "template": skel["template"], "space": skel["space"]})
            ceiling = best.get("ceiling") or {}
            entry = {
                "op": meta.op.name, "kind": meta.op.kind, "source": meta.op.source,
                # the run's copy of a problem file: what an export serves it with (see export)
                **({"problem": str(run / Store.PROBLEM_COPY)} if (run / Store.PROBLEM_COPY).is_file() else {}),
                "sizes": meta.op.size_dict(), "dtype": meta.op.dtype, "backend": meta.backend,
                "device": device.get("name", "?"), "simulated": bool(device.get("simulated")),
                "toolchain": toolchain, "fingerprint": fingerprint(toolchain),
                "config": best["config"], "median_s": best["median_s"], "iqr_s": best.get("iqr_s"),
                "speedup_vs_reference": best.get("speedup_vs_reference"),
                "flags": list(summary.get("flags") or ()),
                "ceiling_percent": ceiling.get("percent"), "skeleton": h,
                "skeleton_name": skel.get("name", ""), "language": skel["language"],
                "kernel": kernels[0].read_text(), "kernel_file": kernels[0].name,
                "run": str(run.resolve()), "run_id": meta.id or run.name,
                "created": _created(meta, (run / "summary.json").stat().st_mtime),
            }
        except (KeyError, TypeError, ValueError, AttributeError, OSError) as e:
            # One damaged run (hand-edited, cut short) is skipped with why, not the whole update.
            return "skipped", f"damaged: {type(e).__name__}: {e}"
        return self._insert(entry)

    def _insert(self, entry: dict) -> tuple[str, str]:
        g = group_key(entry["backend"], entry["device"])
        cur = self.data["current"].get(g)
        if cur is None:
            self.data["current"][g] = {"fingerprint": entry["fingerprint"], "toolchain": entry["toolchain"],
                                       "created": entry["created"]}
        elif cur["fingerprint"] != entry["fingerprint"]:
            if entry["created"] > cur["created"]:
                # A newer toolchain: everything served for this device model goes stale.
                moving = [e for e in self.entries if group_key(e["backend"], e["device"]) == g]
                self.data["entries"] = [e for e in self.entries if group_key(e["backend"], e["device"]) != g]
                for e in moving:
                    self._put(self.stale, e)
                self.data["current"][g] = {"fingerprint": entry["fingerprint"],
                                           "toolchain": entry["toolchain"], "created": entry["created"]}
            else:
                what, why = self._put(self.stale, entry)
                return ("stale", f"toolchain {entry['fingerprint']} is not the current one of "
                                 f"{entry['device']} ({cur['fingerprint']}); {why}") if what != "kept" else (what, why)
        else:
            cur["created"] = max(cur["created"], entry["created"])
        return self._put(self.entries, entry)

    @staticmethod
    def _put(table: list[dict], entry: dict) -> tuple[str, str]:
        k = entry_key(entry)
        for i, e in enumerate(table):
            if entry_key(e) == k and e["fingerprint"] == entry["fingerprint"]:
                if e["run"] == entry["run"]:
                    table[i] = entry
                    return "kept", "already collected"
                # A run whose times are flagged (a busy machine) loses to one that is not.
                def rank(x: dict) -> tuple:
                    return (bool(x.get("flags")), x["median_s"], -x["created"])
                if rank(entry) < rank(e):
                    table[i] = entry
                    why = "not flagged, unlike" if e.get("flags") and not entry.get("flags") else "faster than"
                    return "replaced", f"{why} {e['run_id']} ({e['median_s']:.3g} s)"
                return "kept", (f"{e['run_id']} is not flagged" if entry.get("flags") and not e.get("flags")
                                else f"{e['run_id']} is faster ({e['median_s']:.3g} s)")
        table.append(entry)
        return "added", ""

    def collect(self, paths: Iterable[str | Path]) -> list[tuple[str, str, str]]:
        """Collect every run under `paths` (run directories, or folders holding them: runs/,
        a sweep's folder). Returns (run, what, why) per run found."""
        out = []
        for p in paths:
            p = Path(p)
            if not p.exists():
                raise DBError(f"{p}: no such run directory or folder")
            runs = [p] if (p / "run.json").is_file() else sorted(q.parent for q in p.rglob("run.json"))
            for r in runs:
                what, why = self.add_run(r)
                out.append((str(r), what, why))
        return out

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.path)


# ---- exports ---------------------------------------------------------------------------------

def export(db: TuningDB, out: str | Path, backend: str | None = None, device: str | None = None) -> list[Path]:
    """Write the served entries as `tuning.json` (what `tuner.runtime` reads), `tuned_kernels.py`
    (a module that serves them through `tuner.runtime`), `triton_autotune.py` (the Triton
    entries as `triton.Config` lists) and `stale.json` (other toolchains, for reference only)."""
    from tuner import __version__
    entries = db.served(backend, device)
    if not entries:
        raise DBError(f"{db.path} has no entries to export"
                      + (f" for backend {backend}" if backend else "") + (f" on {device}" if device else "")
                      + (f" ({len(db.stale)} stale: another toolchain)" if db.stale else "")
                      + "; collect runs with `tuner db update RUNS...`")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    entries = _with_problem_copies(entries, out)
    hashes = {e["skeleton"] for e in entries}
    table = {"format": DB_FORMAT, "tuner": __version__, "exported": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
             "source": str(db.path), "entries": entries,
             "skeletons": {h: db.data["skeletons"][h] for h in sorted(hashes)}}
    written = [out / "tuning.json", out / "tuned_kernels.py", out / "stale.json"]
    (out / "tuning.json").write_text(json.dumps(table, indent=1, default=str))
    (out / "stale.json").write_text(json.dumps(
        {"note": "other toolchains than the current one of their device: never served",
         "entries": [{k: v for k, v in e.items() if k != "kernel"} for e in db.stale
                     if (backend is None or e["backend"] == backend) and (device is None or e["device"] == device)]},
        indent=1, default=str))
    (out / "tuned_kernels.py").write_text(python_module(table))
    triton = triton_autotune(entries)
    if triton is not None:
        (out / "triton_autotune.py").write_text(triton)
        written.append(out / "triton_autotune.py")
    return written


def _with_problem_copies(entries: list[dict], out: Path) -> list[dict]:
    """A problem file's Model is its op's reference and torch fallback at run time: each one
    the entries name is copied into the export (`problems/<name>-<hash>.py`: the run's own copy,
    the version that was tuned; for runs made before runs kept one, the file at its path) and
    named in its entries as `source_copy`, so that an export moved to another machine or path
    still serves them. One that cannot be read is left out (the runtime says so if needed)."""
    copied: dict[str, str] = {}
    result = []
    for e in entries:
        if e.get("kind") != "kernelbench":
            result.append(e)
            continue
        src = e.get("problem") or e["source"]  # the run's copy: the version that was tuned
        if src not in copied:
            try:
                text = Path(src).read_bytes()
            except OSError:
                copied[src] = ""
            else:
                name = f"problems/{Path(e['source']).stem}-{hashlib.sha256(text).hexdigest()[:8]}.py"
                (out / "problems").mkdir(exist_ok=True)
                (out / name).write_bytes(text)
                copied[src] = name
        result.append({**e, "source_copy": copied[src]} if copied[src] else e)
    return result


def python_module(table: dict) -> str:
    ops = sorted({(e["op"], e["backend"], e["device"]) for e in table["entries"]})
    listing = "\n".join(f"#   {op} on {backend}: {device}" for op, backend, device in ops)
    # The example names an entry of this table, its own inputs and sizes.
    e = table["entries"][0] if table["entries"] else {"op": "softmax", "sizes": {"M": 4096, "N": 1024},
                                                        "dtype": "fp32", "kind": "builtin"}
    args = "*inputs" if e.get("kind") == "kernelbench" else "x"  # a problem file's: get_inputs(), then the Model's parameters
    return f'''"""Tuned kernels exported by tuner {table["tuner"]} on {table["exported"]} from {table["source"]}.

{len(table["entries"])} entries:
{listing}

    import tuned_kernels
    y = tuned_kernels.call({e["op"]!r}, {args})   # the best kernel for the inputs' shapes, launched
    choice = tuned_kernels.lookup({e["op"]!r}, {json.dumps(e["sizes"])}, {e["dtype"]!r})

A shape that was not tuned uses the nearest tuned one (see `tuner.runtime`); a call nothing
serves (another device or toolchain, no valid config) runs the op's torch implementation.
Needs the `tuner` package at run time.
"""
import json as _json
import os as _os

from tuner import runtime as _runtime

TABLE = _json.loads(r"""{json.dumps(table, default=str)}""")
_table = None


def table(**options):
    """The runtime table (options: backend, device, verify, strict, cache_dir; see tuner.serve.runtime.Table)."""
    global _table
    if _table is None or options:
        _table = _runtime.Table(TABLE, base_dir=_os.path.dirname(_os.path.abspath(__file__)), **options)
    return _table


def lookup(op, sizes, dtype="fp32", backend=None):
    return table().lookup(op, sizes, dtype, backend)


def call(op, *inputs, **kwargs):
    return table()(op, *inputs, **kwargs)
'''


TRITON_LAUNCH = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def triton_autotune(entries: list[dict]) -> str | None:
    """`triton.Config` lists per op for users who keep Triton's autotuner: every distinct tuned
    config of the op (fastest first over its shapes), launch options (num_warps, num_stages, ...)
    as keywords and the rest as meta-parameters. Structural params (a template branch, not a
    kernel argument) must match the user's kernel; they are listed per op."""
    tri = [e for e in entries if e["language"] in ("triton", "triton_ascend")]
    if not tri:
        return None
    by_op: dict[str, list[dict]] = {}
    for e in sorted(tri, key=lambda e: (e["op"], e["median_s"])):
        by_op.setdefault(e["op"], []).append(e)
    lines = ['"""Triton autotune configs exported by tuner: the tuned configs of each op, for',
             "kernels that keep `@triton.autotune`:",
             "",
             "    @triton.autotune(configs=CONFIGS['softmax'], key=KEYS['softmax'])",
             "",
             "KEYS names the op's sizes; rename them to your kernel's argument names. A param that",
             "the template used as a structural switch (STRUCTURAL) is not a kernel argument: keep",
             'only the configs whose value matches your kernel."""',
             "import triton", "", "CONFIGS = {}", "KEYS = {}", "STRUCTURAL = {}", "SHAPES = {}", ""]
    for op, es in by_op.items():
        seen, configs, shapes = set(), [], []
        for e in es:
            k = json.dumps(e["config"], sort_keys=True)
            shapes.append((e["sizes"], e["config"], e["median_s"], e["device"]))
            if k in seen:
                continue
            seen.add(k)
            meta = {n: v for n, v in e["config"].items() if n not in TRITON_LAUNCH and not isinstance(v, bool)}
            launch = ", ".join(f"{n}={e['config'][n]!r}" for n in TRITON_LAUNCH if n in e["config"])
            configs.append(f"    triton.Config({meta!r}{', ' + launch if launch else ''}),")
        structural = sorted({n for e in es for n, v in e["config"].items() if isinstance(v, bool)})
        lines += [f"CONFIGS[{op!r}] = [", *configs, "]",
                  f"KEYS[{op!r}] = {list(es[0]['sizes'])!r}",
                  f"STRUCTURAL[{op!r}] = {structural!r}",
                  f"SHAPES[{op!r}] = {[{'sizes': s, 'config': c, 'median_s': m, 'device': d} for s, c, m, d in shapes]!r}",
                  ""]
    return "\n".join(lines)

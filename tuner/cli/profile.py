"""`tuner profile model.py`: the model's operators ranked by time, and the hot ones as a sweep."""

from __future__ import annotations

import argparse
import json
import sys

LANGUAGE = {"cpu": "c", "cuda": "triton", "npu": "triton_ascend"}
BACKEND = {"cpu": "cpu", "cuda": "cuda", "npu": "npu"}


def add_cli(sub) -> None:
    p = sub.add_parser("profile", help="rank a model's operators by time; --emit writes the hot ones as a sweep",
                       description="Run a model under torch's profiler and rank its operator calls by time, "
                                   "with what a tuned kernel could save at best (Amdahl) and whether the library "
                                   "has a skeleton for each. model.py defines Model + get_init_inputs() (or "
                                   "get_model()) and get_inputs().")
    p.add_argument("model", help="the model file")
    p.add_argument("--device", choices=("cpu", "cuda", "npu"), help="default: cuda if usable, else cpu")
    p.add_argument("--dtype", help="cast the model and its floating inputs to fp32, fp16, bf16 (default: as built)")
    p.add_argument("--iterations", type=int, default=5, help="profiled forward passes (default 5)")
    p.add_argument("--top", type=int, default=15, help="rows shown (default 15)")
    p.add_argument("--emit", metavar="SWEEP.yaml", help="write a sweep of the hot operators (and problem files "
                   "for those without a library skeleton, beside it)")
    p.add_argument("--min-share", type=float, help="with --emit: operators below this share of "
                   "the time are left out (default 0.01)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--report", metavar="FILE.html", help="also write the profile as an HTML page with a plot "
                   "(self-contained; opens offline)")
    p.set_defaults(fn=cmd_profile)

    v = sub.add_parser("verify", help="the model with the tuned kernels swapped in against the model as it is: "
                                      "outputs and end-to-end latency, side by side")
    _patched_model_args(v, "fp32")
    v.add_argument("--rounds", type=int, default=20, help="timed calls of each variant, interleaved (default 20)")
    v.add_argument("--no-compile", action="store_true", help="leave torch.compile out of the comparison")
    v.add_argument("--json", action="store_true")
    v.set_defaults(fn=cmd_verify)

    r = sub.add_parser("run", help="run a model with the tuned kernels swapped in: its forward time and what "
                                   "served each operator call")
    _patched_model_args(r, "as built")
    r.add_argument("--iterations", type=int, default=10, help="timed forwards after the first (default 10)")
    r.add_argument("--save", metavar="OUT.pt", help="write the last forward's outputs there (torch.save)")
    r.add_argument("--json", action="store_true")
    r.set_defaults(fn=cmd_run)


def _patched_model_args(p, dtype_default: str) -> None:
    """The arguments `verify` and `run` share: the model, its table, where and in what dtype."""
    p.add_argument("model", help="the model file (as for tuner profile)")
    p.add_argument("--db", required=True, help="an exported tuning.json (tuner export --db ...) or a tuning "
                   "database (tuning-db.json)")
    p.add_argument("--device", choices=("cpu", "cuda", "npu"), help="default: cuda if usable, else cpu")
    p.add_argument("--dtype", help=f"cast the model and its floating inputs (default: {dtype_default})")
    p.add_argument("--serve-slower", action="store_true", help="also serve the entries whose kernel ran "
                   "slower than torch's own in its run (left to torch by default)")
    p.add_argument("--ops", type=_op_list, metavar="OP,OP", help="route only these ops (runtime.patch(..., "
                   "ops=)), e.g. the ones `tuner verify` advised; default: every op the table holds")


def _checked_ops(ops, table):
    """--ops checked against what the patch can route with this table, before anything runs."""
    if ops is None:
        return None
    from tuner.core.ops import OpError
    from tuner.serve.patch import checked_ops
    try:
        return checked_ops(table, ops, "--ops")
    except (TypeError, ValueError) as e:
        raise OpError(str(e)) from None


def _op_list(text: str) -> frozenset[str]:
    ops = frozenset(o.strip() for o in text.split(",") if o.strip())
    if not ops:
        raise argparse.ArgumentTypeError("name at least one op, e.g. --ops rmsnorm,swiglu")
    return ops


def cmd_profile(args) -> int:
    import torch

    from tuner.backends import get_backend
    from tuner.core.ops import OpError
    from tuner.model.emit import emit_sweep
    from tuner.model.profile import profile_model
    if args.min_share is not None and not args.emit:
        raise OpError("--min-share picks the operators --emit writes; add --emit SWEEP.yaml or leave it out")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    print(f"profiling {args.model} on {device}…", file=sys.stderr)
    peaks = dict(get_backend(BACKEND[device], 0).device_info().peaks)
    prof = profile_model(args.model, device, args.dtype, args.iterations, peaks=peaks)
    prof = with_skeletons(prof, LANGUAGE[device])
    if args.json:
        print(json.dumps([row_json(r) for r in prof.rows], indent=1))
    else:
        from tuner.run.report import console
        console.print(profile_table(prof, args.top))
    if args.emit:
        share = 0.01 if args.min_share is None else args.min_share
        path = emit_sweep(prof, args.emit, BACKEND[device], top=args.top, min_share=share,
                          also=other_languages(BACKEND[device]))
        print(f"wrote {path}: tune it with `tuner sweep {path}`", file=sys.stderr)
    if args.report:
        from tuner.run.html import write_profile_report
        from tuner.run.report import fmt_time
        path = write_profile_report(f"{prof.model} on {device}: {fmt_time(prof.total_s)} per forward",
                                    [row_json(r) for r in prof.rows], args.report)
        print(f"wrote {path}", file=sys.stderr)
    return 0


def with_skeletons(prof, language: str):
    """The profile with `library` kept only where the library has a skeleton in `language`."""
    import dataclasses

    from tuner.core.skeleton import library_skeletons
    have = library_skeletons()
    rows = tuple(r if r.library is None or language in have.get(r.library[0], ()) else
                 dataclasses.replace(r, library=None) for r in prof.rows)
    return dataclasses.replace(prof, rows=rows)


def row_json(r) -> dict:
    from tuner.model.profile import library_calls
    return {"op": r.aten, "shapes": r.shapes, "dtypes": r.dtypes, "calls": r.calls, "total_s": r.total_s,
            "share": r.share, "bound_s": r.bound_s, "bound": r.bound_what, "could_save": r.saving,
            "flops": r.flops, "bytes": r.bytes,
            "library": dict(zip(("op", "shape", "dtype"), r.library)) if r.library else None,
            "library_calls": [dict(zip(("op", "shape", "dtype"), c)) for c in library_calls(r)]}


def profile_table(prof, top: int):
    from rich.table import Table

    from tuner.model.profile import library_calls
    from tuner.run.report import fmt_time
    t = Table(title=f"{prof.model} on {prof.device}: {fmt_time(prof.total_s)} per forward "
                    f"({prof.iterations} profiled)", title_justify="left")
    for c in ("#", "op", "input shapes", "dtype", "calls", "time", "share", "bound/call", "could save",
              "library skeleton"):
        t.add_column(c)
    for i, r in enumerate(prof.rows[:top], 1):
        calls = library_calls(r)
        lib = (f"{calls[0][0]} {' + '.join(c[1] for c in calls)}" if calls
               else "no: the module, whole (--emit)" if prof.recipe(r) is not None else "no")
        t.add_row(str(i), r.aten.replace("aten::", ""), r.shapes, r.dtypes, str(r.calls), fmt_time(r.total_s),
                  f"{r.share:.1%}", fmt_time(r.bound_s) if r.bound_s else "-",
                  f"{r.saving:.1%}" if r.saving is not None else "-", lib)
    rest = len(prof.rows) - top
    if rest > 0:
        t.caption = f"{rest} more operator instances, {sum(r.share for r in prof.rows[top:]):.1%} of the time"
    return t


def _table(path: str, backend: str, serve_slower: bool = False):
    from pathlib import Path

    from tuner.serve.db import TuningDB
    from tuner.serve.runtime import Table
    data = json.loads(Path(path).read_text()) if Path(path).is_file() else None
    if isinstance(data, dict) and isinstance(data.get("entries"), list):
        return Table.load(path, backend=backend, serve_slower=serve_slower)
    return Table.from_db(TuningDB(path), backend=backend, serve_slower=serve_slower)


def cmd_verify(args) -> int:
    import dataclasses

    import torch

    from tuner.model.verify import verify
    from tuner.run.report import fmt_time
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    table = _table(args.db, BACKEND[device], args.serve_slower)
    print(f"verifying {args.model} on {device} with {args.db}…", file=sys.stderr)
    ops = _checked_ops(args.ops, table)
    from tuner.backends import get_backend
    try:  # the copy rate sets each routed call's floor; without it verify says no ceiling
        peaks = dict(get_backend(BACKEND[device], 0).device_info().peaks)
    except Exception as e:  # noqa: BLE001 - said, and the rest verified
        print(f"note: the device's copy rate was not measured ({type(e).__name__}: {e}); no ceiling of "
              f"routing is said", file=sys.stderr)
        peaks = {}
    v = verify(args.model, table, device, args.dtype, args.rounds, compile=not args.no_compile, ops=ops, peaks=peaks)
    if args.json:
        print(json.dumps(dataclasses.asdict(v), indent=1, default=str))
        return 0 if v.passed else 1
    print(f"outputs: {'PASS' if v.passed else 'FAIL'}: the patched model's largest error against float64 is "
          f"{v.error:.3g}; allowed {v.allowed:.3g} (8x the unpatched model's own {v.eager_error:.3g}, plus "
          f"{v.dtype}'s absolute tolerance)")
    med = dict(v.medians_s)
    for k, t in v.medians_s:
        rel = "".join(f", {med[b] / t:.2f}x {b}" for b in ("eager", "torch.compile") if b in med and b != k)
        print(f"  {k:24s} {fmt_time(t)}{rel}")
    if v.modules:
        print(f"  modules replaced: {', '.join(f'{name} ({op})' for name, op in v.modules)}")
    if v.functions:
        print(f"  the model's functions taken over: {', '.join(f'{name} ({op})' for name, op in v.functions)}")
    for call, routed, fell in v.routed:
        print(f"  {call}: {routed} call(s) ran the tuned kernel, {fell} torch's own")
    if v.ops:
        print("  each routed call timed alone here (torch's definition -> the tuned kernel's launch, on random "
              "inputs of the call's shapes; its route's checks and copies not counted):")
        for key, n, t_torch, t_tuned, saved in v.ops:
            print(f"    {key}: {fmt_time(t_torch)} -> {fmt_time(t_tuned)} ({t_torch / t_tuned:.2f}x), {n} per forward: "
                  f"{fmt_time(abs(saved))} {'saved' if saved >= 0 else 'lost'} per forward")
        if "eager" in med and "patched eager" in med:
            total, e2e = sum(r[4] for r in v.ops), med["eager"] - med["patched eager"]
            print(f"    their sum: {fmt_time(abs(total))} {'saved' if total >= 0 else 'lost'} per forward; "
                  f"eager minus patched eager, end to end: {'-' if e2e < 0 else ''}{fmt_time(abs(e2e))}")
        from tuner.model.advice import most_saved
        most = most_saved(list(v.ops), dict(v.floors))
        if most is not None:
            print(f"    at most (each call's bytes at copy bandwidth, its route free): {fmt_time(most)} per forward")
    if not any(r for _, r, _ in v.routed):
        beaten = any(n.startswith("not served, torch's own") for n in v.notes)
        print("  no call ran a tuned kernel: the table has none for these calls' sizes, dtypes and device"
              + (" that ran faster than torch's own (below)" if beaten else ""))
    for n in v.notes:
        print(f"note: {n}", file=sys.stderr)
    return 0 if v.passed else 1


def cmd_run(args) -> int:
    import dataclasses

    import torch

    from tuner.model.verify import run_patched
    from tuner.run.report import fmt_time
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    table = _table(args.db, BACKEND[device], args.serve_slower)
    print(f"running {args.model} on {device} with {args.db}…", file=sys.stderr)
    ops = _checked_ops(args.ops, table)
    r = run_patched(args.model, table, device, args.dtype, args.iterations, args.save, ops=ops)
    if args.json:
        print(json.dumps(dataclasses.asdict(r), indent=1, default=str))
        return 0
    print(f"forward: {fmt_time(r.forward_s)} (median of {r.iterations}, {r.dtype}, {r.device}); outputs "
          + ", ".join(f"{'x'.join(map(str, shape)) or 'scalar'} {dt}" for shape, dt in r.outputs))
    for name, op in r.modules:
        print(f"  module {name}: {op}")
    for key, routed, fell in r.routed:
        print(f"  {key}: {routed} call(s) to the tuned kernel, {fell} to torch")
    if not r.routed:
        print("  no call was served by the table: its entries match no operator call of this model "
              "(op, sizes, dtype, device); `tuner profile` shows the model's calls")
    if r.saved:
        print(f"wrote {r.saved}", file=sys.stderr)
    return 0


def other_languages(backend: str):
    """`also` for emit_sweep: the backend's languages besides its default whose library
    skeleton has a config that can run at the call's shape (the cuda backend's CUDA C++
    matmul only for M <= 16, for instance). None where the backend has one language."""
    import itertools

    from tuner.backends import backend_class, get_backend
    from tuner.core.ops import builtin_spec, load_op, render_context
    from tuner.core.skeleton import library_skeleton, library_skeletons
    cls = backend_class(backend)
    others = [lang for lang in cls.languages if lang != cls.language]
    if not others:
        return None

    def also(op: str, shape: str, dtype: str) -> list[str]:
        out = []
        for lang in others:
            if lang not in library_skeletons().get(op, ()):
                continue
            b = get_backend(backend, language=lang)
            o = load_op(builtin_spec(op, shape, dtype))
            sk = library_skeleton(op, lang)
            ctx, limits = {**render_context(o), **b.render_context(o)}, b.limits()
            if any(sk.space.check(c, ctx, limits) is None for c in itertools.islice(sk.space.configs(), 50000)):
                out.append(lang)
        return out
    return also

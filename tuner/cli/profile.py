"""`tuner profile model.py`: the model's operators ranked by time, and the hot ones as a sweep."""

from __future__ import annotations

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
    p.add_argument("--min-share", type=float, default=0.01, help="with --emit: operators below this share of "
                   "the time are left out (default 0.01)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(fn=cmd_profile)


def cmd_profile(args) -> int:
    import torch

    from tuner.backends import get_backend
    from tuner.model.emit import emit_sweep
    from tuner.model.profile import profile_model
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
        path = emit_sweep(prof, args.emit, BACKEND[device], top=args.top, min_share=args.min_share)
        print(f"wrote {path}: tune it with `tuner sweep {path}`", file=sys.stderr)
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
    return {"op": r.aten, "shapes": r.shapes, "dtypes": r.dtypes, "calls": r.calls, "total_s": r.total_s,
            "share": r.share, "bound_s": r.bound_s, "bound": r.bound_what, "could_save": r.saving,
            "flops": r.flops, "bytes": r.bytes,
            "library": dict(zip(("op", "shape", "dtype"), r.library)) if r.library else None}


def profile_table(prof, top: int):
    from rich.table import Table

    from tuner.run.report import fmt_time
    t = Table(title=f"{prof.model} on {prof.device}: {fmt_time(prof.total_s)} per forward "
                    f"({prof.iterations} profiled)", title_justify="left")
    for c in ("#", "op", "input shapes", "dtype", "calls", "time", "share", "bound/call", "could save",
              "library skeleton"):
        t.add_column(c)
    for i, r in enumerate(prof.rows[:top], 1):
        lib = f"{r.library[0]} {r.library[1]}" if r.library else "no"
        t.add_row(str(i), r.aten.replace("aten::", ""), r.shapes, r.dtypes, str(r.calls), fmt_time(r.total_s),
                  f"{r.share:.1%}", fmt_time(r.bound_s) if r.bound_s else "-",
                  f"{r.saving:.1%}" if r.saving is not None else "-", lib)
    rest = len(prof.rows) - top
    if rest > 0:
        t.caption = f"{rest} more operator instances, {sum(r.share for r in prof.rows[top:]):.1%} of the time"
    return t

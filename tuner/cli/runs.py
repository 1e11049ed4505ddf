"""`tuner show`, `report`, `list` and `export`: what a run (or the runs under a folder) holds,
read back; nothing here searches."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tuner import __version__
from tuner.core.settings import Settings
from tuner.core.values import Status
from tuner.run.store import Store, StoreError, list_runs

SUMMARY_KEYS = ("op", "backend", "evaluations", "invalid", "space_size", "wall_s")  # what `show` prints


def add_cli(sub) -> None:
    s = sub.add_parser("show", help="reprint a run's summary")
    s.add_argument("run")
    s.add_argument("--json", action="store_true")
    s.add_argument("--feedback", action="store_true", help="print what the search learned (each round's)")
    s.add_argument("--csv", metavar="FILE", help="write the records flattened (config, status, median, IQR, "
                   "errors) as CSV to FILE ('-': stdout)")
    s.add_argument("--parquet", metavar="FILE", help="the same as a Parquet file (needs pandas and pyarrow)")
    s.set_defaults(fn=cmd_show)

    r = sub.add_parser("report", help="write a run's or a sweep's HTML report (plots; opens offline)")
    r.add_argument("path", help="a run directory or a sweep folder")
    r.add_argument("--out", help="the HTML file (default: report.html inside it)")
    r.set_defaults(fn=cmd_report)

    ls = sub.add_parser("list", help="list runs")
    ls.add_argument("--runs-dir")
    ls.set_defaults(fn=cmd_list)

    e = sub.add_parser("export", help="write a run's best kernel and config, or the tuning database")
    e.add_argument("run", nargs="?", help="a run directory (or give --db)")
    e.add_argument("--out", help="output folder (default: exported/<run id>, with --db exported/)")
    e.add_argument("--db", help="export this tuning database (tuning.json, tuned_kernels.py, "
                   "triton_autotune.py) instead of one run")
    e.add_argument("--backend", help="with --db: only this backend's entries")
    e.add_argument("--device", help="with --db: only this device model's entries")
    e.set_defaults(fn=cmd_export)


def rounds_table(summary: dict):
    """One row per round: where its skeleton came from, what the search found, what it cost."""
    from rich.table import Table

    from tuner.run.report import fmt_time
    t = Table(title="rounds", title_justify="left")
    for c in ("round", "skeleton", "from", "attempts", "space", "evaluated", "best", "tokens"):
        t.add_column(c)
    win = summary.get("winner_round")
    for r in summary.get("rounds", []):
        tok = r.get("tokens") or {}
        t.add_row(f"{r['round']}{' *' if r['round'] == win else ''}", r["hash"][:10],
                  (r["parent"][:10] if r.get("parent") else r.get("source") or "-"),
                  str(r.get("attempts") or "-"), str(r.get("space_size")), str(r.get("evaluations")),
                  fmt_time(r.get("best_s")), str(tok.get("total_tokens") or "-"))
    llm = summary.get("llm") or {}
    if llm.get("calls"):
        cost = f", ${llm['cost_usd']:.4f}" if llm.get("cost_usd") else ""
        t.caption = (f"* winner. {llm['calls']} model calls, {llm['prompt_tokens']} prompt + "
                     f"{llm['completion_tokens']} completion tokens{cost}"
                     + (" (some estimated)" if llm.get("estimated") else ""))
    return t


def cmd_show(args) -> int:
    from tuner.run.report import console, summary_table
    views = [f for f, on in (("--feedback", args.feedback), ("--json", args.json),
                             ("--csv/--parquet", args.csv or args.parquet)) if on]
    if len(views) > 1:  # each prints its own view and returns: the others would be ignored
        raise StoreError(f"{' and '.join(views)} are different views of a run; ask for one at a time")
    store = Store.open(args.run)
    summary = store.read_json("summary.json")
    if summary is not None and not (isinstance(summary, dict) and all(k in summary for k in SUMMARY_KEYS)):
        raise StoreError(f"{store.path / 'summary.json'} is damaged; `tuner tune --resume {store.path}` "
                         f"writes it again from the records")
    if args.feedback:
        return _show_feedback(store)
    if args.csv or args.parquet:
        from tuner.run.records import Run
        run = Run(store.path)
        if args.parquet:
            try:
                print(f"wrote {run.to_parquet(args.parquet)}", file=sys.stderr)
            except ImportError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
        if args.csv == "-":
            sys.stdout.write(run.to_csv())
        elif args.csv:
            run.to_csv(args.csv)
            print(f"wrote {args.csv}", file=sys.stderr)
        return 0
    if summary is None and store.meta().is_rounds:
        print(f"{store.path}: incomplete {store.meta().rounds}-round run")
        for rdir in sorted((store.path / "rounds").glob("[0-9]*")) if (store.path / "rounds").is_dir() else []:
            r = Store(rdir)
            state = ("searched" if (rdir / "feedback.json").is_file() else
                     f"searching, {len(r.records())} records" if (rdir / "run.json").is_file() else
                     (r.read_json("proposal.json") or {}).get("status", "proposing"))
            print(f"  round {rdir.name}: {state}")
        print(f"Continue it with: tuner tune --resume {store.path}")
        return 0
    if summary is None:
        records = store.records()
        ok = [r for r in records if r.status is Status.OK]
        best = min(ok, key=lambda r: r.seconds) if ok else None
        print(f"{store.path}: incomplete run, {len(records)} records"
              + (f"; best so far {best.seconds * 1e3:.3f} ms with {best.config}" if best else "")
              + f". Continue it with: tuner tune --resume {store.path}")
        return 0
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        console.print(summary_table(summary, str(store.path)))
        if summary.get("rounds"):
            console.print(rounds_table(summary))
            if summary.get("stopped"):
                print(f"stopped early: {summary['stopped']}")
    return 0


def cmd_report(args) -> int:
    from tuner.run.html import write_report
    print(write_report(args.path, args.out))
    return 0


def _show_feedback(store: Store) -> int:
    """Each round's feedback (a single run's is computed from its records)."""
    from tuner.llm.feedback import feedback_for_run, render
    if store.meta().is_rounds:
        for rdir in sorted((store.path / "rounds").glob("[0-9]*")):
            text = (rdir / "feedback.txt").read_text() if (rdir / "feedback.txt").is_file() else "(not searched yet)"
            print(f"== round {rdir.name}\n{text.rstrip()}\n")
        return 0
    if not store.records():
        print(f"{store.path}: no records yet")
        return 0
    print(render(feedback_for_run(store)))
    return 0


def cmd_list(args) -> int:
    from tuner.run.report import console, runs_table
    rows = list_runs(Settings.from_env(runs_dir=args.runs_dir).runs_dir)
    if not rows:
        print(f"no runs under {Settings.from_env(runs_dir=args.runs_dir).runs_dir}")
        return 0
    console.print(runs_table(rows))
    return 0


def cmd_export(args) -> int:
    if args.run and args.db:
        raise StoreError(f"give a run ({args.run}) or --db ({args.db}), not both: each is an export of its own")
    if args.run and (args.backend or args.device):
        raise StoreError("--backend and --device pick entries of --db; a run's export is its own winner: "
                         "leave them out")
    if args.db or not args.run:
        from tuner.cli.db import DEFAULT_DB, cmd_export_db
        args.db = args.db or DEFAULT_DB
        return cmd_export_db(args)
    store = Store.open(args.run)
    cfg = store.read_json("best/config.json")
    kernels = sorted((store.path / "best").glob("kernel.*")) if (store.path / "best").is_dir() else []
    if cfg is None or not kernels:
        raise StoreError(f"{store.path} has no verified winner to export (see `tuner show {store.path}`)")
    if not (isinstance(cfg, dict) and isinstance(cfg.get("config"), dict)
            and isinstance(cfg.get("median_s"), (int, float))):
        raise StoreError(f"{store.path / 'best/config.json'} is damaged; `tuner tune --resume "
                         f"{store.path}` writes best/ again from the records")
    meta = store.meta()
    out = Path(args.out or Path("exported") / store.path.name)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StoreError(f"cannot write the export to {out}: {e.strerror}; pass --out DIR, a folder") from None
    src = kernels[0]
    name = f"{meta.op.name}_best{src.suffix}"
    comment = "//" if src.suffix == ".c" else "#"
    header = "\n".join(f"{comment} {line}" for line in [
        f"{meta.op.name} {meta.op.size_dict()} {meta.op.dtype}, tuned by tuner {__version__}",
        f"backend {meta.backend}, device {meta.device.name if meta.device else '?'}",
        f"config {json.dumps(cfg['config'])}", f"median {cfg['median_s'] * 1e3:.4f} ms; run {store.path.name}",
        "it was built and verified for exactly these sizes, on contiguous row-major buffers (the "
        "inputs, then the outputs); `tuner.runtime` checks a call's tensors before it launches"])
    (out / name).write_text(header + "\n" + src.read_text())
    (out / f"{meta.op.name}_best.json").write_text(json.dumps(
        {**cfg, "backend": meta.backend, "device": meta.device.to_json() if meta.device else None,
         "run": str(store.path)}, indent=1))
    print(f"wrote {out / name} and {out / (meta.op.name + '_best.json')}")
    return 0

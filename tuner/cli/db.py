"""`tuner db` and `tuner export --db`: the tuning database from the command line."""

from __future__ import annotations

import json
from pathlib import Path

from tuner.serve.db import DEFAULT_DB, DBError, TuningDB, export, slower_than_reference


def add_cli(sub) -> None:
    d = sub.add_parser("db", help="the tuning database: collect the best verified configs of many runs",
                       description="`tuner db update RUNS...` collects runs (run directories or folders "
                                   "holding them: runs/, sweeps/<name>); `tuner db list` shows what is "
                                   "served and what is stale; `tuner export --db FILE` writes it out.")
    d.add_argument("action", choices=("update", "list"))
    d.add_argument("paths", nargs="*", help="with update: run directories or folders of runs (default: runs/)")
    d.add_argument("--db", default=DEFAULT_DB, help=f"the database file (default: {DEFAULT_DB})")
    d.add_argument("--stale", action="store_true", help="with list: show the stale entries too")
    d.add_argument("--json", action="store_true")
    d.set_defaults(fn=cmd_db)


def cmd_db(args) -> int:
    from tuner.core.settings import Settings
    from tuner.run.report import console
    if args.action == "list" and args.paths:
        raise DBError(f"`tuner db list` shows the database (--db, default {DEFAULT_DB}), not runs: collect "
                      f"{' '.join(args.paths)} first with `tuner db update {' '.join(args.paths)}`")
    if args.action == "update" and args.stale:
        raise DBError("--stale is for `tuner db list` (update keeps the stale entries: they show with list --stale)")
    db = TuningDB(args.db)
    if args.action == "list" and not db.path.exists():
        raise DBError(f"{db.path}: no tuning database; create it with `tuner db update RUNS...`")
    if args.action == "update":
        paths = args.paths or [Settings.from_env().runs_dir]
        results = db.collect(paths)
        db.save()
        counts: dict[str, int] = {}
        for run, what, why in results:
            counts[what] = counts.get(what, 0) + 1
            if what in ("stale", "replaced") or (what == "skipped" and not args.json):
                print(f"{what}: {run}{': ' + why if why else ''}")
        print(f"{args.db}: {len(results)} runs: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
              + f"; {len(db.entries)} served, {len(db.stale)} stale")
        return 0
    if args.json:
        print(json.dumps({k: v for k, v in db.data.items() if k != "skeletons"}, indent=1, default=str))
        return 0
    console.print(db_table(db, args.stale))
    return 0


def db_table(db: TuningDB, stale: bool = False):
    from rich.table import Table

    from tuner.run.report import fmt_time
    slower = sum(slower_than_reference(e) for e in db.entries)
    t = Table(title=f"{db.path}: {len(db.entries)} served, {len(db.stale)} stale (another toolchain)"
                    + (f"; {slower} slower than torch's own (vs reference < 1x): the runtime runs torch's "
                       f"at their sizes" if slower else ""), title_justify="left")
    for c in ("op", "sizes", "dtype", "backend", "device", "best", "vs reference", "config", "toolchain", "run"):
        t.add_column(c)
    rows = [(e, "") for e in db.entries] + ([(e, " (stale)") for e in db.stale] if stale else [])
    for e, mark in sorted(rows, key=lambda r: (r[1], r[0]["backend"], r[0]["op"], sorted(r[0]["sizes"].items()))):
        sp = e.get("speedup_vs_reference")
        t.add_row(e["op"], "x".join(str(v) for v in e["sizes"].values()), e["dtype"], e["backend"],
                  e["device"] + mark, fmt_time(e["median_s"]), f"{sp:.2f}x" if sp else "-",
                  " ".join(f"{k}={v}" for k, v in e["config"].items()), e["fingerprint"][:8], e["run_id"])
    return t


def cmd_export_db(args) -> int:
    db = TuningDB(args.db)
    if not db.path.exists():
        raise DBError(f"{db.path}: no tuning database; create it with `tuner db update RUNS...`")
    out = Path(args.out or "exported")
    backend, device = getattr(args, "backend", None), getattr(args, "device", None)
    written = export(db, out, backend, device)
    print("wrote " + ", ".join(str(p) for p in written))
    for e in db.served(backend, device):
        if slower_than_reference(e):
            print(f"note: {e['op']} {'x'.join(str(v) for v in e['sizes'].values())} {e['dtype']} on {e['backend']} "
                  f"ran at {e['speedup_vs_reference']:.2f}x torch's own implementation in run {e['run_id']}: "
                  f"the runtime runs torch's at its sizes (`serve_slower=True` serves it)")
    return 0

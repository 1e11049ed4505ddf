"""The model loop over KernelBench-format problems, timed phase by phase.

Each problem `<name>.py` in the problems folder comes with the skeleton a model would write
for it: `<name>.<lang>.yaml` (the space) and `<name>.<lang>.j2` (the template), lang `c` for the
cpu backend and `triton` for cuda. A loopback OpenAI-compatible server (127.0.0.1) answers the
tool's request with that skeleton as a model's reply (```yaml and ```jinja blocks); the tool
runs exactly as `tuner tune --op <name>.py --llm ...` does for a user, one process per problem.
Printed per problem: verified or not, the speedup over the Model in eager torch (timed
interleaved with the winner), evaluations, and the phases from the reply: static checks
passed, first compile done, first config timed, checks done, the search's first evaluation,
winner named.

    python bench/llm_loop.py [--backend cpu|cuda] [--problems DIR] [--only a,b] [--budget 12]
                             [--dtype fp32] [--size gelu:dim=4096 ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.llm_server import ScriptedServer  # noqa: E402
from tuner.cli import NO_WINNER  # noqa: E402

LANG = {"cpu": "c", "cuda": "triton", "null": "script"}
# Sizes for the default problems on a GPU (the files' own sizes are CPU-sized).
GPU_SIZES = {"gelu": {"batch_size": 8192, "dim": 8192}, "sum_rows": {"batch_size": 8192, "dim1": 8192},
             "rmsnorm": {"batch_size": 8192, "dim": 4096}, "cumsum": {"batch_size": 8192, "length": 4096},
             "gemm_bias_relu": {"batch_size": 4096, "in_features": 4096, "out_features": 4096},
             "matvec": {"M": 16384, "K": 8192}}
PHASES = ("checked", "compiled", "first_timed", "validated", "search_first_timed", "done")


def reply_for(problems: Path, name: str, lang: str) -> str:
    space = (problems / f"{name}.{lang}.yaml").read_text()
    template = (problems / f"{name}.{lang}.j2").read_text()
    return f"Here is the skeleton.\n\n```yaml\n{space.rstrip()}\n```\n\n```jinja\n{template.rstrip()}\n```\n"


def one(problems: Path, name: str, args, sizes: dict[str, int], runs: Path) -> dict:
    lang = LANG[args.backend]
    reply = reply_for(problems, name, lang)
    cmd = [sys.executable, "-m", "tuner", "tune", "--op", str(problems / f"{name}.py"),
           "--backend", args.backend, "--dtype", args.dtype, "--llm", "scripted-model",
           "--rounds", "1", "--budget", str(args.budget), "--validate-configs", "2", "--repairs", "0",
           "--seed", str(args.seed), "--runs-dir", str(runs), "--json", "--quiet"]
    for k, v in sizes.items():
        cmd += ["--size", f"{k}={v}"]
    env = {**os.environ, "OPENAI_API_KEY": "unused-by-the-loopback-server", "NO_PROXY": "127.0.0.1,localhost"}
    t0 = time.monotonic()
    with ScriptedServer([{"reply": reply, "delay": args.reply_delay}]) as srv:
        proc = subprocess.run([*cmd, "--llm-base-url", srv.base_url], capture_output=True, text=True,
                              env=env, cwd=ROOT, timeout=args.timeout)
    wall = time.monotonic() - t0
    row = {"problem": name, "backend": args.backend, "dtype": args.dtype, "sizes": sizes,
           "wall_s": round(wall, 1), "rc": proc.returncode}
    if proc.returncode not in (0, NO_WINNER):  # NO_WINNER: ran, nothing verified (a row all the same)
        lines = [ln for ln in proc.stderr.strip().splitlines() if "work so far is kept" not in ln]
        row["error"] = " ".join(lines[-3:])[-600:] or "?"
        return row
    summary = json.loads(proc.stdout)
    best = summary.get("best") or {}
    run = Path(sorted(runs.iterdir(), key=lambda p: p.stat().st_mtime)[-1])
    proposal = json.loads((run / "rounds/01/proposal.json").read_text())
    row.update(verified=bool(best), speedup=best.get("speedup_vs_reference"), best_s=best.get("median_s"),
               reference_s=(summary.get("reference") or {}).get("median_s"),
               evaluations=summary.get("evaluations"), config=best.get("config"),
               percent=(best.get("ceiling") or {}).get("percent"),
               ceiling=(best.get("ceiling") or {}).get("what"),
               phases=proposal.get("phases") or {}, run=str(run),
               timeline=(json.loads((run / "rounds/01/summary.json").read_text()).get("timeline")),
               record_times=[round(json.loads(ln)["time"] - proposal.get("replied", 0), 2)
                             for ln in (run / "rounds/01/records.jsonl").read_text().splitlines() if ln])
    return row


def table(rows: list[dict]) -> str:
    head = ("| problem | sizes | verified | speedup vs eager | best | % of ceiling | evals | "
            + " | ".join(PHASES) + " | wall s |")
    out = [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in rows:
        if r.get("rc"):
            out.append(f"| {r['problem']} | {r['sizes'] or 'file'} | failed: {r.get('error', '')} |"
                       + " |" * (len(PHASES) + 5))
            continue
        ph = r["phases"]
        sizes = ",".join(f"{k}={v}" for k, v in r["sizes"].items()) or "file's"
        pct = f"{r['percent']:.0f} %" if r.get("percent") is not None else "-"
        best = f"{r['best_s'] * 1e6:.1f} us" if r.get("best_s") else "-"
        speed = f"{r['speedup']:.2f}x" if r.get("speedup") else "-"
        out.append(f"| {r['problem']} | {sizes} | {'yes' if r['verified'] else 'no'} | {speed} | {best} | {pct} | "
                   f"{r['evaluations']} | " + " | ".join(f"{ph[p]:.1f}" if p in ph else "-" for p in PHASES)
                   + f" | {r['wall_s']} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cpu", choices=sorted(LANG))
    ap.add_argument("--problems", default=str(ROOT / "bench/llm_problems"))
    ap.add_argument("--only", default="")
    ap.add_argument("--budget", type=int, default=12)
    ap.add_argument("--dtype", default=None, help="fp32 on cpu, bf16 on cuda by default")
    ap.add_argument("--size", action="append", default=[], help="PROBLEM:NAME=VALUE")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reply-delay", type=float, default=0.0,
                    help="seconds the loopback model takes to answer (a real one takes 10-60 s)")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json", default="")
    ap.add_argument("--keep", default="", help="keep the run folders under this folder")
    args = ap.parse_args()
    args.dtype = args.dtype or ("bf16" if args.backend == "cuda" else "fp32")
    problems = Path(args.problems).resolve()
    lang = LANG[args.backend]
    names = sorted(p.stem for p in problems.glob("*.py") if (problems / f"{p.stem}.{lang}.j2").is_file())
    if args.only:
        names = [n for n in names if n in args.only.split(",")]
    overrides: dict[str, dict[str, int]] = {}
    if args.backend == "cuda" and problems == (ROOT / "bench/llm_problems").resolve():
        overrides = {k: dict(v) for k, v in GPU_SIZES.items()}
    for item in args.size:
        prob, _, kv = item.partition(":")
        k, _, v = kv.partition("=")
        overrides.setdefault(prob, {})[k] = int(v)
    rows = []
    with tempfile.TemporaryDirectory(prefix="llm-loop-") as tmp:
        if args.keep:
            tmp = str(Path(args.keep).resolve())
            Path(tmp).mkdir(parents=True, exist_ok=True)
        for name in names:
            runs = Path(tmp) / name
            runs.mkdir(exist_ok=True)
            print(f"{name}…", file=sys.stderr, flush=True)
            rows.append(one(problems, name, args, overrides.get(name, {}), runs))
            print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(f"\n{args.backend}, {args.dtype}, budget {args.budget}, the model's reply after "
          f"{args.reply_delay:g} s, {time.strftime('%Y-%m-%d')}; phases in seconds from the reply\n")
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()

"""A decoder layer, end to end: profile -> sweep -> db -> export -> verify, on the device.

    python bench/decoder_layer.py [--models prefill decode decode_static] [--budget 20] [--rounds 30] [--out DIR]

For each model file (bench/models/qwen2_layer_<name>.py: one Qwen2 decoder layer of
transformers' own code, bf16, random weights; decode keeps its KV cache in transformers'
DynamicCache, which concatenates the whole cache every step, decode_static in a StaticCache,
written in place as a server keeps it) it runs the commands a user runs:
`tuner profile --dtype bf16 --emit`, `tuner sweep` (the emitted library ops at the shapes seen,
`--budget` evaluations each), `tuner db update`, `tuner export`, `tuner verify --json`, and
prints one table: eager, torch.compile (max-autotune-no-cudagraphs), patched eager, patched +
compile, timed by `tuner verify` in one interleave in one process, with the speedups; the
profile's top rows; and the share of the layer's device time in the rows the patch routed to
tuned kernels. Each step's output is kept under --out (default bench/decoder_layer_out).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent


def tuner(*args: str, cwd: Path, log: Path) -> str:
    cmd = [sys.executable, "-m", "tuner", *args]
    print("$ tuner " + " ".join(args), file=sys.stderr, flush=True)
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    with log.open("a") as f:
        f.write(f"$ tuner {' '.join(args)}\n{done.stdout}\n{done.stderr}\n")
    if done.returncode not in (0, 1):
        raise SystemExit(f"tuner {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout


def run_model(name: str, dtype: str, budget: int, rounds: int, out: Path) -> dict:
    model = name if name.endswith(".py") else str(HERE / "models" / f"qwen2_layer_{name}.py")
    work = out / Path(name).stem
    work.mkdir(parents=True, exist_ok=True)
    log = work / "log.txt"
    rows = json.loads(tuner("profile", str(Path(model).resolve()), "--dtype", dtype, "--json", "--emit", "hot.yaml",
                            "--iterations", "5", cwd=work, log=log))
    plan = yaml.safe_load((work / "hot.yaml").read_text())
    plan["budget"] = budget
    (work / "hot.yaml").write_text(yaml.safe_dump(plan, sort_keys=False))
    tuner("sweep", "hot.yaml", "--out", "sweep", cwd=work, log=log)
    tuner("db", "update", "sweep", "--db", "db.json", cwd=work, log=log)
    tuner("export", "--db", "db.json", "--out", "export", cwd=work, log=log)
    verdict = json.loads(tuner("verify", str(Path(model).resolve()), "--db", "export/tuning.json", "--dtype", dtype, "--rounds",
                               str(rounds), "--json", cwd=work, log=log))
    return {"rows": rows, "verdict": verdict}


def table(name: str, r: dict) -> str:
    v, rows = r["verdict"], r["rows"]
    med = dict(v["medians_s"])
    lines = [f"## {name}: outputs {'PASS' if v['passed'] else 'FAIL'} (error {v['error']:.3g}, allowed "
             f"{v['allowed']:.3g})", "", "| variant | median | vs eager | vs torch.compile |", "| --- | --- | --- | --- |"]
    for k, t in med.items():
        ce = med.get("torch.compile")
        lines.append(f"| {k} | {t * 1e6:.1f} us | {med['eager'] / t:.2f}x | "
                     + (f"{ce / t:.2f}x |" if ce else "- |"))
    routed = {c.rsplit(" ", 2)[0] + " " + c.rsplit(" ", 2)[1]: n for c, n, _ in v["routed"]}
    covered = 0.0
    lines += ["", "| op | shapes | share | library | routed |", "| --- | --- | --- | --- | --- |"]
    for row in rows[:10]:
        lib = row.get("library")
        key = f"{lib['op']} {lib['shape']}" if lib else None
        hit = bool(key and routed.get(key))
        covered += row["share"] if hit else 0.0
        lines.append(f"| {row['op']} | {row['shapes']} | {row['share']:.1%} | "
                     f"{lib['op'] + ' ' + lib['shape'] if lib else '-'} | {'yes' if hit else ''} |")
    lines += ["", f"share of the layer's profiled time in routed rows: {covered:.1%}; modules replaced: "
              f"{', '.join(f'{m} ({o})' for m, o in v['modules']) or 'none'}"]
    if v["ops"]:
        from tuner.model.advice import most_saved
        most = most_saved([tuple(o) for o in v["ops"]], dict(v["floors"]))
        gain = med["eager"] - med["torch.compile"] if "torch.compile" in med else None
        lines.append(f"routed calls timed alone save {sum(o[4] for o in v['ops']) * 1e6:.1f} us per forward"
                     + (f"; at most {most * 1e6:.1f} us (each at copy bandwidth, its route free)" if most is not None else "")
                     + (f"; torch.compile's gain over eager: {gain * 1e6:.1f} us" if gain is not None else ""))
    lines += [f"note: {n}" for n in v["notes"]]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["prefill", "decode", "decode_static"],
                    help="names under bench/models (qwen2_layer_<name>.py) or model files")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--budget", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--out", default=str(HERE / "decoder_layer_out"))
    a = ap.parse_args()
    out = Path(a.out)
    results = {}
    for name in a.models:
        results[name] = run_model(name, a.dtype, a.budget, a.rounds, out)
        print(table(name, results[name]), flush=True)
        print(flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

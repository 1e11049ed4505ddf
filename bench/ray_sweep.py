"""One sweep, several executors: the local executor against the Ray executor on one device and on
all devices of the machine, and (optionally) a device actor killed mid-sweep.

Every phase runs the same sweep (the same tasks, the same seeded random sampler, so each task
evaluates the same configs whatever the executor) into its own folder, and reports evaluations
per minute (evaluations of all tasks / the sweep's wall time; the Ray cluster's start-up, once
per process, is reported apart), each task's winner, and whether the winners agree across phases.

    python bench/ray_sweep.py --backend cuda --budget 12 --phases local,ray1,ray --out /tmp/rs
    python bench/ray_sweep.py --backend cuda --phases ray1,ray,raykill      # multi-GPU scaling

Phases: local (the local executor), ray1 (Ray, one device actor), ray (Ray, one actor per GPU),
raykill (as ray, with one device actor's process SIGKILLed once a third of the budget is
recorded: nothing recorded may be lost, every task must still finish its budget).
Writes <out>/ray_sweep.json and prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tuner.core.settings import Settings  # noqa: E402
from tuner.run.store import Store  # noqa: E402
from tuner.sweeps.execute import run_sweep  # noqa: E402
from tuner.sweeps.plan import load_plan  # noqa: E402

TASKS = {  # backend -> (op, shape) list; dtype per backend below
    "cuda": [("softmax", "4096x4096"), ("softmax", "16384x2048"), ("rmsnorm", "4096x4096"),
             ("rmsnorm", "16384x2048"), ("layernorm", "4096x4096"), ("swiglu", "4096x8192"),
             ("add_rmsnorm", "4096x4096"), ("rope", "4096x32x128"), ("cross_entropy", "2048x32000"),
             ("layernorm", "16384x2048"), ("swiglu", "8192x4096"), ("add_rmsnorm", "16384x2048"),
             ("rope", "16384x8x128"), ("softmax", "8192x8192"), ("rmsnorm", "8192x8192"),
             ("cross_entropy", "4096x32000")],
    "cpu": [("softmax", "512x1024"), ("softmax", "2048x256"), ("rmsnorm", "512x1024"),
            ("rmsnorm", "2048x256"), ("layernorm", "512x1024"), ("matmul", "128x128x128")],
    "null": [("softmax", f"{m}x512") for m in (64, 128, 256, 512, 1024, 2048, 4096, 8192)],
}
DTYPE = {"cuda": "bf16", "cpu": "fp32", "null": "fp32"}



class GpuClocks:
    """nvidia-smi sampling each GPU's SM clock and utilisation every 250 ms while a phase runs
    (nothing where there is no nvidia-smi): whether the GPUs slowed down between requests."""

    def __init__(self):
        import subprocess
        try:
            self.proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=index,clocks.sm,utilization.gpu", "--format=csv,noheader,nounits",
                 "-lms", "250"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self.proc = None

    def stop(self) -> dict:
        if self.proc is None:
            return {}
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=10)
        per: dict[str, list[tuple[float, float]]] = {}
        for line in out.splitlines():
            try:
                i, clock, util = (x.strip() for x in line.split(","))
                per.setdefault(i, []).append((float(clock), float(util)))
            except ValueError:
                continue
        summary = {}
        for i, xs in sorted(per.items()):
            clocks = sorted(c for c, _ in xs)
            summary[f"gpu{i}"] = {"samples": len(xs), "sm_mhz_median": clocks[len(clocks) // 2],
                                  "sm_mhz_min": clocks[0],
                                  "below_1500mhz_pct": round(100 * sum(c < 1500 for c in clocks) / len(clocks), 1),
                                  "util_pct_mean": round(sum(u for _, u in xs) / len(xs), 1)}
        return summary

class LoadSampler:
    """What the sweep was waiting on, sampled every 100 ms while a phase runs: idle device
    actors, requests waiting for a device, compiles in flight; and every second the host's
    load, CPU clock and runnable threads by command name (`ps`). Idle actors with no request waiting and many compiles in flight mean
    the compiles do not keep the devices fed; with few compiles in flight, the searches do not."""

    def __init__(self, ex, backend: str):
        self.ex, self.pool, self.samples, self.host, self.threads = ex, ex.pool(backend), [], [], []
        self.stop_flag = threading.Event()
        self.t0 = time.monotonic()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        last_host = 0.0
        while not self.stop_flag.wait(0.1):
            now = time.monotonic() - self.t0
            with self.pool.lock:
                free = len([s for s in self.pool.free if s in self.pool.slots])
                waiting = sum(self.pool.waiting.values())
                n = len(self.pool.slots)
            self.samples.append((now, free, n, waiting, self.ex.compiling))
            if now - last_host >= 1.0:
                last_host = now
                try:
                    load = float(Path("/proc/loadavg").read_text().split()[0])
                    mhz = [float(ln.split(":")[1]) for ln in Path("/proc/cpuinfo").read_text().splitlines()
                           if ln.startswith("cpu MHz")]
                    self.host.append((load, sum(mhz) / len(mhz) if mhz else 0.0))
                except (OSError, ValueError, IndexError):
                    pass
                self._threads()

    def _threads(self):
        """Runnable (R) and waiting-on-I/O (D) threads by command name: what the load is."""
        import subprocess
        try:
            out = subprocess.run(["ps", "-eLo", "stat=,comm="], capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.TimeoutExpired):
            return
        counts: dict[str, int] = {}
        for line in out.splitlines():
            parts = line.split(None, 1)
            if len(parts) == 2 and parts[0][0] in "RD":
                key = f"{parts[0][0]} {parts[1].strip()}"
                counts[key] = counts.get(key, 0) + 1
        self.threads.append(counts)

    def stop(self) -> dict:
        self.stop_flag.set()
        self.thread.join()
        xs = self.samples
        if not xs:
            return {}
        end = xs[-1][0]
        fifths = []
        for k in range(5):
            part = [x for x in xs if k * end / 5 <= x[0] < (k + 1) * end / 5 or (k == 4 and x[0] == end)]
            fifths.append(round(100 * sum(f / max(n, 1) for _, f, n, _, _ in part) / max(len(part), 1), 1))
        idle = [x for x in xs if x[1] > 0]
        med = lambda v: sorted(v)[len(v) // 2] if v else None  # noqa: E731
        return {"idle_actor_pct_by_fifth": fifths,
                "idle_actor_pct": round(100 * sum(f / max(n, 1) for _, f, n, _, _ in xs) / len(xs), 1),
                "compiling_mean": round(sum(x[4] for x in xs) / len(xs), 1),
                "device_waiting_mean": round(sum(x[3] for x in xs) / len(xs), 1),
                "while_idle": {"share_pct": round(100 * len(idle) / len(xs), 1),
                               "compiling_mean": round(sum(x[4] for x in idle) / max(len(idle), 1), 1),
                               "no_request_waiting_pct": round(100 * sum(x[3] == 0 for x in idle) / max(len(idle), 1), 1)},
                "host_load_median": med([h[0] for h in self.host]),
                "threads_mean": dict(sorted(
                    ((k, round(sum(c.get(k, 0) for c in self.threads) / len(self.threads), 1))
                     for k in {k for c in self.threads for k in c}), key=lambda kv: -kv[1])[:12])
                if self.threads else {},
                "cpu_mhz_median": round(med([h[1] for h in self.host]) or 0)}


def sweep_file(out: Path, backend: str, n: int, budget: int, concurrency: int | None = None) -> Path:
    tasks = TASKS[backend][:n]
    ops: dict[str, list[str]] = {}
    for op, shape in tasks:
        ops.setdefault(op, []).append(shape)
    lines = [f"name: bench-{backend}", f'backend: "{backend}"', f"dtypes: [{DTYPE[backend]}]",
             f"budget: {budget}", "sampler: random", "seed: 7",
             # Every task at once: what is measured here is the executors' throughput (a warm
             # start would hold each op's later shapes back until its first has finished).
             "warm_start: false",
             *([f"concurrency: {concurrency}"] if concurrency else []), "ops:"]
    null = ROOT / "tests/fixtures/null"
    for op, shapes in ops.items():
        lines.append(f"  {op}:")
        lines.append(f"    shapes: [{', '.join(shapes)}]")
        if backend == "null":
            lines += [f"    template: {null / 'landscape.txt.j2'}", f"    space: {null / 'landscape.yaml'}"]
    path = out / f"sweep-{backend}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def all_lines(folder: Path) -> dict[str, list[str]]:
    out = {}
    for p in sorted((folder / "tasks").glob("*/records.jsonl")) if (folder / "tasks").is_dir() else []:
        out[p.parent.name] = p.read_text().splitlines()
    return out


def phase(name: str, plan_path: Path, out: Path, settings: Settings, parallel: int | None) -> dict:
    plan = load_plan(plan_path)
    folder = out / name
    # Each phase as on a machine that never ran a sweep: the launchers Triton builds per kernel
    # signature (kept per machine, see tuner.backends.cuda) are built again in each.
    shutil.rmtree(Path(settings.cache_dir) / "triton_launchers", ignore_errors=True)
    result: dict = {"phase": name}
    t0, t0_unix = time.monotonic(), time.time()
    if name == "local":
        summary = run_sweep(plan, settings, "local", out=str(folder), view_enabled=True, parallel=parallel)
        result["startup_s"] = 0.0
    else:
        from tuner.exec.ray_executor import RayExecutor
        ex = RayExecutor(settings, devices=1 if name == "ray1" else None, log_path=str(folder / "workers.log"))
        try:
            ex.pool(plan.backend)  # place the device actors before the clock starts
            result["startup_s"] = round(time.monotonic() - t0, 2)
            # and start the compile processes (the executor starts them with the actors, without
            # waiting; here they are waited for, so the clock measures the sweep, not start-up)
            t_w = time.monotonic()
            result["compile_processes_warmed"] = ex.wait_warm(plan.backend)
            result["warm_s"] = round(time.monotonic() - t_w, 2)
            result["devices"] = ex.n_devices(plan.backend)
            result["actors"] = [s.info for s in ex.pool(plan.backend).slots]
            kill = {}
            if name == "raykill":
                total = sum(t.budget for t in plan.tasks)

                def killer():
                    def enough():
                        n = sum(sum(1 for ln in v if '"INVALID"' not in ln) for v in all_lines(folder).values())
                        return n >= total // 3
                    while not enough():
                        time.sleep(0.05)
                    busy = [x for x in ex.inflight() if x[2].startswith("measure")]
                    victim = busy[0] if busy else ex.inflight()[0]
                    kill["before"] = all_lines(folder)
                    kill["victim"] = {"actor": victim[1], "doing": victim[2], "pid": victim[3]}
                    os.kill(victim[3], signal.SIGKILL)
                    kill["at_s"] = round(time.monotonic() - t1, 2)
                threading.Thread(target=killer, daemon=True).start()
            t1, result["unix_start"] = time.monotonic(), time.time()
            cpu0 = time.process_time()
            clocks = GpuClocks() if plan.backend == "cuda" else None
            load = LoadSampler(ex, plan.backend)
            stats0 = [ex.ray.get(s.actor.stats.remote(), timeout=30) for s in ex.pool(plan.backend).slots]
            summary = run_sweep(plan, settings, "ray", out=str(folder), view_enabled=True,
                                ray_executor=ex, parallel=parallel)
            # CPU seconds of this process (the sweep's driver: searches, rendering, records,
            # Ray calls) per evaluation: near a second per wall second, the driver bounds it
            result["driver_cpu_s"] = round(time.process_time() - cpu0, 2)
            if clocks is not None:
                result["gpu_clocks"] = clocks.stop()
            result["load"] = load.stop()
            pool = ex.pool(plan.backend)
            stats = []
            for i, s in enumerate(pool.slots):
                now = ex.ray.get(s.actor.stats.remote(), timeout=30)
                before = stats0[i] if i < len(stats0) and not pool.replaced else {}
                stats.append({k: round(v - before.get(k, 0), 2) for k, v in now.items()})
            result.update(replaced=pool.replaced, lost_actors=pool.lost, retries=ex.retries,
                          # the share of the sweep's wall time each device actor was serving a
                          # request: near 100 % means the devices bound the sweep
                          actor_busy_pct=[round(100 * s.busy_s / max(summary["wall_s"], 1e-9), 1)
                                          for s in pool.slots],
                          # the same share as the actors themselves count it (time in their
                          # benchmark Worker): what is left is Ray's and the driver's
                          actor_side_busy_pct=[round(100 * st["served_s"] / max(summary["wall_s"], 1e-9), 1)
                                               for st in stats],
                          # per actor, this phase's seconds in the benchmark Worker's measurements:
                          # loading kernels, verifying, timing (and the repetitions timed)
                          actor_stats=stats,
                          # requests served by the task's home actor (see DevicePool)
                          home_pct=round(100 * (1 - pool.away / max(pool.requests, 1)), 1))
            if kill:
                after = all_lines(folder)
                lost = [t for t, lines in kill["before"].items() if after.get(t, [])[:len(lines)] != lines]
                dup = {}
                for t in after:
                    keys = [r.config.key for r in Store(folder / "tasks" / t).records()]
                    dup[t] = len(keys) - len(set(keys))
                result["kill"] = {**{k: v for k, v in kill.items() if k != "before"},
                                  "records_before": sum(len(v) for v in kill["before"].values()),
                                  "tasks_with_lost_records": lost, "duplicates": sum(dup.values())}
        finally:
            ex.close()
    wall = summary["wall_s"]
    # How long the tasks took to start: the first recorded evaluation, per task, from the start.
    starts, compiles = [], []
    for t in (folder / "tasks").glob("*") if (folder / "tasks").is_dir() else []:
        records = Store(t).records()
        times = [r.time for r in records if r.time]
        if times:
            starts.append(min(times) - result.get("unix_start", t0_unix))
        compiles += [r.build.compile_s for r in records if r.build.compile_s]
    if compiles:  # seconds per compile, in its worker: how busy the compile side was
        compiles.sort()
        result["compile_s"] = {"median": round(compiles[len(compiles) // 2], 2),
                               "p90": round(compiles[int(len(compiles) * 0.9)], 2)}
    if starts:
        result["first_record_s"] = {"min": round(min(starts), 1), "max": round(max(starts), 1)}
    # Each task's own start: device facts and the reference timed, then its first evaluation.
    for what in ("device_s", "device_and_reference_s", "first_evaluation_s"):
        got = sorted(t["timeline"][what] for t in summary["tasks"] if what in t.get("timeline", {}))
        if got:
            result[what] = {"min": got[0], "median": got[len(got) // 2], "max": got[-1]}
    result.update(wall_s=wall, evaluations=summary["evaluations"],
                  evals_per_min=round(60 * summary["evaluations"] / wall, 1) if wall else None,
                  tasks_at_once=summary.get("tasks_at_once"),
                  in_flight_per_task=summary.get("evaluations_in_flight_per_task"), tasks=summary["tasks"])
    return result


def agreement(a: dict, b: dict, out: Path) -> list[dict]:
    """Per task: same winner? If not, both winners' times in each phase's own records."""
    rows = []
    for ta, tb in zip(a["tasks"], b["tasks"]):
        row = {"task": ta["task"], "same": ta["best_config"] == tb["best_config"],
               a["phase"]: ta["best_s"], b["phase"]: tb["best_s"]}
        if not row["same"] and ta["best_config"] and tb["best_config"]:
            ra = {r.config.key: r for r in Store(out / a["phase"] / "tasks" / ta["task"]).records()}
            key_b = json.dumps(tb["best_config"], sort_keys=True, separators=(",", ":"))
            other = ra.get(key_b)
            # How much slower b's winner measured in a's run: within noise when small.
            row["b_winner_in_a_ratio"] = round(other.seconds / ta["best_s"], 4) if other else None
        rows.append(row)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="cuda", choices=sorted(TASKS))
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--budget", type=int, default=12, help="evaluations per task")
    p.add_argument("--phases", default="local,ray1,ray")
    p.add_argument("--concurrency", type=int, help="tasks at once with Ray (default: the sweep's own rule)")
    p.add_argument("--parallel", type=int, help="evaluations in flight per task (default: the executor's)")
    p.add_argument("--bench-budget", type=float, default=0.1, help="seconds of timed repetitions per candidate")
    p.add_argument("--cpus", type=int, help="CPUs of the local Ray cluster, i.e. compile tasks at once "
                   "(default: every CPU of the machine)")
    p.add_argument("--out", default="bench_out/ray_sweep")
    p.add_argument("--report", help="also write the JSON report here after every phase (e.g. $OUT/ray_sweep.json)")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    settings = Settings.from_env(runs_dir=str(out / "runs"), cache_dir=str(out / "cache"),
                                 bench_budget_s=args.bench_budget)
    plan_path = sweep_file(out, args.backend, args.tasks, args.budget, args.concurrency)
    # Measure the device's ceilings once, so that no phase pays for it (they are cached).
    from tuner.backends import get_backend
    info = get_backend(args.backend, 0, cache_dir=settings.cache_dir).device_info()
    report = {"backend": args.backend, "device": info.name, "toolchain": dict(info.toolchain),
              "cpus": os.cpu_count(), "budget": args.budget, "tasks": args.tasks,
              "bench_budget_s": args.bench_budget, "phases": []}
    try:
        import torch
        report["gpus"] = torch.cuda.device_count()
    except Exception:  # noqa: BLE001
        report["gpus"] = 0
    if any(n.startswith("ray") for n in args.phases.split(",")):
        from tuner.exec.ray_executor import connect
        t0 = time.monotonic()
        connect(num_cpus=args.cpus, num_gpus=report["gpus"] or None)  # one local cluster for every Ray phase
        report["ray_cpus"] = args.cpus or os.cpu_count()
        report["ray_cluster_start_s"] = round(time.monotonic() - t0, 2)
    for name in args.phases.split(","):
        try:
            r = phase(name, plan_path, out, settings, args.parallel)
        except Exception:  # noqa: BLE001 - record it and go on with the next phase
            import traceback
            r = {"phase": name, "error": traceback.format_exc()[-3000:]}
        report["phases"].append(r)
        for path in (out / "ray_sweep.json", *([Path(args.report)] if args.report else [])):
            path.write_text(json.dumps(report, indent=1, default=str))
        print(json.dumps({k: v for k, v in r.items() if k != "tasks"}, default=str), flush=True)
    ok = [r for r in report["phases"] if "error" not in r]
    if ok:
        report["agreement"] = {f"{a['phase']}~{b['phase']}": agreement(a, b, out)
                               for a in ok for b in ok if a is not b and a["phase"] < b["phase"]}
    for path in (out / "ray_sweep.json", *([Path(args.report)] if args.report else [])):
        path.write_text(json.dumps(report, indent=1, default=str))
    try:
        import ray
        if ray.is_initialized():
            ray.shutdown()
    except ImportError:
        pass
    print(f"\n{report['device']}, {report['cpus']} CPUs, {report.get('gpus')} GPUs; {args.tasks} tasks x "
          f"{args.budget} evaluations, random sampler, bench budget {args.bench_budget} s")
    print(f"Ray cluster start: {report.get('ray_cluster_start_s', '-')} s (once); 'actors s': placing the phase's device actors")
    print("| phase | devices | sweep wall s | evaluations | evals/min | actors s | actors busy % | retries | replaced |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in report["phases"]:
        if "error" in r:
            print(f"| {r['phase']} | error: {r['error'].strip().splitlines()[-1][:150]} |")
            continue
        print(f"| {r['phase']} | {r.get('devices', 1)} | {r['wall_s']} | {r['evaluations']} | {r['evals_per_min']} | "
              f"{r['startup_s']} | {r.get('actor_busy_pct', '-')} | {r.get('retries', '-')} | {r.get('replaced', '-')} |")
    for pair, rows in report.get("agreement", {}).items():
        same = sum(x["same"] for x in rows)
        near = [x.get("b_winner_in_a_ratio") for x in rows if not x["same"]]
        print(f"{pair}: same winner in {same}/{len(rows)} tasks; the others' winner measured "
              f"{near} x the winner in the first phase's own run")
    for r in report["phases"]:
        if r.get("kill"):
            print("kill:", json.dumps(r["kill"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

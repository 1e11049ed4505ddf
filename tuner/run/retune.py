"""Re-tune a finished run for another device, chip revision or shape, and say what it was worth.

    tuner retune runs/<id> --device npu:1        # another device (npu:N, cuda:N, cpu)
    tuner retune runs/<id> --chip 910B4           # another simulated Ascend chip (sim backend)
    tuner retune runs/<id> --shape 8192x4096      # another shape, same backend
    tuner retune runs/<id> --size batch=64        # another size of a problem file

The finished run's skeleton (its winning round's, for a multi-round run) is searched again on
the target, warm-started with the old run's best configs (the old winner first, then the next
fastest that are points of the space). The report puts side by side:

* the old winner measured on the new target (what you get if you do not re-tune; it may not
  even fit: a chip with less UB, a shape it was never checked on),
* the new winner,
* the gap: how much slower the old winner is there (the cost of not re-tuning).

When both are verified, they are re-timed interleaved in one worker before the gap is taken,
so drift hits both alike. The report goes to the new run's `retune.json` and is printed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tuner.backends import BACKENDS, BackendUnavailable, backend_class, get_backend
from tuner.core.ops import OpError, builtin_spec
from tuner.core.settings import Settings
from tuner.core.skeleton import Skeleton, SkeletonError
from tuner.core.values import Config, Record, Status
from tuner.run.store import Store, StoreError
from tuner.run.tune import create_run, execute, with_backend_options


def parse_target(device: str | None, chip: str | None, old_backend: str,
                 old_options: dict | None = None) -> tuple[str, int, dict]:
    """(backend, device index, backend options) from `--device` / `--chip`.

    `--device` is `npu:N`, `cuda:N`, `cpu`, `null` or `sim[:CHIP]`; `--chip CHIP` is the sim
    backend on that chip (a built-in name, a profile YAML or a CANN ini). Neither: the old
    run's backend and options (a new shape on the same device)."""
    if device and chip:
        if not device.startswith("sim"):
            raise BackendUnavailable(f"--chip is for the simulator (sim); --device {device} names a real device")
    if chip and not device:
        device = "sim"
    if not device:
        return old_backend, 0, dict(old_options or {})
    name, _, rest = device.partition(":")
    if name not in BACKENDS:
        raise BackendUnavailable(f"--device {device!r}: unknown backend {name!r}; e.g. npu:0, cuda:0, "
                                 f"cpu, sim:910B4 (known: {', '.join(BACKENDS)})")
    if name == "sim":
        return "sim", 0, {"chip": chip or rest or "910B2"}
    if rest:
        try:
            index = int(rest)
        except ValueError:
            raise BackendUnavailable(f"--device {device!r}: expected {name}:N with N a device index") from None
        if index < 0:
            raise BackendUnavailable(f"--device {device!r}: a device index is >= 0")
        return name, index, {}
    return name, 0, {}


def _finished(store: Store) -> tuple[Store, dict]:
    """The store holding the winning skeleton and the run's summary (a multi-round run's
    winning round)."""
    summary = store.read_json("summary.json")
    if summary is None or not (summary.get("best") or {}).get("config"):
        raise StoreError(f"{store.path} has no verified winner to re-tune (unfinished, or nothing "
                         f"passed: see `tuner show {store.path}`)")
    if store.meta().is_rounds:
        r = summary.get("winner_round")
        if not r:
            raise StoreError(f"{store.path}: a multi-round run without a winning round")
        return Store(store.path / "rounds" / f"{r:02d}"), summary
    return store, summary


def ranked_configs(store: Store, skeleton: Skeleton, first: Config | None, k: int) -> tuple[Config, ...]:
    """`first`, then the run's fastest verified configs (the latest record of each config
    decides: a winner that failed its re-check is out), up to k, all points of the space."""
    latest: dict[str, Record] = {}
    for r in store.records():
        latest[r.config.key] = r
    ok = sorted((r for r in latest.values() if r.status is Status.OK), key=lambda r: r.seconds)
    out: list[Config] = [first] if first is not None and skeleton.space.contains(first) else []
    for r in ok:
        if len(out) >= k:
            break
        if r.config not in out and skeleton.space.contains(r.config):
            out.append(r.config)
    return tuple(out)


def retune(old_run: str | Path, settings: Settings, *, device: str | None = None, chip: str | None = None,
           shape: str | None = None, sizes: dict[str, int] | None = None, budget: int = 40, top: int = 5, sampler: str = "guided",
           seed: int | None = None, time_budget_s: float | None = None, parallel: int | None = None,
           view=None, command: str = "") -> dict[str, Any]:
    """Re-tune `old_run`'s skeleton on the target and return the report (also in retune.json)."""
    old = Store.open(old_run)
    old_meta = old.meta()
    skel_store, old_summary = _finished(old)
    skeleton = skel_store.skeleton()
    old_spec = old.op_spec()
    spec = old_spec
    if shape:
        if old_spec.kind != "builtin":
            raise OpError(f"--shape is for built-in ops; {old_spec.source} takes --size NAME=VALUE "
                          f"(its sizes: {', '.join(f'{k}={v}' for k, v in old_spec.sizes)})")
        spec = builtin_spec(old_spec.name, shape, old_spec.dtype)
    if sizes:
        if old_spec.kind == "builtin":
            raise OpError(f"--size is for problem files; for the built-in {old_spec.name} use --shape, "
                          f"e.g. --shape {'x'.join(str(v) for v in old_spec.size_dict().values())}")
        from tuner.core.problem import spec_from_problem_file
        spec = spec_from_problem_file(old_spec.source, old_spec.dtype, {**old_spec.size_dict(), **sizes})
    backend, index, options = parse_target(device, chip, old_meta.backend, old_meta.backend_options)
    if skeleton.language in backend_class(backend).languages and skeleton.language != backend_class(backend).language:
        options = {**options, "language": skeleton.language}  # a CUDA C++ run re-tuned on another GPU
    b = get_backend(backend, index, **options)
    if b.language != skeleton.language:
        raise SkeletonError(f"the old run's skeleton is {skeleton.language}; the {backend} backend runs "
                            f"{b.language}. Re-tune on a backend of the same language, or tune the "
                            f"library's {b.language} skeleton with `tuner tune`.")
    from tuner.core.ops import load_op
    b.render_context(load_op(spec))  # an unsupported dtype or a missing toolchain fails here
    old_best = old_summary["best"]
    old_winner = Config.of(old_best["config"])
    seeds = ranked_configs(skel_store, skeleton, old_winner, top)
    target = f"{backend}:{options['chip']}" if backend == "sim" else f"{backend}:{index}"
    store = create_run(settings, spec, backend, skeleton, sampler, seed, command=command,
                       extra={"backend_options": options, "devices": [index],
                              "retune_of": {"run": str(old.path), "backend": old_meta.backend,
                                            "device": old_meta.device.name if old_meta.device else None,
                                            "op": old_meta.op.to_json(), "seeds": [c.to_json() for c in seeds]}})
    make = with_backend_options(None, options, (index,))
    summary = execute(store, settings, budget, time_budget_s, parallel, view, seeds=seeds, make_evaluator=make)

    latest: dict[str, Record] = {}
    for r in store.records():
        latest[r.config.key] = r
    old_rec = latest.get(old_winner.key)
    new_cfg = Config.of(summary["best"]["config"]) if summary.get("best") else None
    new_rec = latest.get(new_cfg.key) if new_cfg is not None else None
    old_s = new_s = None
    note = "each timed alone"
    if old_rec is None or (new_rec is not None and old_rec.status is Status.OK and new_cfg != old_winner):
        ev = make(backend, spec, skeleton, settings, store.path)
        try:
            ev.start()
            if old_rec is None:  # the budget ran out before it: measure it now
                old_rec = ev.evaluate(old_winner)
                store.append(old_rec)
            if new_rec is not None and old_rec.status is Status.OK and new_cfg != old_winner:
                samples = ev.retime([old_rec, new_rec])
                if samples is not None and not any(isinstance(x, str) for x in samples):
                    import statistics
                    old_s, new_s = statistics.median(samples[0]), statistics.median(samples[1])
                    note = "re-timed interleaved"
        finally:
            ev.close()
    if new_cfg == old_winner:  # one kernel: the winner's re-timed median stands for both
        old_s = new_s = summary["best"]["median_s"]
    if old_rec.status is Status.OK and old_s is None:
        old_s = old_rec.seconds
    if new_cfg is not None and new_s is None:
        new_s = summary["best"]["median_s"]
    report: dict[str, Any] = {
        "old_run": str(old.path), "run": str(store.path), "target": target,
        "old": {"backend": old_meta.backend, "device": old_meta.device.name if old_meta.device else None,
                "op": old_meta.op.to_json(), "winner": old_winner.to_json(), "median_s": old_best["median_s"]},
        "new": {"backend": backend, "device": (summary.get("device") or {}).get("name"), "op": spec.to_json(),
                "simulated": bool((summary.get("device") or {}).get("simulated"))},
        "old_winner_on_new": {"status": old_rec.status.value, "median_s": old_s,
                              "reason": "" if old_rec.status is Status.OK else old_rec.reason.splitlines()[0][:300]},
        "new_winner": {"config": new_cfg.to_json() if new_cfg else None, "median_s": new_s},
        "same_winner": new_cfg == old_winner, "timing": note, "budget": budget,
        "evaluations": summary.get("evaluations"), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if old_s and new_s:
        report["gap"] = {"slowdown": old_s / new_s, "percent": 100.0 * (old_s / new_s - 1.0),
                         "seconds": old_s - new_s}
    else:
        report["gap"] = None
    store.write_json("retune.json", report)
    return report



"""Multi-round runs: a skeleton writer (a model or the library) writes a skeleton, the search
explores it, the search's feedback goes back for a revision, and the next round is warm-started
from the best configs so far. Each round is a whole run directory under rounds/NN/."""

from __future__ import annotations

import functools
import random
import shutil
import time
from dataclasses import dataclass
from typing import Callable

from tuner import __version__
from tuner.core.ops import ceiling
from tuner.core.settings import Settings
from tuner.core.skeleton import Skeleton
from tuner.core.values import Config, OpSpec, RunMeta, Status
from tuner.exec.evaluate import Evaluator, artifact_in
from tuner.exec.runner import WorkerPools
from tuner.llm.client import LLMBudgetExhausted, transcript_usage
from tuner.llm.feedback import Feedback, feedback_for_run, render
from tuner.llm.prompt import space_yaml
from tuner.llm.proposer import Proposal, ProposerError, RoundContext
from tuner.run.store import Store
from tuner.run.tune import QuietView, _iqr, create_run, execute, keep_problem, with_backend_options


def create_rounds_run(settings: Settings, spec: OpSpec, backend: str, proposer: dict, rounds: int,
                      start: Skeleton | None = None, sampler: str = "guided", seed: int | None = None,
                      storage: str | None = None, command: str = "", patience: int | None = None,
                      study_name: str | None = None, backend_options: dict | None = None) -> Store:
    """A run of `rounds` rounds. Each round is a whole run directory under rounds/NN/; round 1
    searches `start` when given, else the proposer's skeleton; later rounds the proposer's
    revision. `proposer` is the proposer's description (`Proposer.meta()`, no key). llm/ keeps every call's transcript; best/ and summary.json name the overall winner."""
    seed = seed if seed is not None else random.randrange(2**31)
    shape = "x".join(str(v) for _, v in spec.sizes) if spec.kind == "builtin" else "file"
    store = Store.create(settings.runs_dir, f"{spec.name}-{shape}-{spec.dtype}-{backend}-{proposer['kind']}")
    try:
        if start is not None:
            store.write_json("start/skeleton.json", start.to_json())
            store.write_text("start/space.yaml", space_yaml(start))
        keep_problem(store, spec)
        store.write_meta(RunMeta(id=store.path.name, op=spec, backend=backend, rounds=rounds,
                                 proposer=proposer, sampler=sampler, seed=seed, storage=storage,
                                 study_name=study_name or store.path.name, patience=patience, command=command, tuner=__version__,
                                 backend_options=backend_options or None,
                                 created=time.strftime("%Y-%m-%dT%H:%M:%S%z")))
    except OSError:  # a directory that could not be written whole (a full disk): no debris
        shutil.rmtree(store.path, ignore_errors=True)
        raise
    return store


@dataclass
class RoundResult:
    round: int
    skeleton: Skeleton
    space_text: str
    summary: dict
    feedback: object  # feedback.Feedback


def execute_rounds(store: Store, settings: Settings, proposer, budget: int,
                   time_budget_s: float | None = None, parallel: int | None = None, view=None,
                   make_evaluator: Callable[..., Evaluator] | None = None) -> dict:
    """Run (or resume) every round: propose or revise, search with a warm start from the best
    earlier configs, summarise into feedback. Finished rounds are never redone; a reply already
    on disk is never asked for again. A round whose model never produced a valid skeleton ends
    the loop with the best of the earlier rounds (in round 1, that is an error)."""
    view = view or QuietView()
    meta = store.meta()
    spec, backend = store.op_spec(), meta.backend
    done: list[RoundResult] = []
    stopped = ""
    who = (meta.proposer.get("llm") or {}).get("model") or meta.proposer.get("kind", "the proposer")
    pools = None
    if make_evaluator is None:
        # One set of worker processes for the whole run: the proposer's checks and every
        # round's search use them, started once and kept warm (a fresh set per round and per
        # check cost seconds of process start, imports and a first compile each time).
        pools = WorkerPools(settings, store.path / "workers.log")
        make_evaluator = functools.partial(Evaluator, runner=pools.runner)
    make_evaluator = with_backend_options(make_evaluator, meta.backend_options, meta.devices or None)
    try:
        for r in range(1, meta.rounds + 1):
            rstore = Store(store.path / "rounds" / f"{r:02d}")
            if not (rstore.path / "run.json").is_file():
                previous = rstore.read_json("proposal.json") if rstore.path.is_dir() else None
                if previous and previous.get("status") == "failed":
                    if r == 1:
                        raise ProposerError(f"{previous.get('error', 'no valid skeleton')} (recorded "
                                            f"in {rstore.path / 'proposal.json'})")
                    stopped = f"round {r}: {previous.get('error', 'no valid skeleton')}"
                    break
                ctx = RoundContext(spec, backend, settings, store.path, r, budget, meta.seed, make_evaluator,
                                   (meta.backend_options or {}).get("language"))
                start = store.read_json("start/skeleton.json") if r == 1 else None
                try:
                    if start is not None:
                        proposal = Proposal(Skeleton.from_json(start), (store.path / "start/space.yaml").read_text(),
                                            report={"source": "given", "status": "accepted"})
                    elif r == 1:
                        view.note(f"round 1: asking {who} for a skeleton…")
                        proposal = proposer.propose(ctx)
                    else:
                        view.note(f"round {r}: asking {who} to revise the skeleton…")
                        last = done[-1]
                        proposal = proposer.revise(ctx, last.skeleton, last.space_text, last.feedback)
                except LLMBudgetExhausted as e:
                    if r == 1:
                        raise
                    stopped = f"round {r} not run: {e}"
                    break
                if proposal is None:
                    break  # a proposer that does not revise
                rstore.path.mkdir(parents=True, exist_ok=True)
                rstore.write_json("proposal.json", {**proposal.report, "error": proposal.error})
                if proposal.skeleton is None:
                    if r == 1:
                        raise ProposerError(f"{proposal.error} (transcripts in {store.path / 'llm'}, "
                                            f"verdicts in {rstore.path / 'proposal.json'})")
                    stopped = f"round {r}: {proposal.error}"
                    break
                sk = proposal.skeleton
                parent = done[-1].skeleton.hash if done else ""
                sk = Skeleton(sk.template, sk.space, sk.language, sk.name, r, parent, sk.template_path)
                (rstore.path / "records.jsonl").unlink(missing_ok=True)  # from a killed attempt
                for rec in proposal.records:  # the checks already ran these configs
                    rstore.append(rec)
                rstore.write_text("skeleton/space.yaml", proposal.space_text)
                create_run(settings, spec, backend, sk, meta.sampler, meta.seed + r, meta.storage,
                           meta.command, path=rstore.path,
                           extra={"round": r, "study_name": f"{meta.study_name or store.path.name}-round-{r:02d}", "parent_run": store.path.name,
                                  "patience": meta.patience,
                                  **({"backend_options": meta.backend_options} if meta.backend_options else {})})
            sk = rstore.skeleton()
            space_text = (rstore.path / "skeleton/space.yaml").read_text()
            fb_json = rstore.read_json("feedback.json")
            if fb_json is None:
                view.note(f"round {r}: searching {sk.space.size} configs…")
                began = time.time()
                summ = execute(rstore, settings, budget, time_budget_s, parallel, view, seeds=_seeds(done),
                               make_evaluator=make_evaluator)
                _keep_phases(rstore, began, summ)
                fb = feedback_for_run(rstore)
                rstore.write_text("feedback.txt", render(fb))
                rstore.write_json("feedback.json", fb.to_json())
            else:
                fb = Feedback.from_json(fb_json)
            done.append(RoundResult(r, sk, space_text, rstore.read_json("summary.json") or {}, fb))
        side_by_side = _retime_winners(store, done, settings, make_evaluator, view)
    finally:
        proposer.close()
        if pools is not None:
            pools.close()
    summary = _finish_rounds(store, done, stopped, side_by_side)
    from tuner.run.html import report_at_end
    return report_at_end(store, summary, settings.report, view.note)


def _keep_phases(rstore: Store, began: float, summary: dict) -> None:
    """Add the search's phases to the round's proposal.json, in seconds from the accepted
    reply: search_first_timed (the search's first evaluation) and done (winner named)."""
    proposal = rstore.read_json("proposal.json") or {}
    replied = proposal.get("replied")
    if not replied:
        return  # the round searched a given skeleton: no reply to count from
    phases = dict(proposal.get("phases") or {})
    first = (summary.get("timeline") or {}).get("first_evaluation_s")
    if first is not None:
        phases["search_first_timed"] = round(began + first - replied, 3)
    phases["done"] = round(time.time() - replied, 3)
    rstore.write_json("proposal.json", {**proposal, "phases": phases})


def _seeds(done: list[RoundResult], k: int = 5) -> tuple[Config, ...]:
    """The best configs of the earlier rounds, fastest first (execute keeps those that fit,
    a param the revised space added taking its default)."""
    best = []
    for d in done:
        for b in d.feedback.best:
            best.append((b["median_s"], Config.of(b["config"])))
    best.sort(key=lambda x: x[0])
    return tuple(c for _, c in best[:k])


def _retime_winners(store: Store, done: list[RoundResult], settings: Settings, make_evaluator,
                    view) -> dict | None:
    """The rounds' winners re-timed side by side in one interleave with the reference: each
    round's own figure was taken minutes apart from the others', on a machine whose speed
    drifts. {round: samples, "reference": samples}, or None with fewer than two winners or
    when the interleave failed (the rounds' own figures decide then)."""
    import dataclasses
    passed = [d for d in done if (d.summary.get("best") or {}).get("median_s")]
    if len(passed) < 2:
        return None
    records = []
    for d in passed:
        rdir = store.path / "rounds" / f"{d.round:02d}"
        key = Config.of(d.summary["best"]["config"]).key
        rec = next((r for r in reversed(Store(rdir).records())
                    if r.config.key == key and r.status is Status.OK and r.build.artifact), None)
        if rec is None:
            return None
        art = artifact_in(rdir, rec.build.artifact)
        records.append(dataclasses.replace(rec, build=dataclasses.replace(rec.build, artifact=art)))
    view.note(f"re-timing the winners of rounds {', '.join(str(d.round) for d in passed)} side by side…")
    ev = make_evaluator(store.meta().backend, store.op_spec(), passed[-1].skeleton, settings,
                        store.path / "retime")
    try:
        samples = ev.retime(records, with_reference=True)
    finally:
        ev.close()
    if not samples or any(isinstance(x, str) or not x for x in samples):
        return None  # a winner that went wrong on re-timing is its round's record to show
    out: dict = {d.round: list(x) for d, x in zip(passed, samples)}
    out["reference"] = list(samples[-1])
    return out


def _finish_rounds(store: Store, done: list[RoundResult], stopped: str, side_by_side: dict | None = None) -> dict:
    import shutil
    import statistics

    if not done:
        raise RuntimeError(f"{store.path}: no round ran")
    passed = [d for d in done if (d.summary.get("best") or {}).get("median_s")]
    again = {r: statistics.median(x) for r, x in (side_by_side or {}).items() if r != "reference"}
    if again:
        winner = min((d for d in passed if d.round in again), key=lambda d: again[d.round])
    else:
        winner = min(passed, key=lambda d: d.summary["best"]["median_s"]) if passed else None
    by_hash = {d.skeleton.hash: d for d in done}
    lineage, cur = [], winner
    while cur is not None:
        lineage.insert(0, {"round": cur.round, "hash": cur.skeleton.hash, "parent": cur.skeleton.parent,
                           "best_s": (cur.summary.get("best") or {}).get("median_s")})
        cur = by_hash.get(cur.skeleton.parent) if cur.skeleton.parent else None
    llm_dir = store.path / "llm"
    rounds = []
    for d in done:
        proposal = Store(store.path / "rounds" / f"{d.round:02d}").read_json("proposal.json") or {}
        best = d.summary.get("best") or {}
        attempts = sum(len(c.get("attempts", [])) for c in proposal.get("candidates", []))
        rounds.append({"round": d.round, "hash": d.skeleton.hash, "parent": d.skeleton.parent,
                       "source": proposal.get("source") or proposal.get("kind", ""),
                       "candidates": len(proposal.get("candidates", [])), "attempts": attempts,
                       "space_size": d.skeleton.space.size, "evaluations": d.summary.get("evaluations"),
                       "invalid": d.summary.get("invalid"), "best_s": best.get("median_s"),
                       "best_config": best.get("config"), "phases": proposal.get("phases"),
                       "tokens": transcript_usage(llm_dir, f"r{d.round:02d}-").to_json()})
    base = dict((winner or done[-1]).summary)
    if again and winner is not None:
        # The winner's figures as re-timed beside the other rounds' winners and the reference.
        t, ref = again[winner.round], statistics.median(side_by_side["reference"])
        best = dict(base["best"])
        best.update(median_s=t, samples=len(side_by_side[winner.round]), speedup_vs_reference=ref / t,
                    gbps=(base.get("bytes") or 0) / t / 1e9,
                    gflops=(base["flops"] / t / 1e9) if base.get("flops") else None,
                    timing="re-timed side by side with the other rounds' winners and the reference")
        best["iqr_s"] = _iqr(side_by_side[winner.round])
        peaks = dict((base.get("device") or {}).get("peaks") or {})
        c = ceiling(base.get("flops"), base.get("bytes") or 0.0, t, (base.get("op") or {}).get("dtype", "fp32"), peaks)
        if c is not None:
            if (base.get("device") or {}).get("simulated"):
                c["what"] = c["what"].replace("(measured)", "(simulated)")
            best["ceiling"] = c
        base["best"] = best
        base["reference"] = {**base.get("reference", {}), "median_s": ref, "interleaved": True,
                             "iqr_s": _iqr(side_by_side["reference"]), "samples": side_by_side["reference"][:200]}
        for r in rounds:
            if r["round"] in again:
                r["best_side_by_side_s"] = again[r["round"]]
    base.update({"rounds": rounds, "winner_round": winner.round if winner else None, "lineage": lineage,
                 "llm": transcript_usage(llm_dir).to_json(), "stopped": stopped,
                 "wall_s": round(sum(d.summary.get("wall_s", 0.0) for d in done), 2)})
    if winner is not None:
        src = store.path / "rounds" / f"{winner.round:02d}" / "best"
        shutil.rmtree(store.path / "best", ignore_errors=True)
        shutil.copytree(src, store.path / "best")
    store.write_json("summary.json", base)
    return base

"""The `tuner` command: tune, show, list, export, sweep, db."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import shlex
import sys
import textwrap
from pathlib import Path

from tuner import __version__
from tuner.backends import BACKENDS, BackendUnavailable, backend_class, default_backend, get_backend
from tuner.cli import NO_WINNER
from tuner.cli.argv import redacted_argv
from tuner.core.landscape import LandscapeError
from tuner.core.ops import BUILTINS, OpError, builtin_spec, load_op, parse_sizes, render_context
from tuner.core.problem import probe_import, spec_from_problem_file
from tuner.core.settings import Settings
from tuner.core.skeleton import Skeleton, SkeletonError, library_skeleton, load_skeleton
from tuner.core.space import SpaceError
from tuner.core.values import OpSpec
from tuner.exec.sandbox import hide_from_proc, not_dumpable
from tuner.exec.worker import WorkerError, WorkerFailure
from tuner.llm.client import LLMConfig, LLMError
from tuner.llm.proposer import ProposerError, make_proposer, openai_meta
from tuner.llm.rounds import create_rounds_run, execute_rounds
from tuner.run.store import Store, StoreError
from tuner.run.tune import create_run, execute, keep_resume_settings, refuse_empty_space, with_backend_options
from tuner.search.searcher import SAMPLERS, SearchError, check_storage
from tuner.sweeps.plan import SweepError

USER_ERRORS = (LandscapeError, OpError, SpaceError, SkeletonError, BackendUnavailable, StoreError, SearchError,
               LLMError, ProposerError, SweepError)
DEFAULT_BUDGET = 40


def _llm_overrides(args) -> dict:
    """The model flags that were given (None: not given, the environment or run.json decides)."""
    return {"model": args.llm, "base_url": args.llm_base_url, "timeout_s": args.llm_timeout,
            "retries": args.llm_retries, "temperature": args.llm_temperature,
            "max_reply_tokens": args.llm_max_tokens, "token_budget": args.token_budget,
            "price": args.llm_price, "cost_budget": args.cost_budget}


def build_spec(args) -> OpSpec:
    if args.op_file:
        if args.shape:
            raise OpError("--shape is for built-in ops; for a problem file set its sizes with "
                          "--size NAME=VALUE (its module-level integer constants)")
        return spec_from_problem_file(args.op_file, args.dtype, parse_sizes(args.size))
    if not args.op:
        raise OpError(f"name an op ({', '.join(BUILTINS)}) or pass --op path/to/problem.py")
    if args.op.endswith(".py") or os.sep in args.op:
        return spec_from_problem_file(args.op, args.dtype, parse_sizes(args.size))
    if args.size:
        raise OpError("--size is for problem files; for a built-in op use --shape, e.g. --shape 4096x1024")
    if not args.shape:
        b = BUILTINS.get(args.op)
        hint = f" ({'x'.join(b.size_names)})" if b else ""
        raise OpError(f"--shape is required for {args.op}{hint}, e.g. --shape "
                      f"{'x'.join(['1024'] * (len(b.size_names) if b else 2))}")
    return builtin_spec(args.op, args.shape, args.dtype)


def entry_signature(spec: OpSpec, language: str) -> str:
    op = load_op(spec)
    if language == "c":
        from tuner.core.ops import c_entry
        return c_entry(op, "{{ ctype }}")
    return f"def launch({', '.join(op.input_names + op.output_names)})"


def choose_skeleton(args, spec: OpSpec, backend: str, language: str | None = None) -> Skeleton:
    language = (get_backend(backend, **({"language": language} if language else {})).language
                if backend in BACKENDS else "c")
    if args.template or args.space:
        if not (args.template and args.space):
            raise SkeletonError("pass both --template FILE and --space FILE")
        return load_skeleton(args.template, args.space)
    if spec.kind != "builtin":
        raise SkeletonError(
            f"{spec.source} has no library skeleton. Write a kernel template and its space and "
            f"pass --template FILE --space FILE (format: README, 'Skeletons'). For the {backend} "
            f"backend the template must define\n{textwrap.indent(entry_signature(spec, language), '    ')}\n"
            f"and may read the sizes as template variables: "
            f"{', '.join('{{ %s }}' % k for k, _ in spec.sizes) or '(none)'}.")
    return library_skeleton(spec.name, language)


def cmd_tune(args) -> int:
    from tuner.run.report import console, summary_table
    store, summary = tune_from_args(args)
    if args.json:
        print(json.dumps(summary, indent=1, default=str))
    else:
        console.print(summary_table(summary, str(store.path)))
        if summary.get("rounds"):
            from tuner.cli.runs import rounds_table
            console.print(rounds_table(summary))
            if summary.get("stopped"):
                print(f"note: {summary['stopped']}", file=sys.stderr)
    # The exit code says whether there is a kernel to use: a search that ran but passed no
    # config is not a success a script may build on (NO_WINNER, distinct from bad input's 2).
    return 0 if summary.get("best") else NO_WINNER


def tune_from_args(args) -> tuple[Store, dict]:
    """What `tuner tune` does with its parsed arguments (also `tuner.api.tune`'s): the run's
    store and its summary. Bad input raises one of USER_ERRORS before any run directory
    exists."""
    settings = Settings.from_env(runs_dir=args.runs_dir, run_timeout_s=args.run_timeout,
                                 compile_timeout_s=args.compile_timeout, stop_gain=args.stop_gain)
    if args.resume:
        _refuse_new_run_flags(args)
        store = Store.open(args.resume)
        with store.lock():  # before the repair: another process may be appending a record
            store.repair()
            print(f"resuming {store.path}: {len(store.records())} records on disk", file=sys.stderr)
            meta = store.meta()
            if meta.op.kind == "kernelbench" and Path(meta.op.source).is_file():
                probe_import(Path(meta.op.source))  # the file may have changed since the run began
            if meta.is_rounds:
                if args.rounds and args.rounds != meta.rounds:  # more (or fewer) rounds than asked first
                    store.write_meta(meta.replace(rounds=args.rounds))
                return _tune_rounds(args, settings, store)
            return _tune_one(args, settings, store)
    else:
        spec = build_spec(args)
        if args.study_name and not args.storage:
            raise SearchError("--study-name names the study kept in --storage; pass --storage too "
                              "(e.g. --storage runs/study.journal)")
        check_storage(args.storage)  # before a run directory exists, as every mistake below
        backend = args.backend or ("sim" if args.chip else default_backend())
        if args.chip and backend not in ("sim", "npu"):
            raise BackendUnavailable(f"--chip picks the Ascend chip profile of --backend sim (or of an NPU "
                                     f"whose SoC has none built in), not of {backend}")
        options = {"chip": args.chip} if args.chip else {}
        if getattr(args, "language", None):
            get_backend(backend, language=args.language)  # one it compiles, or a message that says which
            options["language"] = args.language
        llm = None
        if args.proposer != "library":
            llm = LLMConfig.from_env(api_key=args.llm_api_key, **_llm_overrides(args))
            if llm is None and args.proposer == "openai":
                raise LLMError("--proposer openai needs a model: --llm MODEL or TUNER_LLM_MODEL")
            if llm is not None and not (llm.base_url or os.environ.get("OPENAI_BASE_URL") or llm.api_key):
                # The default endpoint is a hosted API: without a key every call is refused.
                raise LLMError("the default OpenAI endpoint needs a key: set OPENAI_API_KEY (or "
                               "--llm-api-key), or point --llm-base-url at your own server")
        if llm is not None:
            if "chip" in options:
                raise BackendUnavailable("--chip with a model proposer is not supported yet; "
                                         "use the library skeletons (--proposer library)")
            return _tune_rounds(args, settings, None, spec, backend, llm, options)
        if (args.rounds or 1) > 1:
            print("note: no model is configured (--llm MODEL or TUNER_LLM_MODEL), so the library "
                  "skeleton is searched in one round", file=sys.stderr)
        skeleton = choose_skeleton(args, spec, backend, options.get("language"))
        if skeleton.language != backend_class(backend).language \
                and skeleton.language in backend_class(backend).languages:  # a skeleton of its other language
            options["language"] = skeleton.language
        # Fail on an unsupported dtype, a missing toolchain or a space with no valid config at
        # this shape before a run directory exists (else every such mistake leaves an empty run).
        device = get_backend(backend, **options)
        op = load_op(spec)
        context = {**render_context(op), **device.render_context(op)}
        limits = device.limits()
        refuse_empty_space(skeleton, context, limits)
        if args.warm_start:  # a source that does not read fails here, not in a new run
            from tuner.run.warm import warm_starts
            warm_starts(args.warm_start, skeleton.space)
        elif not getattr(args, "fresh", False):
            from tuner.run.warm import earlier_runs
            args.warm_start = earlier_runs(settings.runs_dir, spec, backend, options, skeleton.hash,
                                           device.device_info(peaks=False).name)
            if args.warm_start:
                print(f"warm start: the best configs of {len(args.warm_start)} earlier run(s) of this op, "
                      f"skeleton and device ({', '.join(Path(p).name for p in args.warm_start)}) are tried "
                      f"first; --fresh searches without them", file=sys.stderr)
        store = create_run(settings, spec, backend, skeleton, args.sampler, args.seed, args.storage,
                           command=redacted_argv(sys.argv),
                           extra={"budget": args.budget or DEFAULT_BUDGET, "patience": args.patience,
                                  **({"study_name": args.study_name} if args.study_name else {}),
                                  "warm_start": args.warm_start,
                                  **({"backend_options": options} if options else {})})
        with store.lock():
            return _tune_one(args, settings, store)


# What a run was created with (its run.json): a resume continues that run, so these flags
# would be ignored there; how long it goes on (budget, patience, timeouts, parallel, executor)
# and the model's endpoint settings are the resume's own.
NEW_RUN_FLAGS = ("op", "op_file", "shape", "size", "dtype", "backend", "chip", "language", "template",
                 "space", "sampler", "seed", "warm_start", "fresh", "storage", "study_name", "proposer",
                 "llm", "candidates", "repairs", "validate_configs", "llm_prompts")


def _refuse_new_run_flags(args) -> None:
    defaults = parser().parse_args(["tune"])
    given = [k for k in NEW_RUN_FLAGS if getattr(args, k, None) != getattr(defaults, k)]
    if given:
        flags = ", ".join(("--op" if k == "op_file" else "OP" if k == "op" else "--" + k.replace("_", "-"))
                          for k in given)
        raise StoreError(f"--resume continues {args.resume} as it was created; {flags} would be ignored "
                         f"there: leave {'it' if len(given) == 1 else 'them'} out, or start a new run "
                         f"without --resume")


def _tune_one(args, settings: Settings, store: Store) -> tuple[Store, dict]:
    """Search a single-skeleton run (new or resumed) whose lock this process holds."""
    from tuner.run.report import ProgressView
    args.resume_hint = f"tuner tune --resume {shlex.quote(str(store.path))}"
    with _executor(args, settings, store) as make_evaluator, ProgressView(not args.quiet) as view:
        budget, restart = _run_settings(args, store)
        summary = execute(store, settings, budget, args.time_budget, args.parallel, view,
                          make_evaluator=with_backend_options(make_evaluator,
                                                              store.meta().backend_options),
                          restart_patience=restart)
    return store, summary


def _run_settings(args, store: Store) -> tuple[int, bool]:
    """The budget (--budget, else the run's own, else the default) and whether `--patience`
    counts afresh (`tune.keep_resume_settings`). A resumed run (killed, or stopped with Ctrl-C)
    finishes what it was asked for, not the default; budget and patience are kept in run.json
    for the next resume."""
    meta = store.meta()
    budget = args.budget or meta.budget or DEFAULT_BUDGET
    patience = getattr(args, "patience", None) or meta.patience
    return budget, keep_resume_settings(store, budget, patience)


@contextlib.contextmanager
def _executor(args, settings: Settings, store: Store):
    """Where the evaluations of `tuner tune` run: None (local workers) or a Ray executor's
    `evaluator`, with its cluster shut down at the end when it started one."""
    if getattr(args, "executor", "local") != "ray":
        yield None
        return
    from tuner.exec.ray_executor import RayExecutor
    with RayExecutor(settings, address=args.ray_address, devices=args.devices,
                     log_path=str(store.path / "workers.log")) as executor:
        yield executor.evaluator


def _tune_rounds(args, settings: Settings, store: Store | None, spec: OpSpec | None = None,
                 backend: str | None = None, llm: LLMConfig | None = None,
                 options: dict | None = None) -> tuple[Store, dict]:
    """A multi-round run with a model proposer: a new one (spec, backend, llm) or a resumed one."""
    from tuner.run.report import ProgressView
    if store is None:
        assert spec is not None and backend is not None and llm is not None
        start = choose_skeleton(args, spec, backend, (options or {}).get("language")) \
            if (args.template or args.space) else None
        get_backend(backend, **(options or {})).render_context(load_op(spec))
        try:
            meta = openai_meta(llm, args.candidates, args.repairs, args.validate_configs, args.llm_prompts)
        except FileNotFoundError as e:
            raise LLMError(f"--llm-prompts: {e}") from None
        rounds = args.rounds or 3
        store = create_rounds_run(settings, spec, backend, meta, rounds, start, args.sampler, args.seed,
                                  args.storage, command=redacted_argv(sys.argv), patience=args.patience,
                                  study_name=args.study_name, backend_options=options)
        print(f"run {store.path}: {rounds} round(s) with {llm.model} at "
              f"{llm.base_url or 'the default endpoint'}", file=sys.stderr)
        with store.lock():
            return _tune_rounds(args, settings, store)
    args.resume_hint = f"tuner tune --resume {shlex.quote(str(store.path))}"
    meta = store.meta()
    overrides = {k: v for k, v in _llm_overrides(args).items() if k != "model"}
    proposer = make_proposer(meta.proposer, store.path, api_key=args.llm_api_key, **overrides)
    with _executor(args, settings, store) as make_evaluator, ProgressView(not args.quiet) as view:
        summary = execute_rounds(store, settings, proposer, _run_settings(args, store)[0], args.time_budget,
                                 args.parallel, view,
                                 make_evaluator=make_evaluator)
    return store, summary


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tuner", description="Search-based kernel autotuner.")
    p.add_argument("--version", action="version", version=f"tuner {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("tune", help="tune an operator", epilog=(
        "exit code: 0 a config passed; 3 the search ran and none passed; 2 bad input; "
        "1 the run could not go on; 130 interrupted (the work is kept: --resume)"))
    t.add_argument("op", nargs="?", help=f"a built-in op ({', '.join(BUILTINS)}) or a problem file")
    t.add_argument("--op", dest="op_file", metavar="FILE", help="a KernelBench-format problem file")
    t.add_argument("--shape", help="sizes of a built-in op, e.g. 4096x1024 (matmul: MxNxK)")
    t.add_argument("--size", action="append", default=[], metavar="NAME=VALUE",
                   help="override a problem file's module-level size constant (repeatable)")
    t.add_argument("--dtype", default="fp32", help="fp32 (default), fp64, fp16, bf16")
    t.add_argument("--backend", choices=sorted(BACKENDS), help="default: an accelerator if usable, else cpu")
    t.add_argument("--chip", help="with --backend sim (implied): the simulated Ascend chip, 910B1, 910B2 "
                   "(default), 910B3, 910B4, 910_93, 310P3, a profile .yaml or CANN's platform_config/<SoC>.ini; "
                   "with --backend npu: the profile of a SoC that has none built in")
    t.add_argument("--language", help="the kernel language, where the backend compiles several (cuda: "
                                      "triton, the default, or cuda for CUDA C++)")
    t.add_argument("--template", help="a Jinja2 kernel template (with --space)")
    t.add_argument("--space", help="the YAML space of the template's tunables")
    t.add_argument("--budget", type=int, help=f"configs to evaluate (default {DEFAULT_BUDGET}; with "
                   f"--resume, the run's own)")
    t.add_argument("--time-budget", type=float, metavar="SECONDS", help="stop searching after this long")
    t.add_argument("--sampler", choices=SAMPLERS, default="guided",
                   help="guided (default): a model of the space's timings and failures searched "
                        "outward from the best config so far; or Optuna's tpe, random, cmaes, gp; "
                        "grid: every config once (records a full landscape for replay)")
    t.add_argument("--patience", type=int, metavar="N",
                   help="stop once N evaluations in a row brought no config 0.5%% faster (default: off)")
    t.add_argument("--stop-gain", type=float, metavar="FRACTION",
                   help="with --patience: stop only once the guided search's model also expects less than "
                        "this fraction more (e.g. 0.01: good enough within 1%%; TUNER_STOP_GAIN)")
    t.add_argument("--warm-start", action="append", default=[], metavar="SOURCE",
                   help="try the best configs measured elsewhere first: a run directory, a landscape "
                        "JSON (FILE@SHAPE for one of its shapes) or a JSON list of configs (repeatable). "
                        "Without it, a new run starts from the earlier runs of the same op, shape, dtype, "
                        "skeleton and device under --runs-dir (the 3 most recent), if any")
    t.add_argument("--fresh", action="store_true",
                   help="search without the earlier runs of the same op, skeleton and device (an "
                        "independent search: comparing samplers or seeds)")
    t.add_argument("--seed", type=int)
    t.add_argument("--parallel", type=int, help="evaluations in flight (default: one per core)")
    t.add_argument("--storage", help="also keep the run as an Optuna study (times in seconds, real param "
                        "values, failures as FAIL trials with their reasons) for optuna-dashboard: an RDB "
                        "URL (sqlite:///study.db) or a .journal file path")
    t.add_argument("--study-name", help="the study's name in --storage (default: the run's id)")
    t.add_argument("--runs-dir", help="where runs go (default: runs/)")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue a run that was stopped or killed (as it was created: "
                   "--budget, --patience, timeouts and --parallel may change, not what it tunes)")
    t.add_argument("--run-timeout", type=float, help="seconds to verify and time one config")
    t.add_argument("--compile-timeout", type=float, help="seconds to compile one config")
    t.add_argument("--json", action="store_true", help="print the summary as JSON")
    t.add_argument("--quiet", action="store_true", help="no progress output")
    t.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="local: worker processes on this machine; ray: compile tasks and one device "
                        "actor per GPU/NPU on a Ray cluster (pip install 'tuner[ray]')")
    t.add_argument("--ray-address", metavar="ADDR", help="with --executor ray: a running cluster "
                   "(default: start a local one)")
    t.add_argument("--devices", type=int, help="with --executor ray: device actors (default: every GPU/NPU "
                   "of the cluster; one CPU worker per node for cpu)")
    m = t.add_argument_group("model proposer (any OpenAI-compatible endpoint: a hosted API, vLLM, vllm-ascend)")
    m.add_argument("--proposer", choices=("library", "openai"),
                   help="library: the shipped skeletons, one round, offline; openai: a model writes "
                        "and revises the skeleton (default: openai when a model is configured)")
    m.add_argument("--llm", metavar="MODEL", help="the model name (env TUNER_LLM_MODEL)")
    m.add_argument("--llm-base-url", metavar="URL", help="the endpoint, e.g. http://host:8000/v1 "
                   "(env TUNER_LLM_BASE_URL; default: the openai client's)")
    m.add_argument("--llm-api-key", metavar="KEY", help="the key (env OPENAI_API_KEY, preferred: "
                   "a flag is visible to other users of the machine); never written to the run")
    m.add_argument("--rounds", type=int, help="propose/search/revise rounds (default 3 with a model, 1 without)")
    m.add_argument("--candidates", type=int, default=1, help="skeletons asked per round; all are "
                   "checked, the fastest verified one is searched (default 1)")
    m.add_argument("--repairs", type=int, default=3, help="repair requests per candidate before "
                   "giving up (default 3)")
    m.add_argument("--validate-configs", type=int, default=2, help="random configs compiled and "
                   "verified besides the default before a skeleton is accepted (default 2)")
    m.add_argument("--llm-timeout", type=float, metavar="SECONDS", help="per request (default 600)")
    m.add_argument("--llm-retries", type=int, help="retries on 429/5xx/timeouts, with backoff (default 5)")
    m.add_argument("--llm-temperature", type=float)
    m.add_argument("--llm-max-tokens", type=int, help="reply token limit per request (default 16384)")
    m.add_argument("--token-budget", type=int, help="prompt+completion tokens per run (default 2000000)")
    m.add_argument("--llm-price", metavar="IN,OUT", help="USD per million prompt,completion tokens: "
                   "enables cost accounting")
    m.add_argument("--cost-budget", type=float, metavar="USD", help="stop asking past this cost (needs --llm-price)")
    m.add_argument("--llm-prompts", metavar="DIR", help="prompt texts to use instead of tuner/prompts/v1")
    t.set_defaults(fn=cmd_tune)

    from tuner.cli import db, profile, retune, runs, sweep
    runs.add_cli(sub)
    sweep.add_cli(sub)
    profile.add_cli(sub)
    db.add_cli(sub)
    retune.add_cli(sub)
    return p


# Numeric flags (of any command) and their lowest sensible value. argparse takes any number;
# out of range, they failed deep inside the search (a traceback for --parallel -1, a misleading
# storage error for --seed -1) or were silently taken as 'off' (--time-budget 0).
MIN_VALUE = {"budget": 1, "iterations": 1, "parallel": 1, "patience": 1, "rounds": 1, "candidates": 1, "devices": 1,
             "top": 1, "concurrency": 1, "llm_max_tokens": 1, "token_budget": 1, "repairs": 0,
             "validate_configs": 0, "llm_retries": 0, "seed": 0, "cost_budget": 0}
ABOVE_ZERO = ("time_budget", "run_timeout", "compile_timeout", "llm_timeout")


def _bad_number(args) -> str | None:
    """What is wrong with a numeric flag's value, or None."""
    for name, low in MIN_VALUE.items():
        v = getattr(args, name, None)
        if v is not None and v < low:
            return f"--{name.replace('_', '-')} must be at least {low}, got {v}"
    for name in ABOVE_ZERO:
        v = getattr(args, name, None)
        if v is not None and not v > 0:
            return f"--{name.replace('_', '-')} must be a positive number of seconds, got {v}"
    if getattr(args, "seed", None) is not None and args.seed >= 2**32:
        return f"--seed must be below 2**32, got {args.seed}"
    return _idle_flag(args)


def _idle_flag(args) -> str | None:
    """A flag that does nothing without another (accepted and then ignored would mislead), or
    None. A resume's --stop-gain may rest on the run's own --patience."""
    if getattr(args, "executor", "local") != "ray":
        for name in ("ray_address", "devices", "concurrency"):
            if getattr(args, name, None) is not None:
                return f"--{name.replace('_', '-')} is for --executor ray; add --executor ray or leave it out"
    if getattr(args, "stop_gain", None) and not getattr(args, "patience", None) and not getattr(args, "resume", None):
        return ("--stop-gain says when a --patience stall may stop the search; add --patience N "
                "(e.g. --patience 10) or leave it out")
    return None


def _disk_full(args, what: str) -> int:
    """A full disk (or quota) mid-run: what to do, not a traceback. The records written so far
    are kept (a last line cut short is dropped on resume)."""
    hint = getattr(args, "resume_hint", None)
    print(f"error: the disk is full: {what}\n" + (
        f"the work so far is kept: free space (a run's build/ folder can go: a resume compiles again "
        f"what it needs), then continue with `{hint}`" if hint else
        "free space, then run the command again (a sweep resumes its tasks)"), file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the process's own command line: keys out of /proc before any worker starts
        hide_from_proc()
        not_dumpable()
    args = parser().parse_args(argv)
    bad = _bad_number(args)
    if bad:
        print(f"error: {bad}", file=sys.stderr)
        return 2
    try:
        return args.fn(args)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        # An endpoint or device that was unreachable: a resume asks again (a proposer's
        # verdict on a skeleton, by contrast, is on disk and a resume would repeat it).
        hint = getattr(args, "resume_hint", None) if isinstance(e, (LLMError, BackendUnavailable)) else None
        if hint and hint not in str(e):
            print(f"the work so far is kept: once that is fixed, continue with `{hint}`", file=sys.stderr)
        return 2
    except WorkerError as e:
        last = str(e).strip().splitlines()[-1] if str(e).strip() else "worker error"
        if any(m in str(e) for m in ("[Errno 28]", "[Errno 122]")):  # ENOSPC, EDQUOT: not a bug to trace
            return _disk_full(args, next(x for x in str(e).splitlines()[::-1] if "[Errno" in x).strip())
        print(f"error: a worker failed: {last}\n(full traceback in the run's workers.log and below)\n{e}",
              file=sys.stderr)
        return 1
    except BrokenPipeError:  # before OSError, which it is
        # The reader went away (`tuner show --json | head`): not an error of this command. The
        # interpreter's own flush at exit would raise again; stdout goes nowhere from here.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            return _disk_full(args, str(e))
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):  # a read-only place: say which
            print(f"error: cannot write {e.filename or 'a file'}: {e.strerror}; pick a place this user "
                  f"can write (--db, --runs-dir, --out)", file=sys.stderr)
            return 2
        raise
    except WorkerFailure as e:
        print(f"error: a worker failed outside any candidate ({e.reason}); see the run's workers.log",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # The exact command: a user who pressed Ctrl-C has not seen the run's path yet.
        hint = getattr(args, "resume_hint", None)
        print("interrupted" + (f"; continue with `{hint}`" if hint else ""), file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

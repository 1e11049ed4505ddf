"""Proposers: who writes the skeleton that a round searches.

* `library` (the offline default): the skeletons shipped in `kernel_templates/` + `spaces/`.
  No network, one round; an op without a library skeleton needs `--template/--space`.
* `openai`: a model behind any OpenAI-compatible endpoint writes the skeleton in round 1 and
  revises it from the last round's Feedback in later rounds. With `candidates` > 1 it asks for
  that many replies at once; every one is checked and the fastest verified one is kept.

Every reply goes through generate -> check -> compile -> run -> fix: the space and template are
extracted from the fenced blocks; the space is parsed and validated (`parse_space`); the
template is parsed, its default config rendered, and a set of configs that covers every param
value rendered and checked statically (`codecheck`: allowed includes/imports, no forbidden
calls, no torch fallback); then the default and a few random configs are compiled, verified
and timed by a real Evaluator. Any rejection goes back to the model as a repair request that
names the error, the offending line and the config, up to `repairs` times per candidate.
Every call, verdict and validation record is kept (transcripts in `llm/`, verdicts in the
round's `proposal.json`).
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from tuner import codecheck
from tuner.backends import get_backend
from tuner.core.settings import Settings
from tuner.core.skeleton import Skeleton, SkeletonError, library_skeleton, template_line
from tuner.core.space import Param, Space, SpaceError, parse_space
from tuner.core.values import Config, OpSpec, Record, Status
from tuner.exec.evaluate import Evaluator
from tuner.llm.client import ChatClient, LLMBudgetExhausted, LLMConfig
from tuner.llm.feedback import Feedback
from tuner.llm.feedback import render as render_feedback
from tuner.llm.prompt import PROMPT_VERSION, PromptKit, prompts_dir, prompts_hash, space_yaml

MAX_COVER = 48  # configs rendered and checked statically per candidate
_FAIL = {Status.COMPILE_ERROR, Status.RUNTIME_ERROR, Status.WRONG_RESULT, Status.SUSPECT}
_KIND = {Status.COMPILE_ERROR: "compile error", Status.COMPILE_TIMEOUT: "compile timeout",
         Status.RUNTIME_ERROR: "runtime error", Status.RUN_TIMEOUT: "the kernel hung",
         Status.WRONG_RESULT: "wrong result", Status.SUSPECT: "suspect result",
         Status.INFRA_ERROR: "the machine failed under it"}


class Rejection(Exception):
    """Why one reply's skeleton cannot be used, precise enough for the model to fix it."""

    def __init__(self, kind: str, message: str, line: int = 0, text: str = "", where: str = "",
                 config: Config | None = None, records: tuple[Record, ...] = (),
                 template: str = ""):
        super().__init__(f"{kind}: {message}")
        self.kind, self.message, self.line, self.text, self.where = kind, message, line, text, where
        self.config, self.records = config, records
        # A line of the rendered source, traced back to the template line that wrote it.
        self.template_line, self.template_text = (
            template_line(template, text) if template and where == "rendered source" else (0, ""))

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "line": self.line, "text": self.text,
                "where": self.where, "template_line": self.template_line,
                "template_text": self.template_text,
                "config": self.config.to_json() if self.config else None,
                "records": [r.to_json() for r in self.records]}


@dataclass
class RoundContext:
    spec: OpSpec
    backend: str
    settings: Settings
    rundir: Path  # the run's directory (validation builds go under validate/)
    round: int = 1
    budget: int = 40  # the round's search budget (the prompt mentions it)
    seed: int = 0
    # Builds the Evaluator that checks replies (the Evaluator signature): the round's own
    # workers, so that checks and the search after them share warm processes.
    make_evaluator: Any = None
    language: str | None = None  # the backend's language where it compiles several (cuda: "cuda")

    def backend_language(self) -> str:
        return get_backend(self.backend, **({"language": self.language} if self.language else {})).language


@dataclass
class Proposal:
    skeleton: Skeleton | None
    space_text: str = ""
    records: list[Record] = field(default_factory=list)  # the chosen skeleton's validation records
    report: dict[str, Any] = field(default_factory=dict)
    error: str = ""


class Proposer:
    kind = ""

    def propose(self, ctx: RoundContext) -> Proposal:
        raise NotImplementedError

    def revise(self, ctx: RoundContext, skeleton: Skeleton, space_text: str,
               feedback: Feedback) -> Proposal | None:
        """A revised skeleton, or None when this proposer does not revise (one round)."""
        return None

    def meta(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def close(self) -> None:
        """Stop any worker processes the proposer holds."""


class LibraryProposer(Proposer):
    kind = "library"

    def propose(self, ctx: RoundContext) -> Proposal:
        if ctx.spec.kind != "builtin":
            raise SkeletonError(f"{ctx.spec.source} has no library skeleton: configure a model "
                                "(--llm MODEL) or pass --template FILE --space FILE")
        sk = library_skeleton(ctx.spec.name, ctx.backend_language())
        return Proposal(sk, space_yaml(sk), report={"source": "library", "name": sk.name})


# ---- extracting and checking a reply ----------------------------------------------------

_FENCE_TAG = re.compile(r"[ \t]*```[ \t]*([\w+.-]*)")


def _without_reasoning(reply: str) -> str:
    """`reply` less its <think>...</think> spans; from an unclosed <think> on, kept as it is.
    One pass (a regex that looked for the end from every unclosed tag was quadratic)."""
    out, i = [], 0
    while True:
        j = reply.find("<think>", i)
        k = reply.find("</think>", j + 7) if j >= 0 else -1
        if j < 0 or k < 0:
            out.append(reply[i:])
            return "".join(out)
        out.append(reply[i:j])
        i = k + len("</think>")


def _fenced_blocks(reply: str) -> list[tuple[str, str]]:
    """(tag, body) of each ``` fenced block, read line by line (linear in the reply: a regex
    that searched ahead from every unclosed fence was quadratic). A fence line opens a block,
    the next one closes it; an unclosed last block is dropped."""
    blocks, tag, body = [], None, []
    for line in reply.splitlines(keepends=True):
        m = _FENCE_TAG.match(line)
        if tag is None:
            if m:
                tag, body = m.group(1).lower(), []
        elif m and not line.strip().strip("`"):
            blocks.append((tag, "".join(body)))
            tag = None
        else:
            body.append(line)
    return blocks


def extract(reply: str, finish_reason: str = "stop") -> tuple[str, str]:
    """(space YAML, template) from the last ```yaml block and the last other block."""
    reply = _without_reasoning(reply or "")
    blocks = _fenced_blocks(reply)
    cut = " The reply was cut off at the reply token limit: make it shorter." if finish_reason == "length" else ""
    if not blocks:
        raise Rejection("no code blocks", "the reply has no fenced code blocks. Send the space in "
                        "a ```yaml block, then the template in a ```jinja block." + cut)
    spaces = [b for t, b in blocks if t in ("yaml", "yml") or (not t and re.search(r"^params\s*:", b, re.M))]
    templates = [b for t, b in blocks if b not in spaces]
    if not spaces:
        raise Rejection("no space", "the reply has no ```yaml block with the space (a mapping with "
                        f"'params:'); it has blocks tagged {[t or '(none)' for t, _ in blocks]}." + cut)
    if not templates:
        raise Rejection("no template", "the reply has a space but no template block: send the "
                        "kernel template in a ```jinja block after the ```yaml block." + cut)
    return spaces[-1], templates[-1]


def _line_of(message: str) -> int:
    m = re.search(r":(\d+)(?::\d+)?:", message) or re.search(r"\bline (\d+)", message)
    return int(m.group(1)) if m else 0


def _text(source: str, line: int) -> str:
    lines = source.splitlines()
    return lines[line - 1] if 0 < line <= len(lines) else ""


def check_candidate(space_text: str, template: str, kit: PromptKit, rng: random.Random,
                    name: str = "") -> tuple[Skeleton, list[Config]]:
    """The skeleton and the configs to verify, or Rejection. Static: nothing is compiled."""
    try:
        space = parse_space(space_text, "space.yaml")
    except SpaceError as e:
        line = _line_of(str(e))
        raise Rejection("invalid space", str(e), line, _text(space_text, line), "space") from None
    lang = space.get_meta("language")
    if lang is None:
        space = dataclasses.replace(space, meta=tuple(sorted({**dict(space.meta), "language": kit.language}.items())))
    elif lang != kit.language:
        raise Rejection("wrong language", f"the space says language: {lang}, but the {kit.backend} "
                        f"backend compiles {kit.language}: set language: {kit.language}")
    missing = [s for s in space.sizes if s not in kit.context]
    if missing:
        raise Rejection("unknown size", f"sizes: {missing} are not sizes of this op; it has "
                        f"{[k for k, _ in kit.spec.sizes]}")
    clash = [p.name for p in space.params if p.name in kit.context]
    if clash:  # the param would hide the size (or ctype, CORES...) from the template and formulas
        raise Rejection("param named as a size", f"params {clash} have the names of what the template "
                        f"is given ({sorted(kit.context)}); rename them")
    try:
        jinja2.Environment().parse(template)
    except jinja2.TemplateSyntaxError as e:
        raise Rejection("template syntax error", e.message or str(e), e.lineno or 0,
                        _text(template, e.lineno or 0), "template") from None
    for f in codecheck.check_template(template):
        raise Rejection("forbidden template code", f.why, f.line, f.text, "template")
    sk = Skeleton(template=template, space=space, language=kit.language, name=name)
    default = space.default_config()
    why = space.check(default, kit.context, kit.limits)
    if why is not None:
        raise Rejection("invalid default", f"the default config is not valid: {why}. Set `default:` "
                        "to a config that satisfies every constraint and resource limit", config=default)
    configs = [default] + cover(space, kit, rng, exclude={default.key})
    for c in configs:
        try:
            source = sk.render(c, kit.context)
        except SkeletonError as e:
            line = _line_of(str(e))
            raise Rejection("template does not render", str(e), line, _text(template, line),
                            "template", c) from None
        findings = codecheck.check_source(kit.language, source)
        if findings:
            f = findings[0]
            more = f" ({len(findings) - 1} more: " + "; ".join(x.why for x in findings[1:4]) + ")" if len(findings) > 1 else ""
            raise Rejection("forbidden code", f.why + more, f.line, f.text, "rendered source", c,
                            template=template)
    return sk, configs


def cover(space, kit: PromptKit, rng: random.Random, exclude: set[str], tries: int = 100) -> list[Config]:
    """Valid configs such that every value of every param appears in at least one (as far as
    the constraints allow): each structural branch of the template gets rendered."""
    out: dict[str, Config] = {}
    for p in space.params:
        for v in p.values:
            if len(out) >= MAX_COVER:
                return list(out.values())
            if any(c.as_dict()[p.name] == v for c in out.values()):
                continue
            for _ in range(tries):
                d = {q.name: rng.choice(q.values) for q in space.params}
                d[p.name] = v
                c = Config.of(d)
                if c.key not in exclude and space.check(c, kit.context, kit.limits) is None:
                    out[c.key] = c
                    break
    return list(out.values())


def verify(sk: Skeleton, validator: Evaluator, configs: list[Config], n_random: int,
           rng: random.Random, phases: dict[str, float] | None = None) -> list[Record]:
    """Compile, verify and time the default and `n_random` of the other configs, all at once
    (their compiles run in parallel; timings take the device one at a time). A failure is
    reported for the first failing config in that order (the default first). `phases`, when
    given, gets the unix times at which the default's compile ended and the first config was
    timed."""
    from concurrent.futures import ThreadPoolExecutor
    picks = [configs[0]] + rng.sample(configs[1:], min(n_random, len(configs) - 1))

    def one(c: Config) -> tuple[float, Record]:
        return time.time(), validator.evaluate(c)
    with ThreadPoolExecutor(max_workers=len(picks), thread_name_prefix="verify") as pool:
        done = list(pool.map(one, picks))
    records = [rec for _, rec in done]
    if phases is not None:
        began, first = done[0]
        phases["compiled"] = began + first.build.compile_s
        timed = [rec.time for rec in records if rec.status is Status.OK]
        if timed:
            phases["first_timed"] = min(timed)
    for i, (c, rec) in enumerate(zip(picks, records)):
        if rec.status in _FAIL or (i == 0 and rec.status is not Status.OK):
            reason = rec.reason.strip() or rec.status.value
            source = sk.render(c, validator.context)
            line = _line_of(reason) if rec.status in (Status.COMPILE_ERROR, Status.RUNTIME_ERROR) else 0
            which = "the default config" if i == 0 else "a config that your space allows"
            raise Rejection(_KIND.get(rec.status, rec.status.value), f"{which} failed: {reason}",
                            line, _text(source, line), "rendered source", c, tuple(records[:i + 1]),
                            template=sk.template)
    return records


# ---- the model proposer -------------------------------------------------------------------

class LLMProposer(Proposer):
    kind = "openai"

    def __init__(self, config: LLMConfig, transcripts: str | Path, candidates: int = 1,
                 repairs: int = 3, validate_configs: int = 2, prompts: str | None = None):
        self.config, self.client = config, ChatClient(config, transcripts)
        self.candidates, self.repairs, self.validate_configs = candidates, repairs, validate_configs
        self.prompts = prompts
        self.validator: Evaluator | None = None

    def close(self) -> None:
        if self.validator is not None:
            self.validator.close()
            self.validator = None

    def _validator(self, ctx: RoundContext) -> Evaluator:
        """One Evaluator for the whole run. It also measures the device and the reference that
        the prompts describe; its compile workers start (and, where the backend allows, compile
        a first kernel) meanwhile, so that they are warm when the first reply comes."""
        if self.validator is None:
            language = ctx.backend_language()
            placeholder = Skeleton("", Space((Param("unset", (0,)),)), language, name="(none yet)")
            self.validator = (ctx.make_evaluator or Evaluator)(ctx.backend, ctx.spec, placeholder,
                                                               ctx.settings, ctx.rundir / "validate")
            self.validator.warm_up()
            self.validator.start()
        return self.validator

    def meta(self) -> dict[str, Any]:
        return openai_meta(self.config, self.candidates, self.repairs, self.validate_configs, self.prompts)

    def kit(self, ctx: RoundContext) -> PromptKit:
        v = self._validator(ctx)
        assert v.device_info is not None
        return PromptKit(ctx.spec, v.op, ctx.backend, v.backend.language, v.device_info, v.context,
                         v.limits, v.reference_s, ctx.budget, self.prompts)

    def propose(self, ctx: RoundContext) -> Proposal:
        kit = self.kit(ctx)
        return self._round(ctx, kit, kit.propose(), "", "propose")

    def revise(self, ctx: RoundContext, skeleton: Skeleton, space_text: str,
               feedback: Feedback) -> Proposal:
        kit = self.kit(ctx)
        messages = kit.revise(skeleton, space_text, render_feedback(feedback), ctx.round - 1)
        return self._round(ctx, kit, messages, skeleton.hash, "revise")

    def _round(self, ctx: RoundContext, kit: PromptKit, messages: list[dict], parent: str,
               kind: str) -> Proposal:
        r = ctx.round
        rng = random.Random(ctx.seed * 1009 + r)
        meta = {"round": r, "kind": kind, "prompt_version": PROMPT_VERSION}
        report: dict[str, Any] = {"round": r, "kind": kind, "candidates": []}
        accepted: list[tuple[float, int, Skeleton, str, list[Record]]] = []
        validator = self._validator(ctx)
        name = f"{ctx.spec.name}/{kit.language}"
        try:
            first = self.client.chat(f"r{r:02d}-{kind}", messages, n=self.candidates, meta=meta)
            for i, (text, finish) in enumerate(zip(first.texts, first.finish_reasons), 1):
                cand: dict[str, Any] = {"index": i, "attempts": []}
                report["candidates"].append(cand)
                chain, call = list(messages), first.call_id
                replied = time.time()
                for attempt in range(self.repairs + 1):
                    phases = {"reply": replied}
                    try:
                        space_text, template = extract(text, finish)
                        sk, configs = check_candidate(space_text, template, kit, rng, name)
                        phases["checked"] = time.time()
                        sk = dataclasses.replace(sk, round=r, parent=parent)
                        if sk.hash == parent:
                            raise Rejection("unchanged", f"this is the skeleton that round {r - 1} "
                                            "searched; change the template or the space as the "
                                            "feedback suggests")
                        validator.skeleton = sk
                        records = verify(sk, validator, configs, self.validate_configs, rng, phases)
                        phases["validated"] = time.time()
                    except Rejection as rej:
                        cand["attempts"].append({"call": call, "verdict": "rejected", **rej.to_json(),
                                                 "phases": _phases(phases, time.time())})
                        if attempt == self.repairs:
                            cand["error"] = f"{rej.kind}: {rej.message}"
                            break
                        chain += [{"role": "assistant", "content": text},
                                  kit.repair(rej.kind, rej.message, rej.line, rej.text, rej.where,
                                             rej.config.as_dict() if rej.config else None,
                                             attempt + 1, self.repairs, rej.template_line,
                                             rej.template_text)]
                        res = self.client.chat(f"r{r:02d}-c{i}-fix{attempt + 1}", chain, meta={**meta, "candidate": i})
                        text, finish, call = res.texts[0], res.finish_reasons[0], res.call_id
                        replied = time.time()
                        continue
                    score = min((x.seconds for x in records if x.status is Status.OK), default=float("inf"))
                    cand["attempts"].append({"call": call, "verdict": "accepted", "hash": sk.hash,
                                             "score_s": score, "records": [x.to_json() for x in records],
                                             "replied": replied, "phases": _phases(phases)})
                    accepted.append((score, i, sk, space_text, records))
                    break
        except LLMBudgetExhausted as e:
            if not accepted:
                raise
            report["note"] = f"stopped asking: {e}"
        if not accepted:
            errors = [c.get("error", "") for c in report["candidates"]]
            report["status"] = "failed"
            return Proposal(None, report=report, error=f"no valid skeleton after {self.repairs} "
                            f"repair attempts per candidate; last: {errors[-1] if errors else '?'}")
        score, i, sk, space_text, records = min(accepted, key=lambda a: (a[0], a[1]))
        chosen = report["candidates"][i - 1]["attempts"][-1]
        report.update(status="accepted", chosen=i, hash=sk.hash, score_s=score,
                      replied=chosen["replied"], phases=chosen["phases"])
        return Proposal(sk, space_text, records, report)


def _phases(times: dict[str, float], rejected: float | None = None) -> dict[str, float]:
    """Seconds from the reply to each phase it reached: checked (static checks passed),
    compiled (the default config's compile ended), first_timed (a config was timed),
    validated (every check config done); `rejected` when it was turned down."""
    t0 = times["reply"]
    out = {k: round(v - t0, 3) for k, v in times.items() if k != "reply"}
    if rejected is not None:
        out["rejected"] = round(rejected - t0, 3)
    return out


def openai_meta(config: LLMConfig, candidates: int = 1, repairs: int = 3, validate_configs: int = 2,
                prompts: str | None = None) -> dict[str, Any]:
    """What a run keeps of the model proposer (never the key); `make_proposer` reads it back."""
    return {"kind": "openai", "llm": config.public(), "candidates": candidates, "repairs": repairs,
            "validate_configs": validate_configs, "prompts": str(Path(prompts).resolve()) if prompts else None,
            "prompt_version": "custom" if prompts else PROMPT_VERSION,
            "prompt_hash": prompts_hash(prompts_dir(prompts))}


def make_proposer(meta: dict[str, Any], run_dir: str | Path, api_key: str | None = None,
                  **overrides: Any) -> Proposer:
    """The proposer a run directory names in its run.json (the key comes from the caller)."""
    if meta.get("kind", "library") == "library":
        return LibraryProposer()
    key = api_key or os.environ.get("OPENAI_API_KEY") or None
    config = LLMConfig.from_public(meta["llm"], api_key=key, **overrides)
    return LLMProposer(config, Path(run_dir) / "llm", meta.get("candidates", 1), meta.get("repairs", 3),
                       meta.get("validate_configs", 2), meta.get("prompts"))


class ProposerError(RuntimeError):
    """No usable skeleton came out of the proposer (all candidates and repairs rejected)."""

"""Chat completions against any OpenAI-compatible endpoint: a hosted API, vLLM, vllm-ascend.

`LLMConfig` says where and how (base URL, model, key, timeouts, retries, budgets), read from
flags or the environment (`TUNER_LLM_BASE_URL`, `TUNER_LLM_MODEL`, `OPENAI_API_KEY`, ...).
`ChatClient.chat(call_id, messages, n)` sends one request with the `openai` client and
retries, with exponential backoff, on 429, 5xx, timeouts, dropped connections and replies
that are not a completion (honouring Retry-After). Other statuses (401, 404, 400) are the
user's to fix and raise `LLMError` at once.

Every call is a transcript file `<dir>/<call_id>.json`: the messages sent, the replies, the
token usage and cost, and each failed attempt. The API key is never written. A call whose
transcript is already on disk (same call id: the same step of the same run) is answered from
disk, so a resumed run never asks the model twice. The token (and, where prices are set, cost) budget counts every
transcript in the folder; a call that would start past it raises `LLMBudgetExhausted`.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any


class LLMError(RuntimeError):
    """The endpoint cannot be used: a refused key, an unknown model, retries exhausted."""


class LLMBudgetExhausted(LLMError):
    """The run's token or cost budget is spent."""


ENV = {"base_url": "TUNER_LLM_BASE_URL", "model": "TUNER_LLM_MODEL", "api_key": "OPENAI_API_KEY",
       "timeout_s": "TUNER_LLM_TIMEOUT_S", "retries": "TUNER_LLM_RETRIES",
       "backoff_s": "TUNER_LLM_BACKOFF_S", "temperature": "TUNER_LLM_TEMPERATURE",
       "max_reply_tokens": "TUNER_LLM_MAX_REPLY_TOKENS", "token_budget": "TUNER_LLM_TOKEN_BUDGET",
       "price": "TUNER_LLM_PRICE", "cost_budget": "TUNER_LLM_COST_BUDGET"}


@dataclass(frozen=True)
class LLMConfig:
    model: str
    base_url: str | None = None  # None: the client's default (OPENAI_BASE_URL, else OpenAI's API)
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = 600.0  # one request; long replies from a busy server take minutes
    retries: int = 5
    backoff_s: float = 2.0  # first wait; doubles per retry, with jitter, capped at max_backoff_s
    max_backoff_s: float = 60.0
    temperature: float | None = None  # None: the server's default
    max_reply_tokens: int = 16384
    token_budget: int | None = 2_000_000  # prompt + completion tokens per run; None: no limit
    price: tuple[float, float] | None = None  # USD per million (prompt, completion) tokens
    cost_budget: float | None = None  # USD per run; needs `price`

    @classmethod
    def from_env(cls, **overrides: Any) -> "LLMConfig | None":
        """Flags (`overrides`, None meaning unset) over the environment. None when no model."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = overrides.get(f.name)
            if raw is None:
                raw = os.environ.get(ENV.get(f.name, "")) or None
            if raw is not None:
                values[f.name] = _coerce(f.name, raw)
        if not values.get("model"):
            return None
        if values.get("cost_budget") is not None and values.get("price") is None:
            raise LLMError("a cost budget needs prices: --llm-price PROMPT,COMPLETION "
                           "(USD per million tokens) or TUNER_LLM_PRICE")
        return cls(**values)

    def public(self) -> dict[str, Any]:
        """Everything but the key (and any password in the URL): what a run directory may keep."""
        d = asdict(self)
        d.pop("api_key")
        d["base_url"] = redact_url(self.base_url)
        d["price"] = list(self.price) if self.price else None
        return d

    @classmethod
    def from_public(cls, data: dict[str, Any], **overrides: Any) -> "LLMConfig":
        known = {f.name for f in fields(cls)}
        values = {k: _coerce(k, v) for k, v in data.items() if k in known and v is not None}
        values.update({k: _coerce(k, v) for k, v in overrides.items() if v is not None})
        return cls(**values)


def redact_url(url: str | None) -> str | None:
    return re.sub(r"//[^/@]*@", "//***@", url) if url else url


def _coerce(name: str, raw: Any) -> Any:
    if name == "price":
        if isinstance(raw, (list, tuple)):
            return (float(raw[0]), float(raw[1]))
        try:
            a, b = str(raw).split(",")
            return (float(a), float(b))
        except ValueError:
            raise LLMError(f"price {raw!r}: expected PROMPT,COMPLETION in USD per million "
                           "tokens, e.g. 3,15") from None
    kind = {"timeout_s": float, "retries": int, "backoff_s": float, "max_backoff_s": float,
            "temperature": float, "max_reply_tokens": int, "token_budget": int,
            "cost_budget": float}.get(name)
    if kind is None or not isinstance(raw, str):
        return raw
    try:
        return kind(raw)
    except ValueError:
        raise LLMError(f"{ENV.get(name, name)}={raw!r} is not a valid {kind.__name__}") from None


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0
    cost_usd: float = 0.0
    estimated: bool = False  # some replies carried no usage; counted from characters

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def add(self, u: dict[str, Any]) -> None:
        self.prompt_tokens += int(u.get("prompt_tokens", 0))
        self.completion_tokens += int(u.get("completion_tokens", 0))
        self.cost_usd += float(u.get("cost_usd") or 0.0)
        self.calls += 1
        self.estimated = self.estimated or bool(u.get("estimated"))

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "total_tokens": self.total}


@dataclass(frozen=True)
class ChatResult:
    call_id: str
    texts: tuple[str, ...]
    finish_reasons: tuple[str, ...]
    usage: dict[str, Any]
    reused: bool = False  # answered from a transcript already on disk
    request_changed: bool = False  # ... whose request differed from this one


def request_hash(messages: list[dict], n: int, model: str) -> str:
    data = json.dumps({"messages": messages, "n": n, "model": model}, sort_keys=True)
    return hashlib.sha256(data.encode()).hexdigest()[:16]


class ChatClient:
    def __init__(self, config: LLMConfig, transcript_dir: str | Path):
        self.config = config
        self.dir = Path(transcript_dir)
        self._client = None
        self._use_max_tokens = False  # servers that predate max_completion_tokens
        # Told of each failed attempt before the wait: with the default retries a dead endpoint
        # took 80 s of backoff, and the user saw nothing after "asking ... for a skeleton".
        self.notify = lambda text: print(text, file=sys.stderr, flush=True)

    def _openai(self):
        if self._client is None:
            try:
                import openai
            except ImportError:
                raise LLMError("the openai proposer needs the openai package: "
                               "pip install 'tuner[llm]'") from None
            # A local vLLM server accepts any key; hosted APIs answer 401 without one.
            self._client = openai.OpenAI(base_url=self.config.base_url,
                                         api_key=self.config.api_key or "none",
                                         timeout=self.config.timeout_s, max_retries=0)
        return self._client

    # ---- budget ----------------------------------------------------------------------------

    def usage(self, prefix: str = "") -> Usage:
        return transcript_usage(self.dir, prefix)

    def check_budget(self) -> None:
        used, c = self.usage(), self.config
        if c.token_budget is not None and used.total >= c.token_budget:
            raise LLMBudgetExhausted(f"the token budget is spent: {used.total} of {c.token_budget} "
                                     f"tokens in {used.calls} calls")
        if c.cost_budget is not None and used.cost_usd >= c.cost_budget:
            raise LLMBudgetExhausted(f"the cost budget is spent: ${used.cost_usd:.4f} of "
                                     f"${c.cost_budget:.4f} in {used.calls} calls")

    # ---- one call --------------------------------------------------------------------------

    def chat(self, call_id: str, messages: list[dict], n: int = 1,
             meta: dict[str, Any] | None = None) -> ChatResult:
        path = self.dir / f"{call_id}.json"
        digest = request_hash(messages, n, self.config.model)
        old = _read(path)
        if old is not None and "replies" in old:
            # The same step of the same run: its reply stands, even where incidental figures
            # of the request (an error's numbers) came out differently this time.
            return ChatResult(call_id, tuple(r["content"] for r in old["replies"]),
                              tuple(r.get("finish_reason") or "" for r in old["replies"]),
                              old["usage"], reused=True, request_changed=old.get("request_hash") != digest)
        self.check_budget()
        attempts: list[dict[str, Any]] = []
        started = time.time()
        for attempt in range(self.config.retries + 1):
            try:
                resp = self._create(messages, n)
                texts, reasons, usage = self._parse(resp, messages)
                break
            except _Retry as r:
                attempts.append({"error": r.reason, "time": time.time()})
                if attempt == self.config.retries:
                    self._write(path, call_id, digest, messages, n, meta, None, attempts, started)
                    raise LLMError(f"{self._where()}: no usable reply after {attempt + 1} attempts; "
                                   f"last: {r.reason}") from None
                wait = r.wait if r.wait is not None else min(
                    self.config.max_backoff_s, self.config.backoff_s * 2**attempt)
                wait = min(wait, self.config.max_backoff_s) * (1 + 0.25 * random.random())
                attempts[-1]["wait_s"] = round(wait, 3)
                self.notify(f"{self._where()}: {r.reason}; attempt {attempt + 2} of "
                            f"{self.config.retries + 1} in {wait:.0f} s")
                time.sleep(wait)
        replies = [{"content": t, "finish_reason": f} for t, f in zip(texts, reasons)]
        self._write(path, call_id, digest, messages, n, meta, replies, attempts, started, usage)
        return ChatResult(call_id, tuple(texts), tuple(reasons), usage)

    def _where(self) -> str:
        return f"{redact_url(self.config.base_url) or 'the default OpenAI endpoint'} (model {self.config.model})"

    def _create(self, messages: list[dict], n: int):
        import openai
        c = self.config
        kwargs: dict[str, Any] = {"model": c.model, "messages": messages}
        if n > 1:
            kwargs["n"] = n
        if c.temperature is not None:
            kwargs["temperature"] = c.temperature
        kwargs["max_tokens" if self._use_max_tokens else "max_completion_tokens"] = c.max_reply_tokens
        try:
            return self._openai().chat.completions.create(**kwargs)
        except openai.APIStatusError as e:
            status = e.status_code
            body = _excerpt(getattr(e, "message", "") or str(e))
            # 501 and 505 say the server does not do this request at all: no retry mends that.
            if status == 429 or (status >= 500 and status not in (501, 505)) or status in (408, 409):
                raise _Retry(f"HTTP {status}: {body}", _retry_after(e)) from None
            if status == 400 and "max_completion_tokens" in body and not self._use_max_tokens:
                self._use_max_tokens = True
                raise _Retry(f"HTTP 400: {body}; retrying with max_tokens", 0.0) from None
            hint = {401: "the endpoint refused the key: set OPENAI_API_KEY or --llm-api-key",
                    403: "the key may not use this model or endpoint",
                    404: "check --llm-base-url (it usually ends in /v1) and the model name",
                    501: "the server does not implement this request: is --llm-base-url an "
                         "OpenAI-compatible endpoint (it usually ends in /v1)?"}.get(status, "")
            if c.api_key and len(c.api_key) >= 8:
                body = body.replace(c.api_key, "***")
            raise LLMError(f"{self._where()} answered HTTP {status}: {body}"
                           + (f" ({hint})" if hint else "")) from None
        except openai.APITimeoutError:
            raise _Retry(f"no reply within {c.timeout_s:g} s", None) from None
        except openai.APIConnectionError as e:
            raise _Retry(f"connection failed: {_excerpt(str(e.__cause__ or e))}", None) from None
        except (ValueError, openai.APIResponseValidationError) as e:  # a body that is not JSON
            raise _Retry(f"malformed response: {_excerpt(str(e))}", None) from None

    def _parse(self, resp: Any, messages: list[dict]) -> tuple[list[str], list[str], dict[str, Any]]:
        choices = getattr(resp, "choices", None)
        if not isinstance(choices, list) or not choices:
            raise _Retry(f"malformed response: no choices in {_excerpt(repr(resp))}", None)
        texts = [(getattr(getattr(ch, "message", None), "content", None) or "") for ch in choices]
        reasons = [str(getattr(ch, "finish_reason", "") or "") for ch in choices]
        u = getattr(resp, "usage", None)
        if u is not None and getattr(u, "prompt_tokens", None) is not None:
            usage: dict[str, Any] = {"prompt_tokens": int(u.prompt_tokens),
                                     "completion_tokens": int(u.completion_tokens or 0)}
        else:  # no usage in the reply: estimate from characters, and say so
            usage = {"prompt_tokens": sum(len(m.get("content") or "") for m in messages) // 4,
                     "completion_tokens": sum(len(t) for t in texts) // 4, "estimated": True}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        if self.config.price:
            p_in, p_out = self.config.price
            usage["cost_usd"] = round((usage["prompt_tokens"] * p_in
                                       + usage["completion_tokens"] * p_out) / 1e6, 6)
        return texts, reasons, usage

    def _write(self, path: Path, call_id: str, digest: str, messages: list[dict], n: int,
               meta: dict | None, replies: list[dict] | None, attempts: list[dict],
               started: float, usage: dict | None = None) -> None:
        c = self.config
        data: dict[str, Any] = {
            "id": call_id, **(meta or {}), "model": c.model, "base_url": redact_url(c.base_url),
            "request": {"messages": messages, "n": n, "temperature": c.temperature,
                        "max_reply_tokens": c.max_reply_tokens},
            "request_hash": digest, "failed_attempts": attempts,
            "started": started, "elapsed_s": round(time.time() - started, 3)}
        if replies is not None:
            data["replies"], data["usage"] = replies, usage
        else:
            data["error"] = attempts[-1]["error"] if attempts else "no reply"
            path = path.with_name(f"{call_id}.failed-{int(started)}.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(data, indent=1)
        if c.api_key and len(c.api_key) >= 8:  # an error message that echoes the key
            text = text.replace(c.api_key, "***")
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


def transcript_usage(directory: str | Path, prefix: str = "") -> Usage:
    """What the transcripts in a folder (those whose call id starts with `prefix`) spent."""
    total = Usage()
    for p in sorted(Path(directory).glob(f"{prefix}*.json")):
        data = _read(p)
        if data is not None and "usage" in data:
            total.add(data["usage"])
    return total


class _Retry(Exception):
    def __init__(self, reason: str, wait: float | None):
        super().__init__(reason)
        self.reason, self.wait = reason, wait


def _retry_after(e: Any) -> float | None:
    headers = getattr(getattr(e, "response", None), "headers", None) or {}
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        try:
            return float(headers.get(name)) * scale
        except (TypeError, ValueError):
            continue
    return None


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _excerpt(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "…"

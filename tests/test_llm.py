"""The chat client against a real OpenAI-compatible HTTP server on 127.0.0.1 (tests/llm_server.py),
through the real `openai` client and wire format: usage, retries, budgets, transcripts."""

import json
import time

import pytest

from tests.llm_server import ScriptedServer
from tuner.llm.client import ChatClient, LLMBudgetExhausted, LLMConfig, LLMError, transcript_usage

KEY = "sk-test-key-DO-NOT-WRITE"
MSG = [{"role": "system", "content": "You write kernels."}, {"role": "user", "content": "softmax please"}]


@pytest.fixture(autouse=True)
def local_only(monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    for k in ("TUNER_LLM_MODEL", "TUNER_LLM_BASE_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(k, raising=False)


def client(srv, tmp_path, **kw) -> ChatClient:
    cfg = dict(model="coder", base_url=srv.base_url, api_key=KEY, timeout_s=5, retries=3,
               backoff_s=0.01, max_backoff_s=0.05)
    cfg.update(kw)
    return ChatClient(LLMConfig(**cfg), tmp_path / "llm")


def test_reply_usage_and_transcript(tmp_path):
    with ScriptedServer([{"reply": "hello", "usage": {"prompt_tokens": 120, "completion_tokens": 30}}]) as srv:
        res = client(srv, tmp_path, price=(2.0, 10.0), temperature=0.2).chat("r01-propose", MSG, meta={"round": 1})
        req = srv.chat_requests()[0]
    assert res.texts == ("hello",) and res.finish_reasons == ("stop",) and not res.reused
    assert res.usage["prompt_tokens"] == 120 and res.usage["completion_tokens"] == 30
    assert res.usage["cost_usd"] == pytest.approx((120 * 2 + 30 * 10) / 1e6)
    # The wire: the model, the messages, the key as a bearer token, a reply limit.
    assert req["json"]["model"] == "coder" and req["json"]["messages"] == MSG
    assert req["json"]["temperature"] == 0.2 and req["json"]["max_completion_tokens"] == 16384
    assert {k.lower(): v for k, v in req["headers"].items()}["authorization"] == f"Bearer {KEY}"
    data = json.loads((tmp_path / "llm" / "r01-propose.json").read_text())
    assert data["request"]["messages"] == MSG and data["replies"][0]["content"] == "hello"
    assert data["round"] == 1 and data["usage"]["total_tokens"] == 150
    assert KEY not in (tmp_path / "llm" / "r01-propose.json").read_text()


def test_retries_429_5xx_timeouts_and_garbage(tmp_path):
    steps = [{"status": 429, "headers": {"retry-after": "0.05"}}, {"status": 500}, {"status": 503},
             {"raw": "<html>bad gateway</html>"}, {"raw": '{"object": "nothing"}'},
             {"delay": 1.5, "reply": "too late"}, {"reply": "finally"}]
    with ScriptedServer(steps) as srv:
        t0 = time.monotonic()
        res = client(srv, tmp_path, retries=6, timeout_s=0.5).chat("c", MSG)
        assert time.monotonic() - t0 < 10
        assert len(srv.chat_requests()) == 7
    assert res.texts == ("finally",)
    errors = [a["error"] for a in json.loads((tmp_path / "llm" / "c.json").read_text())["failed_attempts"]]
    assert errors[0].startswith("HTTP 429") and errors[1].startswith("HTTP 500")
    assert "malformed" in errors[3] and "malformed" in errors[4] and "no reply within" in errors[5]


def test_retries_exhausted_is_a_clear_error(tmp_path, capsys):
    with ScriptedServer([{"status": 502}] * 3) as srv:
        with pytest.raises(LLMError, match="no usable reply after 3 attempts; last: HTTP 502"):
            client(srv, tmp_path, retries=2).chat("c", MSG)
    err = capsys.readouterr().err  # each wait is announced: a dead endpoint is not silence
    assert "HTTP 502" in err and "attempt 2 of 3" in err and "attempt 3 of 3" in err
    assert not (tmp_path / "llm" / "c.json").exists()  # no reply: the step is asked again later
    assert list((tmp_path / "llm").glob("c.failed-*.json"))


def test_auth_error_is_not_retried(tmp_path):
    with ScriptedServer([{"status": 401, "message": f"invalid api key {KEY}"}]) as srv:
        with pytest.raises(LLMError, match=r"401.*invalid api key \*\*\*.*OPENAI_API_KEY") as e:
            client(srv, tmp_path, base_url=srv.base_url.replace("//", "//user:pw@")).chat("c", MSG)
        assert len(srv.chat_requests()) == 1
    assert KEY not in str(e.value) and "pw@" not in str(e.value)


def test_a_server_that_does_not_implement_the_request_is_not_retried(tmp_path):
    """501 (a plain web server at --llm-base-url) was retried six times over a minute."""
    with ScriptedServer([{"status": 501}, {"status": 501}]) as srv:
        with pytest.raises(LLMError, match=r"HTTP 501.*OpenAI-compatible endpoint"):
            client(srv, tmp_path).chat("c", MSG)
        assert len(srv.chat_requests()) == 1


def test_old_servers_get_max_tokens(tmp_path):
    steps = [{"status": 400, "message": "Unrecognized request argument: max_completion_tokens"},
             {"reply": "ok"}]
    with ScriptedServer(steps) as srv:
        assert client(srv, tmp_path).chat("c", MSG).texts == ("ok",)
        assert "max_tokens" in srv.chat_requests()[1]["json"]
        assert "max_completion_tokens" not in srv.chat_requests()[1]["json"]


def test_reply_on_disk_is_never_asked_again(tmp_path):
    with ScriptedServer([{"reply": "first"}]) as srv:
        c = client(srv, tmp_path)
        c.chat("r01-propose", MSG)
        again = client(srv, tmp_path).chat("r01-propose", MSG)
        changed = client(srv, tmp_path).chat("r01-propose", MSG + [{"role": "user", "content": "x"}])
        assert len(srv.chat_requests()) == 1
    assert again.reused and again.texts == ("first",) and not again.request_changed
    assert changed.reused and changed.request_changed


def test_token_and_cost_budgets(tmp_path):
    steps = [{"reply": "a", "usage": {"prompt_tokens": 900, "completion_tokens": 200}}]
    with ScriptedServer(steps) as srv:
        c = client(srv, tmp_path, token_budget=1000, price=(1000.0, 1000.0))
        assert c.chat("one", MSG).usage["cost_usd"] == pytest.approx(1.1)
        with pytest.raises(LLMBudgetExhausted, match="1100 of 1000 tokens in 1 calls"):
            c.chat("two", MSG)
        c2 = client(srv, tmp_path, token_budget=None, price=(1000.0, 1000.0), cost_budget=1.0)
        with pytest.raises(LLMBudgetExhausted, match=r"cost budget is spent: \$1.1000 of \$1.0000"):
            c2.chat("three", MSG)
        assert len(srv.chat_requests()) == 1
    assert transcript_usage(tmp_path / "llm").total == 1100


def test_n_choices_and_missing_usage(tmp_path):
    with ScriptedServer([{"reply": ["one", "two"], "no_usage": True, "finish_reason": "length"}]) as srv:
        res = client(srv, tmp_path).chat("c", MSG, n=2)
        assert srv.chat_requests()[0]["json"]["n"] == 2
    assert res.texts == ("one", "two") and res.finish_reasons == ("length", "length")
    assert res.usage["estimated"] and res.usage["prompt_tokens"] > 0


def test_config_from_flags_and_environment(monkeypatch):
    assert LLMConfig.from_env() is None  # no model: the library proposer
    monkeypatch.setenv("TUNER_LLM_MODEL", "env-model")
    monkeypatch.setenv("TUNER_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("TUNER_LLM_PRICE", "3,15")
    cfg = LLMConfig.from_env(model="flag-model", token_budget=None)
    assert cfg.model == "flag-model" and cfg.base_url == "http://127.0.0.1:9/v1" and cfg.api_key == KEY
    assert cfg.price == (3.0, 15.0)
    assert KEY not in json.dumps(cfg.public()) and KEY not in repr(cfg)
    assert LLMConfig.from_public(cfg.public()).model == "flag-model"
    monkeypatch.delenv("TUNER_LLM_PRICE")
    with pytest.raises(LLMError, match="cost budget needs prices"):
        LLMConfig.from_env(model="m", cost_budget="1")
    monkeypatch.setenv("TUNER_LLM_TOKEN_BUDGET", "many")
    with pytest.raises(LLMError, match="TUNER_LLM_TOKEN_BUDGET='many'"):
        LLMConfig.from_env()

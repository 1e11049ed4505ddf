"""The model loop end to end: `tuner tune --llm` against a scripted OpenAI-compatible server on
127.0.0.1, through propose -> check -> compile -> run -> repair -> search -> feedback -> revise."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, ROOT
from tests.llm_server import ScriptedServer
from tuner.cli.argv import redacted_argv
from tuner.cli.main import main
from tuner.core.values import Status
from tuner.run.store import Store

KEY = "sk-loop-test-NEVER-ON-DISK"


def space(bm="[16, 64]", extra=""):
    return f"""```yaml
language: script
sizes: [M, N]
params:
  BM: {{pow2: {bm}}}
  W: [1, 2, 4]
constraints:
  - BM <= M{extra}
resources:
  smem_bytes: BM * W * 256
default: {{BM: 32, W: 2}}
```
"""


def template(center=60, slow=0.0, fault=""):
    # Scripted times stay above a tenth of the null device's reference (1 ms), so that no
    # config needs the extra re-verification that a suspiciously fast one gets.
    return ("```jinja\n"
            f"time: {{{{ {2e-4 + slow} + 1e-8 * (BM - {center}) * (BM - {center}) + 1e-5 * W }}}}\n"
            + fault + "```\n")


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_BENCH_BUDGET_S", "0.003")
    monkeypatch.setenv("TUNER_MAX_REPS", "10")
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    for k in ("TUNER_LLM_MODEL", "TUNER_LLM_BASE_URL", "OPENAI_BASE_URL"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    return tmp_path


def only_run(runs: Path) -> Path:
    dirs = [p for p in runs.iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def no_key_on_disk(run: Path) -> None:
    for p in run.rglob("*"):
        if p.is_file():
            assert KEY.encode() not in p.read_bytes(), f"the API key was written to {p}"


def last_user(req) -> str:
    return req["json"]["messages"][-1]["content"]


def test_two_rounds_with_candidates_repairs_and_feedback(env, capsys):
    wrong = "{% if BM == 32 %}\nfault: wrong\n{% endif %}\n"
    steps = [
        # round 1, two candidates in one request
        {"reply": ["Sure! A fast kernel is easy.", space(extra="\n  - BM <= Q") + template()]},
        {"reply": space() + template(slow=1e-2, fault=wrong)},  # candidate 1, repair 1: wrong default
        {"reply": space() + template(slow=1e-2)},               # candidate 1, repair 2: valid, slow
        {"reply": space() + template()},                        # candidate 2, repair 1: valid, fast
        # round 2: round 1's skeleton unchanged (rejected), and a slow twin of the revision
        {"reply": [space() + template(), space("[16, 256]") + template(128, 1e-2)]},
        {"reply": space("[16, 256]") + template(center=128)},  # candidate 1, repair 1: the revision
    ]
    runs = env / "runs"
    with ScriptedServer(steps) as srv:
        rc = main(["tune", "softmax", "--shape", "256x64", "--backend", "null", "--llm", "coder",
                   "--llm-base-url", srv.base_url, "--rounds", "2", "--candidates", "2", "--budget", "8",
                   "--validate-configs", "1", "--sampler", "random", "--seed", "5", "--parallel", "2",
                   "--runs-dir", str(runs),
                   "--quiet"])
        reqs = srv.chat_requests()
    assert rc == 0
    run = only_run(runs)
    assert len(reqs) == 6 and [r["json"].get("n", 1) for r in reqs] == [2, 1, 1, 1, 2, 1]
    assert all({k.lower(): v for k, v in r["headers"].items()}["authorization"] == f"Bearer {KEY}" for r in reqs)
    assert "no fenced code blocks" in last_user(reqs[1])
    assert "rejected: wrong result" in last_user(reqs[2]) and "Configuration: BM=32 W=2" in last_user(reqs[2])
    assert "invalid space" in last_user(reqs[3]) and "BM <= Q" in last_user(reqs[3])
    revise = last_user(reqs[4])
    assert "What the search found" in revise and "BM=64 is the largest value of [16 .. 64]" in revise
    assert "BM: {pow2: [16, 64]}" in revise and "Best configs" in revise
    assert "rejected: unchanged" in last_user(reqs[5])

    p1 = json.loads((run / "rounds/01/proposal.json").read_text())
    assert p1["chosen"] == 2 and [len(c["attempts"]) for c in p1["candidates"]] == [3, 2]
    assert len(p1["candidates"][1]["attempts"][1]["records"]) == 2  # the default and one random config
    assert [a["verdict"] for a in p1["candidates"][0]["attempts"]] == ["rejected", "rejected", "accepted"]
    assert p1["candidates"][0]["attempts"][1]["kind"] == "wrong result"

    summary = json.loads((run / "summary.json").read_text())
    assert summary["winner_round"] == 2 and summary["best"]["config"] == {"BM": 128, "W": 1}
    r1, r2 = summary["rounds"]
    assert [x["hash"] for x in summary["lineage"]] == [r1["hash"], r2["hash"]] and r2["parent"] == r1["hash"]
    assert json.loads((run / "rounds/02/proposal.json").read_text())["chosen"] == 1
    transcripts = sorted(p.name for p in (run / "llm").glob("*.json"))
    assert transcripts == ["r01-c1-fix1.json", "r01-c1-fix2.json", "r01-c2-fix1.json", "r01-propose.json",
                           "r02-c1-fix1.json", "r02-revise.json"]
    used = sum(json.loads((run / "llm" / t).read_text())["usage"]["total_tokens"] for t in transcripts)
    assert summary["llm"]["total_tokens"] == used > 0 and summary["llm"]["calls"] == 6
    assert r1["tokens"]["calls"] == 4 and r2["tokens"]["calls"] == 2

    # Round 2 was warm-started with round 1's best configs, which fit its wider space.
    r2_records = Store(run / "rounds/02").records()
    # Asked among the first few (trial numbers follow ask order; records follow completion order,
    # which parallel evaluations make vary).
    asked_early = [r.config.as_dict() for r in r2_records if 0 <= r.trial < 4]
    assert {"BM": 64, "W": 1} in asked_early
    # The checks' evaluations are part of each round's records; nothing ran twice.
    keys = [r.config.key for r in r2_records]
    assert len(keys) == len(set(keys))
    for r in ("01", "02"):
        fb = json.loads((run / f"rounds/{r}/feedback.json").read_text())
        assert fb["best"] and (run / f"rounds/{r}/skeleton/space.yaml").is_file()
    assert json.loads((run / "rounds/01/feedback.json").read_text())["invalid"] > 0  # smem_bytes > limit
    no_key_on_disk(run)

    capsys.readouterr()
    assert main(["show", str(run)]) == 0
    out = capsys.readouterr().out
    assert "rounds" in out and "2 *" in out and "6 model calls" in out
    assert main(["show", str(run), "--feedback"]) == 0
    out = capsys.readouterr().out
    assert "== round 01" in out and "== round 02" in out and "Best configs" in out
    assert main(["export", str(run), "--out", str(env / "exp")]) == 0
    # A round is a run directory of its own; its feedback is computed again from its records.
    capsys.readouterr()
    assert main(["show", str(run / "rounds/01"), "--feedback"]) == 0
    assert capsys.readouterr().out.strip() == (run / "rounds/01/feedback.txt").read_text().strip()
    # The report: each round's skeleton (round 2 as a diff from round 1) and what the model was told.
    import html
    import re
    # As a reader sees it: the diff marks changed characters with spans and spaces as &nbsp;.
    page = re.sub(r"<[^>]+>", "", html.unescape(Path(summary["report"]).read_text())).replace("\xa0", " ")
    assert Path(summary["report"]) == run / "report.html" and (run / "rounds/02/report.html").is_file()
    assert "Round 01" in page and "Round 02" in page and "changed from the round before" in page
    assert "What the model was told after this round" in page and "Best configs" in page
    assert "BM: {pow2: [16, 256]}" in page and "BM: {pow2: [16, 64]}" in page  # both sides of the diff


def test_problem_file_without_library_skeleton_on_cpu(env, capsys):
    """A KernelBench op becomes tunable once a model is configured; forbidden code and compile
    errors go back as repairs; the token budget stops the loop after round 1."""
    c_space = """```yaml
language: c
sizes: [batch_size, dim]
params:
  CHUNK: {pow2: [256, 4096]}
  THREADS: [1, 2]
constraints:
  - THREADS <= CORES
default: {CHUNK: 1024, THREADS: 1}
```
"""
    body = """void tuner_kernel(const {{ ctype }} *in0, {{ ctype }} *out0) {
    const long n = (long){{ batch_size }} * {{ dim }};
    #pragma omp parallel for num_threads({{ THREADS }}) schedule(static)
    for (long c = 0; c < n; c += {{ CHUNK }}) {
        long end = c + {{ CHUNK }} < n ? c + {{ CHUNK }} : n;
        for (long i = c; i < end; i++) out0[i] = in0[i] > 0 ? in0[i] : 0;
    }
}
"""
    usage = {"prompt_tokens": 900, "completion_tokens": 100}
    steps = [
        {"reply": c_space + "```jinja\n#include <stdio.h>\n" + body + "```", "usage": usage},
        {"reply": c_space + "```jinja\n" + body.replace("out0[i] =", "out0[i] = undeclared_thing +") + "```",
         "usage": usage},
        {"reply": c_space + "```jinja\n" + body + "```", "usage": {"prompt_tokens": 5000, "completion_tokens": 500}},
    ]
    runs = env / "runs"
    with ScriptedServer(steps) as srv:
        rc = main(["tune", "--op", str(FIXTURES / "kernelbench/relu.py"), "--size", "batch_size=4",
                   "--size", "dim=1024", "--backend", "cpu", "--llm", "coder", "--llm-base-url", srv.base_url,
                   "--rounds", "2", "--budget", "3", "--token-budget", "6000", "--validate-configs", "1",
                   "--runs-dir", str(runs), "--quiet"])
        reqs = srv.chat_requests()
    assert rc == 0 and len(reqs) == 3
    first = reqs[0]["json"]["messages"][1]["content"]
    assert "class Model" in first and "void tuner_kernel(const float *in0, float *out0)" in first
    assert "#include <stdio.h>" in last_user(reqs[1]) and "Offending line 1" in last_user(reqs[1])
    assert "compile error" in last_user(reqs[2]) and "undeclared_thing" in last_user(reqs[2])
    # The compiler's line in the rendered source, traced back to the template's own line.
    assert "It comes from line 6 of your template:\n\n            for (long i = c;" in last_user(reqs[2])
    run = only_run(runs)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best"] is not None and len(summary["rounds"]) == 1
    assert "token budget is spent" in summary["stopped"]
    assert "token budget" in capsys.readouterr().err
    no_key_on_disk(run)


def test_no_valid_skeleton_is_a_clear_error_with_everything_kept(env, capsys):
    runs = env / "runs"
    with ScriptedServer([{"reply": "no idea"}, {"reply": "still no idea"}]) as srv:
        rc = main(["tune", "softmax", "--shape", "64x128", "--backend", "null", "--llm", "coder",
                   "--llm-base-url", srv.base_url, "--repairs", "1", "--runs-dir", str(runs), "--quiet"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "no valid skeleton after 1 repair attempts" in err and "no code blocks" in err and "transcripts in" in err
    run = only_run(runs)
    assert json.loads((run / "rounds/01/proposal.json").read_text())["status"] == "failed"
    assert len(list((run / "llm").glob("r01-*.json"))) == 2
    # Resuming does not ask again: the verdict is on disk.
    assert main(["tune", "--resume", str(run), "--quiet"]) == 2
    assert "no valid skeleton" in capsys.readouterr().err and len(srv.chat_requests()) == 2


def test_an_unreachable_endpoint_mid_run_names_the_resume(env, capsys, monkeypatch):
    monkeypatch.setenv("TUNER_LLM_RETRIES", "0")
    runs = env / "runs"
    with ScriptedServer([]) as srv:
        url = srv.base_url
    rc = main(["tune", "softmax", "--shape", "64x128", "--backend", "null", "--llm", "coder",
               "--llm-base-url", url, "--runs-dir", str(runs), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "connection failed" in err
    assert f"once that is fixed, continue with `tuner tune --resume {only_run(runs)}`" in err


def test_patience_reaches_each_rounds_search(env):
    """`--patience` with a model proposer: each round's search stops when it stalls (it used to
    be dropped: a round ran its whole budget)."""
    runs = env / "runs"
    with ScriptedServer([{"reply": space("[16, 256]") + template()}]) as srv:
        rc = main(["tune", "softmax", "--shape", "256x64", "--backend", "null", "--llm", "coder",
                   "--llm-base-url", srv.base_url, "--rounds", "1", "--budget", "40", "--patience", "2",
                   "--validate-configs", "1", "--sampler", "random", "--seed", "5", "--runs-dir", str(runs),
                   "--quiet"])
    assert rc == 0
    round1 = only_run(runs) / "rounds/01"
    assert json.loads((round1 / "run.json").read_text())["patience"] == 2
    summary = json.loads((round1 / "summary.json").read_text())
    assert summary["evaluations"] < 15 and summary["search_stopped"].startswith("--patience 2:")


def test_the_models_promising_configs_are_tried_after_its_default(env):
    """A model's guesses (`promising:` in its space) are the round's next evaluations after the
    default, before the sampler's own picks; the prompt asks for them."""
    runs = env / "runs"
    reply = space("[16, 256]").replace("default: {BM: 32, W: 2}\n",
                                       "default: {BM: 32, W: 2}\npromising:\n  - {BM: 16, W: 1}\n  - {BM: 128, W: 1}\n")
    with ScriptedServer([{"reply": reply + template()}]) as srv:
        rc = main(["tune", "softmax", "--shape", "256x64", "--backend", "null", "--llm", "coder",
                   "--llm-base-url", srv.base_url, "--rounds", "1", "--budget", "6", "--parallel", "1",
                   "--validate-configs", "1", "--sampler", "random", "--seed", "5", "--runs-dir", str(runs),
                   "--quiet"])
        asked = srv.requests[0]["json"]["messages"]
    assert rc == 0
    assert any("promising" in m["content"] for m in asked)
    # Trial -1: the configs the model's skeleton was validated on (its default first); then the
    # search: the default again (answered from its record), the guesses, the sampler's picks.
    searched = sorted((r for r in Store.open(only_run(runs) / "rounds/01").records() if r.trial >= 0),
                      key=lambda r: r.trial)
    assert [r.config.as_dict() for r in searched[:2]] == [{"BM": 16, "W": 1}, {"BM": 128, "W": 1}]
    assert [r.trial for r in searched[:2]] == [1, 2]


def test_key_flag_is_redacted_from_the_saved_command():
    assert redacted_argv(["tuner", "tune", "--llm-api-key", KEY, "x"]) == "tuner tune --llm-api-key '***' x"
    assert redacted_argv(["tuner", f"--llm-api-key={KEY}"]) == "tuner '--llm-api-key=***'"


def test_killed_multi_round_run_resumes_without_asking_again(env):
    """SIGKILL a real two-round `tuner tune --llm` during round 2's search; the resumed run
    finishes it without redoing round 1 or sending the model any request it already answered."""
    steps = [{"reply": space() + template()}, {"reply": space("[16, 256]") + template(center=128)}]
    budget = "6"
    runs = env / "runs"
    with ScriptedServer(steps) as srv:
        base = dict(os.environ, PYTHONPATH=str(ROOT), TUNER_BENCH_BUDGET_S="0.02")
        base.pop("OPENAI_API_KEY")
        cmd = [sys.executable, "-m", "tuner", "tune", "softmax", "--shape", "256x64", "--backend", "null",
               "--llm", "coder", "--llm-base-url", srv.base_url, "--llm-api-key", KEY, "--rounds", "2",
               "--budget", budget, "--validate-configs", "1", "--sampler", "random", "--seed", "3",
               "--parallel", "1",
               "--runs-dir", str(runs), "--quiet"]
        proc = subprocess.Popen(cmd, env=base, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline, records = time.monotonic() + 150, None
        while time.monotonic() < deadline:
            records = next(runs.glob("*/rounds/02/records.jsonl"), None) if runs.exists() else None
            if records is not None and len(records.read_text().splitlines()) >= 4:
                break
            if proc.poll() is not None:
                pytest.fail(f"tuner exited before it could be killed: {proc.stderr.read().decode()[-2000:]}")
            time.sleep(0.05)
        assert records is not None, "round 2 never started searching"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        run = only_run(runs)
        round1 = (run / "rounds/01/records.jsonl").read_text()
        before = Store(run / "rounds/02").records()
        assert len(srv.chat_requests()) == 2 and not (run / "summary.json").exists()

        resumed = subprocess.run([sys.executable, "-m", "tuner", "tune", "--resume", str(run), "--budget", budget,
                                  "--quiet"], env={**base, "OPENAI_API_KEY": KEY}, capture_output=True,
                                 text=True, timeout=300)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert len(srv.chat_requests()) == 2, "the resumed run asked the model again"
    assert (run / "rounds/01/records.jsonl").read_text() == round1, "round 1 was redone"
    after = Store(run / "rounds/02").records()
    assert [r.to_json() for r in after[:len(before)]] == [r.to_json() for r in before]
    keys = [r.config.key for r in after if r.status is not Status.INVALID]
    assert len(keys) == len(set(keys)) == int(budget)
    summary = json.loads((run / "summary.json").read_text())
    assert [r["round"] for r in summary["rounds"]] == [1, 2] and summary["best"] is not None
    assert "--llm-api-key '***'" in json.loads((run / "run.json").read_text())["command"]
    no_key_on_disk(run)

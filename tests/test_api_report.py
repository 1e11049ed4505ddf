"""The Python API, the HTML report (checked in a real headless browser) and the records'
export, on the null backend."""

import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tuner
from tests.conftest import FIXTURES, ROOT
from tests.test_tune import fast_env
from tuner.core.op import OpError
from tuner.core.values import Status

NULL = {"backend": "null", "template": str(FIXTURES / "null/landscape.txt.j2"),
        "space": str(FIXTURES / "null/landscape.yaml")}


def _chromium() -> str | None:
    return next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser"),
                             shutil.which("google-chrome")) if p), None)


def _dom(page: Path) -> str:
    """The page's DOM after its scripts ran, in headless Chromium."""
    browser = _chromium()
    if browser is None:
        pytest.skip("no Chromium here (.ci/run installs Debian's chromium)")
    out = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                          "--no-first-run", "--disable-background-networking", "--disable-component-update",
                          "--disable-sync", f"--user-data-dir={page.parent / '.chromium'}",
                          "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_tune_from_python_returns_the_run_with_its_records_and_report(tmp_path, monkeypatch):
    fast_env(monkeypatch, tmp_path)
    run = tuner.tune("softmax", shape=(64, 512), budget=12, seed=2, runs_dir=str(tmp_path / "runs"), **NULL)
    assert isinstance(run, tuner.Run) and run.path.parent == tmp_path / "runs"
    summary = run.summary
    assert run.best_config == summary["best"]["config"] and run.best["median_s"] > 0
    assert sum(r.status is not Status.INVALID for r in run.records) == 12
    rows = run.rows()
    assert len(rows) == len(run.records) and {"status", "median_s", "iqr_s", "param.BM", "reason"} <= set(rows[0])
    ok = [r for r in rows if r["status"] == "OK"]
    assert min(r["median_s"] for r in ok) == pytest.approx(min(r.seconds for r in run.records))
    # The same as the command's export.
    table = list(csv.DictReader(io.StringIO(run.to_csv())))
    assert [t["status"] for t in table] == [r["status"] for r in rows]
    # The report is written at the end of the run and named in the summary.
    assert Path(summary["report"]) == run.path / "report.html" and Path(summary["report"]).is_file()
    # Resume and errors as the command: more budget continues the same run; bad input raises.
    again = tuner.tune(resume=str(run.path), budget=14)
    assert again.path == run.path and sum(r.status is not Status.INVALID for r in again.records) == 14
    with pytest.raises(OpError, match="did you mean 'softmax'"):
        tuner.tune("softmx", shape="64x512", runs_dir=str(tmp_path / "runs"), **NULL)
    with pytest.raises(TypeError, match="unknown option 'budgte'"):
        tuner.tune("softmax", shape="64x512", budgte=3)
    with pytest.raises(ValueError, match="budget must be at least 1"):
        tuner.tune("softmax", shape="64x512", budget=0)
    assert tuner.show(run.path).path == run.path


def test_the_report_page_loads_in_a_browser_with_its_data_points(tmp_path, monkeypatch):
    fast_env(monkeypatch, tmp_path)
    monkeypatch.setenv("TUNER_REPORT", "0")  # written below by the command instead
    # Two configs that fail (a wrong answer, a crash) tried first, whatever the search then does.
    failing = tmp_path / "failing.json"
    failing.write_text(json.dumps([{"BM": 32, "BN": 512, "WARPS": 2, "STAGES": 1},
                                   {"BM": 16, "BN": 16, "WARPS": 2, "STAGES": 1}]))
    run = tuner.tune("softmax", shape=(64, 512), budget=15, seed=4, runs_dir=str(tmp_path / "runs"),
                     warm_start=str(failing), **NULL)
    assert "report" not in run.summary and not (run.path / "report.html").exists()
    from tuner.cli.main import main
    out = tmp_path / "page" / "r.html"
    assert main(["report", str(run.path), "--out", str(out)]) == 0
    page = out.read_text()
    assert "<script" in page and not re.search(r"<script[^>]*\ssrc=", page)  # plotly.js embedded: opens offline
    dom = _dom(out)
    # Plotly drew every figure: one SVG per plot, a point per passing evaluation in the
    # progress figure (twice: by evaluation and by wall time).
    figures = re.findall(r'data-figure="(\w+)"', dom)
    assert {"progress", "params", "roofline"} <= set(figures), figures
    assert dom.count('class="main-svg"') >= len(figures)
    ok = sum(r.status is Status.OK for r in run.records)
    progress = dom[dom.index('data-figure="progress"'):dom.index('data-figure="params"')]
    assert progress.count('class="point"') >= 2 * ok
    assert "Failures" in dom and any(s in dom for s in ("WRONG_RESULT", "RUNTIME_ERROR", "COMPILE_ERROR"))


def test_a_sweep_report_links_every_task(tmp_path, monkeypatch):
    fast_env(monkeypatch, tmp_path)
    summary = tuner.sweep(FIXTURES / "sweep/null.yaml", out=str(tmp_path / "sw"))
    page = Path(summary["report"])
    assert page == tmp_path / "sw" / "report.html"
    links = re.findall(r"href='(tasks/[^']+)'", page.read_text())
    assert len(links) == 3 and all((page.parent / link).is_file() for link in links)


def test_show_exports_csv_and_survives_a_closed_pipe(tmp_path, monkeypatch):
    fast_env(monkeypatch, tmp_path)
    run = tuner.tune("softmax", shape=(64, 512), budget=6, runs_dir=str(tmp_path / "runs"), **NULL)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "tuner", "show", str(run.path), "--csv", "-"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and out.stdout.splitlines()[0].startswith("trial,status,median_s")
    # `tuner show --json | head -1`: the reader goes away; no traceback.
    p = subprocess.run(f"{sys.executable} -m tuner show {run.path} --json | head -1", shell=True,
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.stdout.strip() == "{" and "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr
    assert json.loads((run.path / "summary.json").read_text())["best"]

"""`tuner retune`: a finished run re-tuned on another (simulated) chip and on another shape,
warm-started with the old winner, with the gap reported side by side."""

import json
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from tuner.backends import BackendUnavailable
from tuner.cli.main import main
from tuner.run.retune import parse_target
from tuner.run.store import Store

ROOT = Path(__file__).resolve().parent.parent
# Six configs, walked whole by the grid sampler. At 96 rows the 910B2's 48 vector cores take two
# rows each in one round; the 910B4's 40 cannot, and wants four rows per program instead.
SPACE = """\
language: triton_ascend
sizes: [M, N]
params:
  ONLINE: [false]
  BLOCK_N: [1024]
  ROWS: [1, 2, 4]
  PROGS_PER_CORE: [1]
  multibuffer: [false, true]
resources:
  ub_bytes: (2 if multibuffer else 1) * ROWS * BLOCK_N * (2 * DTYPE_BYTES + 8) + ROWS * 8
default: {ONLINE: false, BLOCK_N: 1024, ROWS: 1, PROGS_PER_CORE: 1, multibuffer: true}
"""


@pytest.mark.parametrize("device, chip, expect", [
    (None, None, ("cuda", 0, {})), ("npu:3", None, ("npu", 3, {})), ("cpu", None, ("cpu", 0, {})),
    (None, "910B4", ("sim", 0, {"chip": "910B4"})), ("sim:310P3", None, ("sim", 0, {"chip": "310P3"})),
    ("sim", "910_93", ("sim", 0, {"chip": "910_93"}))])
def test_parse_target(device, chip, expect):
    assert parse_target(device, chip, "cuda") == expect


@pytest.mark.parametrize("device, chip", [("npu:x", None), ("tpu:0", None), ("npu:1", "910B4"), ("cuda:-1", None)])
def test_parse_target_refuses(device, chip):
    with pytest.raises(BackendUnavailable):
        parse_target(device, chip, "cuda")


@pytest.fixture
def quick(monkeypatch, tmp_path, cache_dir):
    for k, v in {"TUNER_BENCH_BUDGET_S": "0.005", "TUNER_WARMUP_S": "0", "TUNER_MIN_REPS": "3",
                 "TUNER_MAX_REPS": "20", "TUNER_COMPILE_WORKERS": "1", "TUNER_CACHE_DIR": cache_dir}.items():
        monkeypatch.setenv(k, v)
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    return tmp_path, space


def _only_run(runs: Path, exclude=()) -> Path:
    (run,) = [p for p in runs.iterdir() if p.is_dir() and p not in exclude]
    return run


def _old_run_on_910b2(tmp: Path, space: Path) -> Path:
    """The six configs walked by the grid sampler on a simulated 910B2: the run to re-tune."""
    runs = tmp / "runs"
    template = ROOT / "kernel_templates" / "softmax" / "triton_ascend.py.j2"
    assert main(["tune", "softmax", "--chip", "910B2", "--shape", "96x1024", "--template", str(template),
                 "--space", str(space), "--sampler", "grid", "--budget", "6", "--runs-dir", str(runs),
                 "--quiet", "--seed", "1"]) == 0
    return _only_run(runs)


def test_retune_on_another_chip_reports_the_cost_of_not_retuning(quick, capsys):
    tmp, space = quick
    runs = tmp / "runs"
    old = _old_run_on_910b2(tmp, space)
    meta = Store(old).meta()
    assert meta.backend == "sim" and meta.backend_options == {"chip": "910B2"}
    assert meta.device.name == "Ascend910B2" and meta.device.simulated
    old_best = json.loads((old / "summary.json").read_text())["best"]["config"]
    assert old_best["ROWS"] == 2
    capsys.readouterr()

    assert main(["retune", str(old), "--chip", "910B4", "--sampler", "grid", "--budget", "6",
                 "--runs-dir", str(runs), "--quiet", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    new = Path(report["run"])
    assert json.loads((new / "retune.json").read_text()) == report
    meta = Store(new).meta()
    assert meta.backend_options == {"chip": "910B4"} and meta.retune_of["run"] == str(old)
    assert meta.retune_of["seeds"][0] == old_best  # warm-started with the old winner first
    assert any(r.config.as_dict() == old_best for r in Store(new).records())
    assert report["old"]["device"] == "Ascend910B2" and report["new"]["device"] == "Ascend910B4"
    assert report["new"]["simulated"] and report["old"]["winner"] == old_best
    assert report["old_winner_on_new"]["status"] == "OK"
    assert report["new_winner"]["config"]["ROWS"] == 4 and not report["same_winner"]
    gap = report["gap"]
    assert gap["slowdown"] > 1.02 and gap["percent"] == pytest.approx(100 * (gap["slowdown"] - 1))
    assert report["old_winner_on_new"]["median_s"] > report["new_winner"]["median_s"]

    # And a new shape on the same chip: the old run's backend and chip carry over.
    assert main(["retune", str(new), "--shape", "160x1024", "--sampler", "grid", "--budget", "6",
                 "--runs-dir", str(runs), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "old winner" in out and "new winner" in out
    third = max((p for p in runs.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    rep = json.loads((third / "retune.json").read_text())
    assert rep["new"]["op"]["sizes"] == {"M": 160, "N": 1024} and rep["target"] == "sim:910B4"


def test_retune_refuses_what_it_cannot_do(quick, capsys, tmp_path):
    assert main(["retune", str(tmp_path / "nothing")]) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert main(["tune", "softmax", "--backend", "cpu", "--chip", "910B2", "--shape", "8x8",
                 "--runs-dir", str(tmp_path / "r")]) == 2
    assert "--chip" in capsys.readouterr().err


def test_retune_gives_the_guided_search_the_old_runs_timings_as_its_prior(quick, priors_given):
    tmp, space = quick
    runs = tmp / "runs"
    old = _old_run_on_910b2(tmp, space)
    old_times = {r.config: r.seconds for r in Store(old).records()}
    assert main(["retune", str(old), "--chip", "910B4", "--budget", "4", "--runs-dir", str(runs), "--quiet"]) == 0
    assert priors_given and len(priors_given[0]) == 1
    (prior,) = priors_given[0]
    assert prior == pytest.approx(old_times) and len(prior) == 6


def test_retune_of_a_problem_file_at_other_sizes(quick, capsys):
    """A problem file's run re-tunes at other module-level sizes (`--size`), the rest kept as the
    run had them; `--shape` on it, or `--size` on a built-in op's run, says which one to use."""
    tmp, _ = quick
    runs = tmp / "runs"
    assert main(["tune", "--op", str(FIXTURES / "kernelbench/relu.py"), "--size", "batch_size=4",
                 "--size", "dim=256", "--backend", "null", "--budget", "3",
                 "--template", str(FIXTURES / "kernelbench/relu_null.txt.j2"),
                 "--space", str(FIXTURES / "kernelbench/relu_null.yaml"), "--runs-dir", str(runs), "--quiet"]) == 0
    old = _only_run(runs)
    capsys.readouterr()
    assert main(["retune", str(old), "--shape", "8x256"]) == 2
    assert "takes --size NAME=VALUE (its sizes: batch_size=4, dim=256)" in capsys.readouterr().err
    assert main(["retune", str(old), "--size", "batch_size=8", "--budget", "3", "--runs-dir", str(runs),
                 "--quiet", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["new"]["op"]["sizes"] == {"batch_size": 8, "dim": 256}
    assert report["old"]["op"]["sizes"] == {"batch_size": 4, "dim": 256}
    old_builtin = _old_run_on_910b2(tmp / "builtin", quick[1])
    capsys.readouterr()
    assert main(["retune", str(old_builtin), "--size", "M=8"]) == 2
    assert "--size is for problem files; for the built-in softmax use --shape, e.g. --shape 96x1024" in capsys.readouterr().err

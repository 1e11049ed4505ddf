"""The tuning database: collect winners from runs, keep other toolchains apart, export."""

import json
import shutil
import sys
import types

import pytest

from tests.conftest import FIXTURES
from tuner.cli.main import main
from tuner.core.ops import builtin_spec
from tuner.core.skeleton import load_skeleton
from tuner.run.tune import create_run, execute
from tuner.serve.db import DBError, TuningDB, export, fingerprint

LANDSCAPE = (FIXTURES / "null/landscape.txt.j2", FIXTURES / "null/landscape.yaml")


def null_run(settings, shape, seed=1, budget=8):
    store = create_run(settings, builtin_spec("softmax", shape), "null", load_skeleton(*LANDSCAPE), "random", seed)
    execute(store, settings, budget, parallel=2)
    return store.path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three finished null runs (two shapes; the second shape twice) and one unfinished."""
    import os
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from tuner.core.settings import Settings
    base = tmp_path_factory.mktemp("db")
    settings = Settings(runs_dir=str(base / "runs"), cache_dir=str(base / "cache"), bench_budget_s=0.005,
                        warmup_s=0.0, min_reps=3, max_reps=20, compile_workers=2)
    paths = [null_run(settings, "256x512", 1), null_run(settings, "512x512", 2), null_run(settings, "512x512", 3, 16)]
    unfinished = create_run(settings, builtin_spec("softmax", "64x128"), "null", load_skeleton(*LANDSCAPE))
    return base / "runs", paths, unfinished.path


def copy_run(src, dst, toolchain=None, created=None):
    shutil.copytree(src, dst)
    summary = json.loads((dst / "summary.json").read_text())
    meta = json.loads((dst / "run.json").read_text())
    if toolchain is not None:
        summary["device"]["toolchain"] = toolchain
    if created is not None:
        meta["created"] = created
    (dst / "summary.json").write_text(json.dumps(summary))
    (dst / "run.json").write_text(json.dumps(meta))
    return dst


def test_collects_the_best_verified_config_per_key(runs, tmp_path):
    folder, paths, unfinished = runs
    db = TuningDB(tmp_path / "db.json")
    results = {r: (what, why) for r, what, why in db.collect([folder])}
    assert results[str(unfinished)][0] == "skipped"
    assert sorted(e["sizes"]["M"] for e in db.entries) == [256, 512]
    best512 = min(json.loads((p / "summary.json").read_text())["best"]["median_s"] for p in paths[1:])
    e512 = next(e for e in db.entries if e["sizes"]["M"] == 512)
    assert e512["median_s"] == best512
    for e in db.entries:
        assert e["device"] == "null device" and e["fingerprint"] == fingerprint({"null": "1"})
        assert "time:" in e["kernel"] and e["skeleton"] in db.data["skeletons"]
    db.save()
    again = TuningDB(tmp_path / "db.json")
    assert [w for _, w, _ in again.collect([folder]) if w != "skipped"] == ["kept"] * 3
    assert len(again.entries) == 2 and not again.stale


def test_another_toolchain_is_kept_apart_and_never_served(runs, tmp_path):
    _, paths, _ = runs
    db = TuningDB(tmp_path / "db.json")
    db.add_run(paths[0])
    db.add_run(paths[1])
    # A newer run built with another toolchain: what was served for the device goes stale.
    newer = copy_run(paths[0], tmp_path / "newer", {"null": "2"}, "2099-01-01T00:00:00+0000")
    assert db.add_run(newer)[0] == "added"
    assert [e["run"] for e in db.entries] == [str(newer.resolve())]
    assert len(db.stale) == 2 and all(e["toolchain"]["null"] == "1" for e in db.stale)
    # An old run of the old toolchain goes straight to stale.
    older = copy_run(paths[1], tmp_path / "older", {"null": "1"}, "2000-01-01T00:00:00+0000")
    what, why = db.add_run(older)
    assert what in ("stale", "kept") and len(db.entries) == 1
    # Exports serve only the current toolchain.
    written = export(db, tmp_path / "out")
    table = json.loads((tmp_path / "out" / "tuning.json").read_text())
    assert [e["toolchain"]["null"] for e in table["entries"]] == ["2"]
    stale = json.loads((tmp_path / "out" / "stale.json").read_text())
    assert len(stale["entries"]) == 2 and "never served" in stale["note"]
    assert (tmp_path / "out" / "tuned_kernels.py") in written


def test_triton_autotune_export(tmp_path):
    db = TuningDB(tmp_path / "db.json")
    base = {"op": "softmax", "kind": "builtin", "source": "softmax", "dtype": "fp32", "backend": "cuda",
            "device": "NVIDIA H200", "simulated": False, "toolchain": {"triton": "3.4"},
            "fingerprint": fingerprint({"triton": "3.4"}), "iqr_s": 0, "speedup_vs_reference": 2.0,
            "ceiling_percent": 80.0, "skeleton": "h", "skeleton_name": "softmax/triton", "language": "triton",
            "kernel": "", "kernel_file": "kernel.py", "run_id": "r", "created": 1.0}
    db.data["skeletons"]["h"] = {"name": "softmax/triton", "language": "triton", "template": "", "space": {}}
    for m, cfg, t in ((4096, {"BLOCK_N": 1024, "ONLINE": False, "num_warps": 4, "num_stages": 1}, 2e-5),
                      (8192, {"BLOCK_N": 4096, "ONLINE": True, "num_warps": 8, "num_stages": 2}, 3e-5),
                      (1024, {"BLOCK_N": 1024, "ONLINE": False, "num_warps": 4, "num_stages": 1}, 1e-5)):
        db._insert({**base, "sizes": {"M": m, "N": 1024}, "config": cfg, "median_s": t, "run": f"run{m}"})
    export(db, tmp_path / "out")
    fake = types.ModuleType("triton")

    class Config:
        def __init__(self, kwargs, num_warps=4, num_stages=2):
            self.kwargs, self.num_warps, self.num_stages = kwargs, num_warps, num_stages
    fake.Config = Config
    real = sys.modules.get("triton")  # put back as it was: a fresh `import triton` afterwards
    sys.modules["triton"] = fake      # would lack the submodules the first import bound to it
    try:
        ns = {}
        exec((tmp_path / "out" / "triton_autotune.py").read_text(), ns)
    finally:
        if real is not None:
            sys.modules["triton"] = real
        else:
            del sys.modules["triton"]
    configs = ns["CONFIGS"]["softmax"]
    assert [(c.kwargs, c.num_warps, c.num_stages) for c in configs] == [
        ({"BLOCK_N": 1024}, 4, 1), ({"BLOCK_N": 4096}, 8, 2)]  # distinct, fastest first
    assert ns["KEYS"]["softmax"] == ["M", "N"] and ns["STRUCTURAL"]["softmax"] == ["ONLINE"]
    assert len(ns["SHAPES"]["softmax"]) == 3


def test_cli_db_and_export(runs, tmp_path, capsys):
    folder, paths, _ = runs
    dbf = str(tmp_path / "t.json")
    assert main(["db", "update", str(folder), "--db", dbf]) == 0
    assert "2 served, 0 stale" in capsys.readouterr().out
    assert main(["db", "list", "--db", dbf, "--stale"]) == 0
    out = capsys.readouterr().out
    assert "softmax" in out and "null device" in out
    assert main(["export", "--db", dbf, "--out", str(tmp_path / "exp")]) == 0
    assert sorted(p.name for p in (tmp_path / "exp").iterdir()) == ["stale.json", "tuned_kernels.py", "tuning.json"]
    # One run's export still works.
    assert main(["export", str(paths[0]), "--out", str(tmp_path / "one")]) == 0
    assert main(["export", "--db", str(tmp_path / "missing.json")]) == 2
    assert "tuner db update" in capsys.readouterr().err
    # What would be ignored, or would show an empty table as if the runs had nothing, is refused.
    assert main(["db", "list", "--db", str(tmp_path / "missing.json")]) == 2
    assert "no tuning database" in capsys.readouterr().err
    assert main(["db", "list", str(folder), "--db", dbf]) == 2
    assert f"first with `tuner db update {folder}`" in capsys.readouterr().err
    assert main(["db", "update", str(folder), "--db", dbf, "--stale"]) == 2
    assert "--stale is for `tuner db list`" in capsys.readouterr().err
    empty = TuningDB(tmp_path / "empty.json")
    with pytest.raises(DBError, match="no entries"):
        export(empty, tmp_path / "none")


def test_an_entry_slower_than_torch_is_said_so_by_list_and_export(runs, tmp_path, capsys):
    _, paths, _ = runs
    slow = copy_run(paths[0], tmp_path / "slow")
    summary = json.loads((slow / "summary.json").read_text())
    summary["best"]["speedup_vs_reference"] = 0.74
    (slow / "summary.json").write_text(json.dumps(summary))
    dbf = str(tmp_path / "t.json")
    assert main(["db", "update", str(slow), "--db", dbf]) == 0
    assert main(["db", "list", "--db", dbf]) == 0
    assert "1 slower than torch's own" in " ".join(capsys.readouterr().out.split())
    assert main(["export", "--db", dbf, "--out", str(tmp_path / "exp")]) == 0
    out = capsys.readouterr().out
    assert "ran at 0.74x torch's own implementation" in out and "serve_slower=True" in out


def test_seeds_from_before_a_param_was_added_are_tried_with_its_default(tmp_path):
    # an LLM round's revised skeleton, or a warm start from an older version, may add a param:
    # the earlier best configs still come right after the default, completed, not dropped
    from tuner.core.settings import Settings
    from tuner.core.values import Config
    settings = Settings(runs_dir=str(tmp_path / "runs"), cache_dir=str(tmp_path / "cache"),
                        bench_budget_s=0.005, warmup_s=0.0, min_reps=3, max_reps=20, compile_workers=1)
    older = Config.of({"BM": 64, "BN": 128, "WARPS": 4})  # measured before STAGES existed
    store = create_run(settings, builtin_spec("softmax", "256x512"), "null", load_skeleton(*LANDSCAPE),
                       "random", 1)
    execute(store, settings, 3, parallel=1, seeds=(older,))
    configs = [r.config.as_dict() for r in store.records()]
    assert configs[1] == {"BM": 64, "BN": 128, "WARPS": 4, "STAGES": 1}


@pytest.mark.parametrize("text, says", [('{"format":', "is not a readable tuning database"),
                                        ("[]", "is not a tuning database: a JSON list"),
                                        ('{"format": 0}', "has format 0")])
def test_a_database_file_that_is_not_one_is_refused_clearly(tmp_path, text, says):
    (tmp_path / "db.json").write_text(text)
    with pytest.raises(DBError, match=says):
        TuningDB(tmp_path / "db.json")


def test_a_run_with_noisy_timing_loses_to_one_without(runs, tmp_path):
    """The database prefers an entry whose times are not flagged (a busy machine) to a faster
    one that is."""
    _, paths, _ = runs
    db = TuningDB(tmp_path / "db.json")
    assert db.add_run(paths[0])[0] == "added"
    entry = db.entries[0]
    flagged = dict(entry, run="elsewhere", run_id="flagged", median_s=entry["median_s"] / 2,
                   flags=["winner timing noisy: its IQR is 80% of its median"])
    assert db._put(db.entries, flagged)[0] == "kept"
    assert db.entries[0]["run"] == entry["run"]
    clean = dict(flagged, run="third", run_id="clean", flags=[])
    assert db._put(db.entries, clean)[0] == "replaced"
    assert db.entries[0]["run"] == "third"


def test_one_shape_tuned_in_two_languages_keeps_both_and_serves_the_faster(runs, tmp_path):
    """A backend with two languages (cuda: Triton and CUDA C++): the best of each language is
    kept per shape, and the runtime's first candidate is the faster of the two."""
    from tuner.serve.runtime import Table
    folder, paths, _ = runs
    other = copy_run(paths[1], tmp_path / "other-language")
    skel = json.loads((other / "skeleton" / "skeleton.json").read_text())
    skel["language"] = "other"
    (other / "skeleton" / "skeleton.json").write_text(json.dumps(skel))
    summary = json.loads((other / "summary.json").read_text())
    summary["best"]["median_s"] *= 0.5  # the faster of the two
    (other / "summary.json").write_text(json.dumps(summary))
    db = TuningDB(tmp_path / "db.json")
    db.collect([folder, other])
    at512 = [e for e in db.entries if e["sizes"]["M"] == 512]
    assert sorted(e["language"] for e in at512) == ["other", "script"]
    first = Table.from_db(db, backend="null").candidates("softmax", {"M": 512, "N": 512}, "fp32")[0]
    assert first.entry["language"] == "other" and first.exact

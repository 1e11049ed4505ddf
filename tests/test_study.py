"""--storage keeps each run as an Optuna study that shows the search as it was (seconds, real
param values, failures as FAIL/PRUNED trials with their reasons), one study per run."""

import json
import math

import optuna

from tests.test_tune import NULL, fast_env, only_run
from tuner.cli.main import main
from tuner.core.values import Status
from tuner.run.store import Store


def _study(journal, name):
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    return optuna.load_study(study_name=name, storage=JournalStorage(JournalFileBackend(str(journal))))


def test_the_stored_study_is_the_run_as_it_was(tmp_path, monkeypatch):
    fast_env(monkeypatch, tmp_path)
    runs, journal = tmp_path / "runs", tmp_path / "study.journal"
    # Two of the landscape's scripted faults (a wrong answer, a crash) tried first, whatever the
    # search then does: the study must hold failures as failures.
    failing = tmp_path / "failing.json"
    failing.write_text(json.dumps([{"BM": 32, "BN": 512, "WARPS": 2, "STAGES": 1},
                                   {"BM": 16, "BN": 16, "WARPS": 2, "STAGES": 1}]))
    assert main(["tune", "softmax", "--shape", "64x512", *NULL, "--budget", "25", "--seed", "1",
                 "--runs-dir", str(runs), "--storage", str(journal), "--warm-start", str(failing), "--quiet"]) == 0
    run = only_run(runs)
    records = Store.open(run).records()
    study = _study(journal, run.name)  # named after the run
    assert study.metric_names == ["median seconds per call"]
    trials = study.get_trials()
    assert len(trials) == len(records)
    by_record = {t.user_attrs["record"]: t for t in trials}
    states = set()
    for r in records:
        t = by_record[f"{r.config.key}@{r.time!r}"]
        assert t.params == r.config.as_dict()  # real values: BM 64, not an index
        assert t.user_attrs["status"] == r.status.value
        if r.status is Status.OK:
            assert t.state is optuna.trial.TrialState.COMPLETE and math.isclose(t.value, r.seconds)
            assert t.user_attrs["samples"] == len(r.measurement.samples) and t.user_attrs["iqr_s"] >= 0
        elif r.status is Status.INVALID:
            assert t.state is optuna.trial.TrialState.PRUNED and t.user_attrs["reason"]
        else:
            assert t.state is optuna.trial.TrialState.FAIL and t.user_attrs["reason"] == r.reason[:4000]
        states.add(t.state)
    assert optuna.trial.TrialState.FAIL in states  # the landscape's scripted faults
    assert study.best_value == min(r.seconds for r in records)
    bm = study.best_trial.distributions["BM"]
    assert isinstance(bm, optuna.distributions.IntDistribution) and bm.log and (bm.low, bm.high) == (16, 256)
    assert set(optuna.importance.get_param_importances(study)) == {"BM", "BN", "WARPS", "STAGES"}

    # A resume adds only what the study lacks; another run gets a study of its own, by name.
    assert main(["tune", "--resume", str(run), "--budget", "30", "--quiet"]) == 0
    assert len(_study(journal, run.name).get_trials()) == len(Store.open(run).records()) > len(records)
    assert main(["tune", "softmax", "--shape", "256x512", *NULL, "--budget", "5", "--runs-dir", str(runs),
                 "--storage", str(journal), "--study-name", "wide", "--quiet"]) == 0
    names = sorted(s.study_name for s in optuna.get_all_study_summaries(_study(journal, run.name)._storage))
    assert names == sorted([run.name, "wide"])


def test_a_study_name_without_a_storage_is_refused(tmp_path, monkeypatch, capsys):
    fast_env(monkeypatch, tmp_path)
    rc = main(["tune", "softmax", "--shape", "64x512", *NULL, "--runs-dir", str(tmp_path / "runs"),
               "--study-name", "x", "--quiet"])
    assert rc == 2 and "pass --storage too" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())

"""The runner conformance suite (tuner/exec/runner.py states the contract). A runner's test
module imports these tests and defines a `make_evaluator(skeleton, settings, workdir)`
fixture that builds an Evaluator on that runner: tests/conformance/test_runners.py (local),
tests/test_ray.py (Ray)."""

import pytest

from tests.conftest import FIXTURES
from tuner.core.ops import builtin_spec
from tuner.core.skeleton import load_skeleton
from tuner.core.values import Build, DeviceInfo, Status
from tuner.exec.worker import WorkerFailure

SPEC = builtin_spec("softmax", "64x128", "fp32")


def _skeleton(name):
    folder = "ray" if name == "hang" else "null"
    return load_skeleton(FIXTURES / f"{folder}/{name}.txt.j2", FIXTURES / f"{folder}/{name}.yaml")


def _built(ev, config) -> Build:
    source = ev.skeleton.render(config, ev.context)
    return ev.runner.compile(source, SPEC.to_json(), str(ev.workdir / "build" / config.key), 30.0)


def test_runner_compiles_and_says_a_failed_compile_as_a_build(make_evaluator, fast_settings, tmp_path):
    for name, status in (("good", Status.OK), ("nocompile", Status.COMPILE_ERROR)):
        ev = make_evaluator(_skeleton(name), fast_settings, tmp_path / name)
        try:
            build = _built(ev, ev.skeleton.space.default_config())
            assert build.status is status and (build.artifact if status is Status.OK else build.error)
        finally:
            ev.close()


def test_runner_answers_device_requests(make_evaluator, fast_settings, tmp_path):
    ev = make_evaluator(_skeleton("mixed"), fast_settings, tmp_path)
    try:
        info = ev.runner.device("device_info", 120, "device_info")
        assert isinstance(info, DeviceInfo) and info.name
        samples = ev.runner.device("time_reference", 120, "time_reference", spec=SPEC, settings=fast_settings)
        assert samples and all(s > 0 for s in samples)
        build = _built(ev, ev.skeleton.space.default_config())
        meas = ev.runner.device("measure", 120, "measure", artifact=build.artifact, spec=SPEC,
                                settings=fast_settings, best_s=None, reference_s=min(samples))
        assert meas.status is Status.OK and meas.samples
        # one slot per device the runner times on: what a search keeps in flight is sized by it
        assert isinstance(ev.runner.timing_slots, int) and ev.runner.timing_slots >= 1
        assert ev.timing_slots == ev.runner.timing_slots
    finally:
        ev.close()


def test_a_crash_is_a_failure_and_the_runner_does_not_retry(make_evaluator, fast_settings, tmp_path):
    ev = make_evaluator(_skeleton("mixed"), fast_settings, tmp_path)
    try:
        bug = next(c for c in ev.skeleton.space.configs() if c["BUG"])
        build = _built(ev, bug)
        with pytest.raises(WorkerFailure) as e:
            ev.runner.device("measure", 60, "measure", artifact=build.artifact, spec=SPEC,
                             settings=fast_settings, best_s=None, reference_s=None)
        assert e.value.kind == "crash" and e.value.reason
        assert ev.runner.retries == 0
        # Through the Evaluator: sent once more, then the config's, with both deaths said.
        ev.start()
        rec = ev.evaluate(bug)
        assert rec.status is Status.RUNTIME_ERROR and "twice" in rec.reason, rec.reason
        assert ev.runner.retries == 1
        ok = ev.evaluate(next(c for c in ev.skeleton.space.configs() if not c["BUG"]))
        assert ok.status is Status.OK  # the next config is served
    finally:
        ev.close()


def test_a_hang_is_a_timeout_and_never_retried(make_evaluator, fast_settings, tmp_path):
    settings = fast_settings.replace(run_timeout_s=3.0)
    ev = make_evaluator(_skeleton("hang"), settings, tmp_path)
    try:
        ev.start()
        hang = next(c for c in ev.skeleton.space.configs() if c["HANG"])
        rec = ev.evaluate(hang)
        assert rec.status is Status.RUN_TIMEOUT and "hung" in rec.reason, rec.reason
        assert ev.runner.retries == 0
    finally:
        ev.close()

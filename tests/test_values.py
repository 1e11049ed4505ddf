import json
import math
import pickle

import pytest

from tuner.core.values import Build, Config, DeviceInfo, Measurement, OpSpec, Record, RunMeta, Status


def roundtrip(value):
    data = json.loads(json.dumps(value.to_json()))
    back = type(value).from_json(data)
    assert back == value
    assert pickle.loads(pickle.dumps(value)) == value
    return back


def test_config_key_is_canonical():
    a = Config.of({"B": 2, "A": True, "S": "static"})
    b = Config.of({"S": "static", "A": True, "B": 2})
    assert a == b and a.key == b.key and hash(a) == hash(b)
    assert Config.of({"A": 1}).key != Config.of({"A": True}).key
    roundtrip(a)


def test_values_roundtrip():
    spec = OpSpec("softmax", "softmax", (("M", 4), ("N", 8)), "fp32")
    roundtrip(spec)
    build = Build(Status.OK, "/tmp/k.so", "", 0.5, "abc")
    roundtrip(build)
    meas = Measurement(Status.OK, (1e-3, 2e-3, 3e-3), 1e-7, 2e-7, "fine")
    roundtrip(meas)
    bad = Measurement(Status.WRONG_RESULT, (), math.inf, math.inf, "NaN")
    back = type(bad).from_json(json.loads(json.dumps(bad.to_json())))
    assert back.max_abs_err == math.inf
    rec = Record(spec.key, "h", Config.of({"A": 1}), build, meas, "cpu", (("cc", "gcc 12"),), 1.0, 3)
    assert roundtrip(rec).seconds == 2e-3
    roundtrip(DeviceInfo("cpu", "x", 2, (("smem_bytes", 1.0),), (("copy_gbps", 10.0),), (("cc", "1"),)))


def test_run_meta_roundtrips_and_keeps_what_it_does_not_know():
    spec = OpSpec("softmax", "softmax", (("M", 4), ("N", 8)), "fp32")
    dev = DeviceInfo("cpu", "x", 2, (("smem_bytes", 1.0),), (("copy_gbps", 10.0),), (("cc", "1"),))
    meta = RunMeta("run-1", spec, "cpu", "guided", 7, warm_start=("runs/a",), devices=(0,), device=dev,
                   skeleton={"name": "softmax/c", "hash": "h"}, budget=40, patience=5,
                   other={"from_a_newer_tool": [1, 2]})
    back = RunMeta.from_json(json.loads(json.dumps(meta.to_json())))
    assert back == meta and back.other == {"from_a_newer_tool": [1, 2]}
    assert pickle.loads(pickle.dumps(meta)) == meta
    assert not meta.is_rounds and RunMeta("r", spec, "cpu", rounds=3).is_rounds
    assert meta.replace(budget=80).budget == 80 and meta.budget == 40
    # what older runs wrote: nulls for unset keys, lists for sequences
    old = {"id": "x", "op": spec.to_json(), "backend": "cpu", "sampler": "tpe", "seed": 1,
           "storage": None, "warm_start": None, "devices": [1], "format_version": 1}
    assert RunMeta.from_json(old) == RunMeta("x", spec, "cpu", "tpe", 1, devices=(1,))


@pytest.mark.parametrize("data, says", [
    ({"backend": "cpu"}, "lacks op"),
    ({"op": {"name": "softmax"}, "backend": "cpu"}, "'op'"),
    ({"op": OpSpec("s", "s", ()).to_json(), "backend": "cpu", "seed": "7"}, "'seed'"),
    ({"op": OpSpec("s", "s", ()).to_json(), "backend": "cpu", "warm_start": "runs/a"}, "'warm_start'"),
    ([], "found a list"),
])
def test_a_damaged_run_meta_names_what_is_wrong(data, says):
    with pytest.raises(ValueError, match=says):
        RunMeta.from_json(data)


def test_record_status_prefers_build_failure():
    rec = Record("op", "h", Config.of({}), Build(Status.COMPILE_ERROR, error="boom"),
                 Measurement(Status.COMPILE_ERROR), "cpu")
    assert rec.status is Status.COMPILE_ERROR and rec.reason == "boom" and rec.seconds == math.inf


def test_measurement_stats():
    m = Measurement(Status.OK, (1.0, 2.0, 3.0, 4.0, 100.0))
    assert m.median == 3.0
    assert m.iqr > 0

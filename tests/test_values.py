import json
import math
import pickle

from tuner.values import Build, Config, DeviceInfo, Measurement, OpSpec, Record, Status


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


def test_record_status_prefers_build_failure():
    rec = Record("op", "h", Config.of({}), Build(Status.COMPILE_ERROR, error="boom"),
                 Measurement(Status.COMPILE_ERROR), "cpu")
    assert rec.status is Status.COMPILE_ERROR and rec.reason == "boom" and rec.seconds == math.inf


def test_measurement_stats():
    m = Measurement(Status.OK, (1.0, 2.0, 3.0, 4.0, 100.0))
    assert m.median == 3.0
    assert m.iqr > 0

"""The runner conformance suite on the local runner (the Ray runner's is in tests/test_ray.py)."""

import pytest

from tests.conformance.runner_suite import *  # noqa: F401,F403 - the suite's tests, collected here
from tests.conformance.runner_suite import SPEC
from tuner.exec.evaluate import Evaluator


@pytest.fixture
def make_evaluator():
    return lambda skeleton, settings, workdir: Evaluator("null", SPEC, skeleton, settings, workdir)

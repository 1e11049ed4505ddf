import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(ROOT))


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    # One per session: the cpu backend measures the machine's ceilings once and caches them.
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture
def fast_settings(tmp_path, cache_dir):
    """Settings that keep timing short: tests check behaviour, never speed."""
    from tuner.core.settings import Settings
    return Settings(runs_dir=str(tmp_path / "runs"), cache_dir=cache_dir,
                    bench_budget_s=0.01, warmup_s=0.0, min_reps=3, max_reps=20,
                    run_timeout_s=20.0, compile_timeout_s=30.0, compile_workers=2)


@pytest.fixture
def priors_given(monkeypatch) -> list:
    """The `prior` each guided GuidedSearch made from now on was given (one entry per GuidedSearch)."""
    from tuner.search import guided as strategy
    given: list = []
    init = strategy.GuidedSearch.__init__

    def spy(self, *args, **kw):
        given.append(kw.get("prior", ()))
        init(self, *args, **kw)

    monkeypatch.setattr(strategy.GuidedSearch, "__init__", spy)
    return given


def pytest_collection_modifyitems(config, items):
    """Accelerator tests run where the accelerator is; elsewhere they are skipped, not failed."""
    try:
        import torch
        has_cuda = torch.cuda.is_available()
        has_npu = hasattr(torch, "npu") and torch.npu.is_available()
    except ImportError:
        has_cuda = has_npu = False
    for item in items:
        if "cuda" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs an NVIDIA GPU"))
        if "npu" in item.keywords and not has_npu:
            item.add_marker(pytest.mark.skip(reason="needs an Ascend NPU"))

"""tuner: a search-based kernel autotuner whose search spaces are written as skeletons."""

__version__ = "0.1.0"

from tuner.core.values import Build, Config, DeviceInfo, Measurement, OpSpec, Record, RunMeta, Status  # noqa: E402

# The Python API (tuner.api): imported when first used, so that `import tuner` stays light.
_API = ("Run", "tune", "sweep", "show", "report")


def __getattr__(name: str):
    if name in _API:
        from tuner import api
        return getattr(api, name)
    raise AttributeError(f"module 'tuner' has no attribute {name!r}")


__all__ = ["Build", "Config", "DeviceInfo", "Measurement", "OpSpec", "Record", "RunMeta", "Status", "__version__",
           *_API]

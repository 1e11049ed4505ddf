"""tuner: a search-based kernel autotuner whose search spaces are written as skeletons."""

__version__ = "0.1.0"

from tuner.core.values import Build, Config, DeviceInfo, Measurement, OpSpec, Record, RunMeta, Status  # noqa: E402

__all__ = ["Build", "Config", "DeviceInfo", "Measurement", "OpSpec", "Record", "RunMeta", "Status", "__version__"]

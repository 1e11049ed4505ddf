"""tuner: a search-based kernel autotuner whose search spaces are written as skeletons."""

__version__ = "0.1.0"

from .values import Build, Config, DeviceInfo, Measurement, OpSpec, Record, Status  # noqa: E402

__all__ = ["Build", "Config", "DeviceInfo", "Measurement", "OpSpec", "Record", "Status", "__version__"]

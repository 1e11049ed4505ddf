"""Waiting on a condition in tests that watch another process or thread."""

import time


def wait_for(predicate, timeout: float, step: float = 0.05) -> bool:
    """Poll `predicate` until it is true or `timeout` seconds pass; whether it became true."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step)
    return False

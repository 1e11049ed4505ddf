"""The verification pool: input sets and references kept per op, on the device too."""

import torch

from tuner import measure
from tuner.ops import builtin_spec, load_op


class HostBackend:
    """The device is the host; kernels are Python callables (what `launch` calls)."""

    def to_device(self, t):
        return t

    def to_host(self, t):
        return t

    def launch(self, kernel, args):
        kernel(*args)

    def sync(self):
        pass


def softmax_kernel(x, y):
    y.copy_(torch.softmax(x.float(), -1).to(y.dtype))


def test_interleaved_ops_do_not_regenerate_their_references(monkeypatch):
    calls = []
    real = measure._reference
    monkeypatch.setattr(measure, "_reference", lambda op, seed: calls.append(op.spec.key) or real(op, seed))
    monkeypatch.setattr(measure, "_pool", type(measure._pool)())
    backend = HostBackend()
    ops = [load_op(builtin_spec("softmax", f"{m}x64", "fp32")) for m in (8, 16, 32)]
    for _ in range(3):  # a sweep's bench worker switches between ops all the time
        for op in ops:
            for seed, ref in measure._rng.sample(measure._pooled(op), 2):
                assert measure.check(backend, softmax_kernel, op, seed, ref)[0] is None
    assert len(calls) == 3 * measure._POOL_SIZE  # one pool per op, made once


def test_a_stray_write_into_the_kept_inputs_is_caught_and_does_not_stay(monkeypatch):
    monkeypatch.setattr(measure, "_pool", type(measure._pool)())
    monkeypatch.setattr(measure, "_on_device", type(measure._on_device)())
    backend = HostBackend()
    op = load_op(builtin_spec("softmax", "8x64", "fp32"))
    seed, ref = measure._pooled(op)[0]
    assert measure.check(backend, softmax_kernel, op, seed, ref)[0] is None

    def scribbler(x, y):  # an out-of-bounds write that lands in the kept pristine copy
        softmax_kernel(x, y)
        measure._on_device[(measure._op_key(op), seed)][1][0].zero_()

    why, _, _ = measure.check(backend, scribbler, op, seed, ref)
    assert why and "wrote to its input x" in why
    # The kept copies were dropped: the next check starts again from the host's.
    assert measure.check(backend, softmax_kernel, op, seed, ref)[0] is None

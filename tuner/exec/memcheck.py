"""One checked launch of a compiled kernel, for a memory checker to run (the cuda backend runs
this module under compute-sanitizer's memcheck for the winner: `Backend.memcheck`).

    python -m tuner.exec.memcheck BACKEND ARTIFACT OP_JSON

Exit 0: the launch ran and its outputs, inputs and guard bands check; 3: they do not (the
reason on stderr). What the memory checker itself finds, it reports on its own. ARTIFACT `-`:
the process loads the op and sets up the device first, then reads the artifact's path from a
line of stdin, which must be all of stdin (started ahead, while the search runs:
`Backend.memcheck_ahead`); at the end of stdin without one it exits 0, having launched nothing;
with more than one line it exits 3."""

from __future__ import annotations

import json
import random
import sys


def main() -> int:
    from tuner.backends import get_backend
    from tuner.core import problem
    from tuner.core.ops import load_op
    from tuner.core.values import OpSpec
    from tuner.exec import checks
    problem.CHECKED_ELSEWHERE = True  # its parent's parent loaded and checked the op
    problem.COUNT_FLOPS = False  # read by nothing here
    backend_name, artifact, op_json = sys.argv[1:4]
    backend = get_backend(backend_name, 0)
    op = load_op(OpSpec.from_json(json.loads(op_json)))
    if artifact == "-":
        where = backend.data_device()
        if where is not None:  # the device's context, made now under the checker
            import torch
            torch.empty(1, device=where)
        # The whole of stdin, to its end: exactly the artifact's path. Anything more (another
        # path written first into the pipe by code in the process that holds it) is refused,
        # not read past: the check would otherwise be of a kernel the caller did not name.
        lines = [ln.strip() for ln in sys.stdin.read().splitlines() if ln.strip()]
        if not lines:
            return 0
        if len(lines) > 1:
            print(f"the checker's input held {len(lines)} lines, not one artifact path: refused", file=sys.stderr)
            return 3
        artifact = lines[0]
    kernel = backend.load(artifact, op)
    seed = random.SystemRandom().randrange(1, 2**31)
    why, _, _ = checks.check(backend, kernel, op, seed, checks.reference(op, seed, backend.data_device()))
    if why:
        print(why, file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())

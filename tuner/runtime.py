"""The public name of the serving runtime (`tuner.serve.runtime`): what user code and the
exported `tuned_kernels.py` modules import, so that they keep working wherever the runtime
lives inside the package.

    from tuner import runtime
    table = runtime.load("exported/tuning.json")
    y = table("softmax", x)
    runtime.patch(model, table)     # the model's calls routed to the tuned kernels; unpatch undoes it
"""

from tuner.serve.patch import patch, unpatch
from tuner.serve.runtime import Kernel, Table, load

__all__ = ["Kernel", "Table", "load", "patch", "unpatch"]

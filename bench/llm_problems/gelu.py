import torch
import torch.nn as nn


class Model(nn.Module):
    """GELU (exact, erf form), elementwise."""

    def forward(self, x):
        return torch.nn.functional.gelu(x)


batch_size = 64
dim = 16384


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []

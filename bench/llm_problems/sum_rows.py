import torch
import torch.nn as nn


class Model(nn.Module):
    """Sum over dim 1, keeping it (a row reduction)."""

    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.sum(x, dim=self.dim, keepdim=True)


batch_size = 4096
dim1 = 1024
reduce_dim = 1


def get_inputs():
    return [torch.randn(batch_size, dim1)]


def get_init_inputs():
    return [reduce_dim]

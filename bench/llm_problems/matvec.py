import torch
import torch.nn as nn


class Model(nn.Module):
    """Matrix-vector product A @ B, B a single column."""

    def forward(self, A, B):
        return torch.matmul(A, B)


M = 4096
K = 4096


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, 1)]


def get_init_inputs():
    return []

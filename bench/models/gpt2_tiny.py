"""A two-layer GPT-2 (transformers, built from its config with random weights: nothing is
downloaded), 2 sequences of 256 tokens, for `tuner profile` on the host. Its MLP's activation
(transformers' NewGELUActivation, the tanh GELU written as five elementwise ops) is a module
extracted whole; bench/models/gelu_tanh.c.j2 is a skeleton for it."""

import torch
from transformers import GPT2Config, GPT2Model


def get_model():
    cfg = GPT2Config(n_embd=256, n_layer=2, n_head=4, n_positions=512, vocab_size=1000,
                     bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return GPT2Model(cfg).eval()


def get_inputs():
    return [torch.randint(0, 1000, (2, 256))]

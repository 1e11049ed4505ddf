"""One Qwen2 decoder layer (transformers' own code, random weights: nothing downloaded) at
prefill: batch 1, TOKENS tokens, causal attention through SDPA. For `tuner profile` and
`tuner verify` (bench/decoder_layer.py). The sizes are a Llama-3-8B-like layer; the norms'
weights are drawn, not ones, so that a kernel that ignores them fails verification."""

import torch
from transformers import Qwen2Config
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding

HIDDEN, HEADS, KV_HEADS, INTER, TOKENS = 4096, 32, 8, 14336, 4096

config = Qwen2Config(hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                     intermediate_size=INTER, rms_norm_eps=1e-6, max_position_embeddings=2 * TOKENS)
config._attn_implementation = "sdpa"


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = Qwen2DecoderLayer(config, layer_idx=0)
        self.rope = Qwen2RotaryEmbedding(config)

    def forward(self, x):
        pos = torch.arange(x.shape[1], device=x.device)[None]
        return self.layer(x, position_ids=pos, position_embeddings=self.rope(x, pos))


def get_model():
    torch.manual_seed(0)
    m = Layer()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return m


def get_inputs():
    return [torch.randn(1, TOKENS, HIDDEN)]

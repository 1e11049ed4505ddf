"""One Qwen2 decoder layer (transformers' own code, random weights: nothing downloaded) at
decode as a server runs it: BATCH sequences, one new token each, attending to a CONTEXT-token
KV cache held in a `StaticCache` (preallocated; each step writes its token in place, where
transformers' DynamicCache concatenates the whole cache every step). Every call writes the
same position, so every call does the same work. For `tuner profile` and `tuner verify`
(bench/decoder_layer.py --models decode_static)."""

import torch
from transformers import Qwen2Config, StaticCache
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding

HIDDEN, HEADS, KV_HEADS, INTER, BATCH, CONTEXT = 4096, 32, 8, 14336, 16, 4096

config = Qwen2Config(hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                     intermediate_size=INTER, rms_norm_eps=1e-6, max_position_embeddings=2 * CONTEXT,
                     num_hidden_layers=1)
config._attn_implementation = "sdpa"


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = Qwen2DecoderLayer(config, layer_idx=0)
        self.rope = Qwen2RotaryEmbedding(config)
        self.cache = None

    def _cache(self, x):
        c = self.cache
        if c is None or c.layers[0].keys.device != x.device or c.layers[0].keys.dtype != x.dtype:
            g = torch.Generator(device=x.device).manual_seed(1)
            shape = (x.shape[0], KV_HEADS, CONTEXT, HIDDEN // HEADS)
            c = StaticCache(config=config, max_cache_len=CONTEXT + 1)
            c.update(torch.randn(shape, generator=g, device=x.device).to(x.dtype),
                     torch.randn(shape, generator=g, device=x.device).to(x.dtype), 0)
            self.cache = c
        return c

    def forward(self, x):
        cache = self._cache(x)
        pos = torch.full((x.shape[0], 1), CONTEXT, device=x.device)
        # One query against all CONTEXT + 1 cached positions: no mask needed.
        out = self.layer(x, position_ids=pos, position_embeddings=self.rope(x, pos), past_key_values=cache,
                         use_cache=True, cache_position=torch.tensor([CONTEXT], device=x.device))
        cache.layers[0].cumulative_length.fill_(CONTEXT)  # the next call writes the same slot
        return out


def get_model():
    torch.manual_seed(0)
    m = Layer()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return m


def get_inputs():
    return [torch.randn(BATCH, 1, HIDDEN)]

"""The decoder block: attention and an MLP (dense, or a mixture of experts) around pre-norms."""

from __future__ import annotations

from flax import nnx

from agentfly_jax.models.config import ModelConfig
from agentfly_jax.models.layers import MLP, Attention, RMSNorm
from agentfly_jax.models.moe import SparseMoeBlock
from agentfly_jax.models.sharding import HIDDEN_AXES, constrain


class DecoderLayer(nnx.Module):
  """Pre-norm block: x + attn(norm(x)); then + mlp(norm(x)). In a mixture-of-experts model
  (cfg.is_moe) layer `layer_idx`'s mlp is a models/moe.py SparseMoeBlock where cfg.is_moe_layer."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, layer_idx: int = 0):
    norm = dict(eps=cfg.rms_norm_eps, dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype)
    self.input_layernorm = RMSNorm(cfg.hidden_size, **norm)
    self.self_attn = Attention(cfg, rngs=rngs)
    self.post_attention_layernorm = RMSNorm(cfg.hidden_size, **norm)
    self.returns_route = cfg.is_moe
    self.sparse = cfg.is_moe_layer(layer_idx)
    if self.sparse:
      self.mlp = SparseMoeBlock(cfg, rngs=rngs)
    else:
      self.mlp = MLP(cfg, rngs=rngs)

  def __call__(self, x, cos, sin, mask, kv=None, cache_index=None, routed=None):
    """x [B, T, D] -> ([B, T, D], new (k, v) or None); see Attention for the other args. In a
    mixture-of-experts model: ([B, T, D], new (k, v) or None, RouterOut or None (a dense layer)),
    `routed` int32[B, T, k] the experts to use (router replay) or None (the router's top k)."""
    attn_out, new_kv = self.self_attn(self.input_layernorm(x), cos, sin, mask, kv, cache_index)
    x = x + attn_out
    h = self.post_attention_layernorm(x)
    if self.sparse:
      y, route = self.mlp(h, routed)
    else:
      y, route = self.mlp(h), None
    x = constrain(x + y, HIDDEN_AXES)
    return (x, new_kv, route) if self.returns_route else (x, new_kv)

"""The layer layout the engine decodes on: the policy's own, or its decoder layers stacked under `lax.scan`.

    twin = scanned_twin(model, rest)           # None when `model` is scanned already; raises when it cannot be
    graphdef, params = twin.decode_copy(params, kernel_layout)   # unrolled params -> the scanned decode copy

A scanned program traces and compiles one decoder layer instead of L, so the engine's program set compiles
several times faster (SmolLM2-135M, 30 layers, on this project's CPU machine: lab/results/engine_compile.md)
and decodes as fast (the pages ride in the scan's carry: models/causal_lm.scan_paged_layers). The price is one stacked copy of the weights, which the CPU decode already
pays for its transposed kernels ("out_in"), so `decode_layers="auto"` stacks only where that copy is made anyway.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
from flax import nnx

from agentfly_jax.models.layer_stack import stack_layers
from agentfly_jax.models.layers import set_kernel_layout

DECODE_LAYERS = ("auto", "scanned", "model")


@dataclasses.dataclass(frozen=True)
class ScannedTwin:
  """An abstract copy of the policy with `scan_layers=True`: its graph, its (stacked) non-param state, and the
  module whose config the engine reads (cache layout, vision settings)."""

  graphdef: Any
  rest: Any
  module: nnx.Module

  graphdefs: dict = dataclasses.field(default_factory=dict)  # kernel layout -> the decode model's graphdef

  def decode_copy(self, params: nnx.State, kernel_layout: str) -> tuple[Any, nnx.State]:
    """(graphdef, params) of the scanned decode model for the unrolled policy `params`, made in one jitted pass
    (stacking and the kernels' layout together: one copy of the weights); the caller's arrays are not touched."""
    if kernel_layout not in self.graphdefs:

      def split(params):
        model = set_kernel_layout(nnx.merge(self.graphdef, stack_layers(params), self.rest), kernel_layout)
        self.graphdefs[kernel_layout] = nnx.split(model, nnx.Param, ...)[0]
        return 0

      jax.eval_shape(split, params)  # the graphdef is static: read it from an abstract pass
    return self.graphdefs[kernel_layout], _stacked_params(self.graphdef, self.rest, kernel_layout, params)


@functools.partial(jax.jit, static_argnums=(0, 2))
def _stacked_params(graphdef, rest, kernel_layout: str, params: nnx.State) -> nnx.State:
  """The unrolled `params` stacked into the scanned graph `graphdef` with their kernels in `kernel_layout`."""
  model = set_kernel_layout(nnx.merge(graphdef, stack_layers(params), rest), kernel_layout)
  return nnx.state(model, nnx.Param)


def _shapes(state: nnx.State) -> dict:
  return {path: tuple(getattr(leaf, "shape", ())) for path, leaf in nnx.to_flat_state(state)}


def scanned_twin(model: nnx.Module, rest: nnx.State) -> ScannedTwin | None:
  """The scanned twin of `model` (an unrolled CausalLM / Qwen25VL), None when `model` is scanned already.

  Raises ValueError naming why when the policy has no scanned form the engine can use: decoder layers that
  differ (an MoE's mlp_only_layers), LoRA adapters (their sync writes unrolled paths), or a state that does
  not stack into the twin's.
  """
  cfg = getattr(model, "config", None)
  if cfg is None or not hasattr(cfg, "scan_layers"):
    raise ValueError(f"{type(model).__name__} has no ModelConfig with scan_layers")
  if cfg.scan_layers:
    return None
  if any(isinstance(v, nnx.LoRAParam) for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param))):
    raise ValueError("the policy carries LoRA adapters (their sync writes the unrolled layout)")
  scanned_cfg = dataclasses.replace(cfg, scan_layers=True)  # raises when the layers are not all alike
  module = nnx.eval_shape(lambda: type(model)(scanned_cfg, rngs=nnx.Rngs(0)))
  graphdef, params, twin_rest = nnx.split(module, nnx.Param, ...)
  stacked = jax.eval_shape(stack_layers, nnx.state(model, nnx.Param))
  if _shapes(stacked) != _shapes(params):
    raise ValueError(f"{type(model).__name__}'s params do not stack into its scanned layout")
  stacked_rest = stack_layers(rest)
  if _shapes(stacked_rest) != _shapes(twin_rest):
    raise ValueError(f"{type(model).__name__}'s non-param state does not stack into its scanned layout")
  return ScannedTwin(graphdef=graphdef, rest=stacked_rest, module=module)

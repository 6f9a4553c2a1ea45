"""LoRA: low-rank adapters inside the projections of a causal LM (or critic), the base frozen.

    cfg = LoRAConfig(rank=16, alpha=32.0, targets=("q", "k", "v", "o", "gate", "up", "down"))
    apply_lora(model, cfg, rngs=nnx.Rngs(0))          # in place: matching Linears get adapters
    adapters = nnx.state(model, nnx.LoRAParam)        # what trains, syncs and is checkpointed
    graphdef, adapters, base = nnx.split(model, nnx.LoRAParam, ...)
    merged = merge_lora(model)                        # a model with W + A B * alpha / r, no adapters

Each targeted `layers.Linear` owns `lora_a` [in, rank] and `lora_b` [rank, out] (leading dims as
its kernel's: [L, ...] in a stacked layer), `nnx.LoRAParam`s (a subclass of nnx.Param) in
float32, with logical axes (in's name, "lora_rank") / ("lora_rank", out's name); y = x W (+ b) +
(x A) B * alpha / rank, B zero-initialised (the model is unchanged until B trains). The adapter
is applied in `Linear.__call__` and in `cpu_kernels.fused_linear` (a mixture-of-experts model's
experts, targets expert_gate / expert_up / expert_down: lora_a [E, in, r], lora_b [E, r, out],
applied with the grouped matmuls of models/moe.py). Only the decoder layers' seven
projections can be targets: the lm_head's and the critic head's kernels are read directly by the
chunked log-prob scan and the value head.

Why our own adapter rather than qwix's LoRA (measured on this CPU, tiny Llama): qwix finds the
weight of each intercepted `dot_general` by identity, so with `fuse_projections` (q/k/v and
gate/up as one GEMM over concatenated kernels, our default for >= 256 rows) it silently gave
adapters to 2 of 7 projections per layer (o, down), and at decode (unfused) it would ask for new
ones; ours lives in the Linear and is the same in both paths.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentfly_jax.models.layers import Linear
from agentfly_jax.models.sharding import logical_axes, param_with_axes

# logical target name -> the module path suffix inside a decoder layer
TARGET_NAMES = {
  "q": "self_attn.q_proj",
  "k": "self_attn.k_proj",
  "v": "self_attn.v_proj",
  "o": "self_attn.o_proj",
  "gate": "mlp.gate_proj",
  "up": "mlp.up_proj",
  "down": "mlp.down_proj",
}
ALL_TARGETS = tuple(TARGET_NAMES)  # the dense projections (the default)
# a mixture-of-experts layer's experts (models/moe.py ExpertLinear: one adapter per expert)
TARGET_NAMES.update(
  expert_gate="mlp.experts.gate_proj", expert_up="mlp.experts.up_proj", expert_down="mlp.experts.down_proj"
)


def _parse_targets(targets, field: str) -> tuple[str, ...]:
  if isinstance(targets, str):
    targets = [t.strip() for t in targets.split(",")]
  targets = tuple(t for t in targets if t)
  if not targets:
    raise ValueError(f"{field}: no targets given; use logical names {ALL_TARGETS} or path patterns")
  for t in targets:
    if t in TARGET_NAMES:
      continue
    try:
      re.compile(t)
    except re.error as e:
      raise ValueError(
        f"{field}: {t!r} is neither a logical name {ALL_TARGETS} nor a valid path pattern (regular expression): {e}"
      ) from None
  return targets


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
  """rank (>= 1), alpha (scale = alpha / rank), targets: logical names q k v o gate up down, or
  regular expressions searched in a projection's dotted path (e.g. `layers\\.(0|1)\\..*q_proj`);
  a comma-separated string is accepted. `field` names the config field in error messages."""

  rank: int = 16
  alpha: float = 32.0
  targets: tuple = ALL_TARGETS
  field: str = "model.lora"

  def __post_init__(self):
    if isinstance(self.rank, bool) or not isinstance(self.rank, (int, np.integer)) or self.rank < 1:
      raise ValueError(f"{self.field}.rank must be an int >= 1, got {self.rank!r}")
    if not isinstance(self.alpha, (int, float)) or not self.alpha > 0:
      raise ValueError(f"{self.field}.alpha must be a number > 0, got {self.alpha!r}")
    object.__setattr__(self, "rank", int(self.rank))
    object.__setattr__(self, "targets", _parse_targets(self.targets, f"{self.field}.targets"))

  @property
  def scale(self) -> float:
    return float(self.alpha) / self.rank


def module_path(path: tuple) -> str:
  return ".".join(str(p) for p in path)


def _is_target(path: str, target: str) -> bool:
  if target in TARGET_NAMES:
    return path.endswith("." + TARGET_NAMES[target])
  return re.search(target, path) is not None


def lora_candidates(model: nnx.Module) -> list[tuple[str, Linear]]:
  """(dotted path, Linear) of the projections that may carry adapters: those of the decoder layers."""
  return [
    (module_path(p), m)
    for p, m in nnx.iter_modules(model)
    if isinstance(m, Linear) and ".layers" in "." + module_path(p)
  ]


def apply_lora(model: nnx.Module, cfg: LoRAConfig, *, rngs: nnx.Rngs) -> nnx.Module:
  """Adds adapters (zero B) to every decoder-layer projection that a target of `cfg` matches, in
  place; returns `model`. Raises ValueError naming the target that matches no projection, or the
  projection that already has adapters."""
  candidates = lora_candidates(model)
  chosen = []
  for target in cfg.targets:
    hits = [(p, m) for p, m in candidates if _is_target(p, target)]
    if not hits:
      names = [p for p, _ in candidates[:3]]
      raise ValueError(
        f"{cfg.field}.targets: {target!r} matches no projection of the model "
        f"(logical names: {ALL_TARGETS}; patterns are searched in paths like {names})"
      )
    chosen.extend(h for h in hits if all(h[1] is not m for _, m in chosen))
  for path, linear in sorted(chosen, key=lambda h: h[0]):
    if linear.lora_a is not None:
      raise ValueError(f"{cfg.field}: {path} already has LoRA adapters")
    linear.add_lora(cfg.rank, cfg.alpha, rngs.params())
  return model


def has_lora(model: nnx.Module) -> bool:
  return any(isinstance(m, Linear) and m.lora_a is not None for _, m in nnx.iter_modules(model))


def lora_filter(*extra):
  """The nnx filter of what trains under LoRA: the adapters (+ `extra` filters, e.g. the critic's
  value head `nnx.PathContains("score")`)."""
  return nnx.Any(nnx.LoRAParam, *extra) if extra else nnx.LoRAParam


def merged_kernel(linear: Linear) -> jax.Array:
  """The kernel with the adapter folded in, in the Linear's layout and the kernel's dtype:
  W + A B * scale (in_out) or its [out, in] transpose."""
  delta = (
    jnp.matmul(linear.lora_a[...].astype(jnp.float32), linear.lora_b[...].astype(jnp.float32), precision="highest")
    * linear.lora_scale
  )
  if linear.kernel_layout == "out_in":
    delta = jnp.swapaxes(delta, -1, -2)
  kernel = linear.kernel[...]
  return (kernel.astype(jnp.float32) + delta).astype(kernel.dtype)


def merge_lora(model: nnx.Module) -> nnx.Module:
  """A model equal to `model` with every adapter folded into its kernel and removed (a new
  module tree; `model` and its arrays are untouched; unadapted params are shared, not copied)."""
  graphdef, state = nnx.split(model)
  merged = nnx.merge(graphdef, state)
  for _, m in nnx.iter_modules(merged):
    if isinstance(m, Linear) and m.lora_a is not None:
      m.kernel = param_with_axes(merged_kernel(m), logical_axes(m.kernel))
      m.lora_a = nnx.data(None)
      m.lora_b = nnx.data(None)
      m.lora_scale = 0.0
  return merged


def base_params(model: nnx.Module) -> nnx.State:
  """The frozen base: every nnx.Param that is not an adapter."""
  return nnx.state(model, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam)))


def params_sha256(state: nnx.State) -> str:
  """sha256 over the params' paths, dtypes, shapes and bytes in path order: the identity of a
  base (checkpoints hold it instead of the weights)."""
  h = hashlib.sha256()
  for path, var in sorted(nnx.to_flat_state(state), key=lambda pv: module_path(pv[0])):
    value = np.asarray(jax.device_get(var[...] if isinstance(var, nnx.Variable) else var))
    h.update(f"{module_path(path)}|{value.dtype}|{value.shape}".encode())
    h.update(np.ascontiguousarray(value).tobytes())
  return h.hexdigest()


def adapter_bytes(state) -> int:
  """Bytes of the arrays in `state` (e.g. the adapters a sync moves)."""
  return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state)))


def lora_config_from(config_section, field: str = "model.lora") -> LoRAConfig | None:
  """LoRAConfig from an ml_collections section {rank, alpha, targets} (rank 0 = off: None)."""
  if config_section is None or config_section.get("rank", 0) == 0:
    return None
  return LoRAConfig(
    rank=config_section.rank,
    alpha=config_section.get("alpha", 32.0),
    targets=config_section.get("targets", ",".join(ALL_TARGETS)),
    field=field,
  )


def target_paths(model: nnx.Module) -> list[str]:
  """Dotted paths of the Linears that carry adapters, sorted."""
  return sorted(p for p, m in lora_candidates(model) if m.lora_a is not None)


__all__ = [
  "ALL_TARGETS",
  "LoRAConfig",
  "TARGET_NAMES",
  "adapter_bytes",
  "apply_lora",
  "base_params",
  "has_lora",
  "lora_candidates",
  "lora_config_from",
  "lora_filter",
  "merge_lora",
  "merged_kernel",
  "params_sha256",
  "target_paths",
]

"""The training state: a pure pytree of arrays, so `train_step` can be jitted with donation.

Models are Flax NNX modules; for jit we split them once into a static `graphdef` (kept outside
the state) and an `nnx.State` of params (inside it). `TrainState` carries policy params and
optimizer state, optionally the critic's (PPO), the step and an RNG key.
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax
from flax import nnx


LR_SCHEDULES = ("constant", "cosine", "linear")  # make_optimizer's (config.train.schedule)


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32[]
  params: Any  # nnx.State of the policy's nnx.Param variables
  opt_state: Any  # optax state of the policy optimizer
  critic_params: Any = None  # nnx.State of the critic (PPO) or None
  critic_opt_state: Any = None
  rng: jax.Array | None = None  # uint32[2] key data


def make_optimizer(
  *,
  lr: float,
  warmup_steps: int = 0,
  total_steps: int = 0,
  schedule: str = "constant",
  weight_decay: float = 0.0,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  max_grad_norm: float = 1.0,
) -> optax.GradientTransformation:
  """AdamW with global-norm clipping and a warmup + (constant | cosine | linear) schedule."""
  if lr <= 0:
    raise ValueError(f"optimizer lr must be > 0, got {lr}")
  if schedule == "constant":
    decay = optax.constant_schedule(lr)
  elif schedule == "cosine":
    decay = optax.cosine_decay_schedule(lr, max(1, total_steps - warmup_steps))
  elif schedule == "linear":
    decay = optax.linear_schedule(lr, 0.0, max(1, total_steps - warmup_steps))
  else:
    raise ValueError(f"unknown lr schedule {schedule!r}; known: {', '.join(LR_SCHEDULES)}")
  if warmup_steps > 0:
    decay = optax.join_schedules([optax.linear_schedule(0.0, lr, warmup_steps), decay], [warmup_steps])
  parts = []
  if max_grad_norm and max_grad_norm > 0:
    parts.append(optax.clip_by_global_norm(max_grad_norm))
  parts.append(optax.adamw(decay, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay))
  return optax.chain(*parts)


def split_params(model: nnx.Module):
  """(graphdef, params, rest): params are the nnx.Param variables; rest must be empty of arrays."""
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  return graphdef, params, rest


def create_train_state(params, optimizer, *, critic_params=None, critic_optimizer=None, seed: int = 0) -> TrainState:
  return TrainState(
    step=jnp.zeros((), jnp.int32),
    params=params,
    opt_state=optimizer.init(params),
    critic_params=critic_params,
    critic_opt_state=None if critic_params is None else critic_optimizer.init(critic_params),
    rng=jax.random.key_data(jax.random.key(seed)),
  )

"""One RL update from a rollout batch: jitted prepare, then epochs x minibatches of train steps.

    updater = PolicyUpdate(parts, config, state_sharding)
    state, metrics = updater(state, ref_params, arrays, step)   # metrics: device scalars

Everything stays on device between the rollout's arrays and the new state: the padded batch goes
up once, `prepare` (rl/prepare.py) adds log-probs / values / advantages in one call, each
minibatch is gathered on device from it, and the step's metrics come back as device scalars for
the caller to fetch once (`fetch_metrics`).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from agentfly_jax.rl.batching import microbatch_index, pad_rows, take_microbatches
from agentfly_jax.rl.prepare import PrepareConfig, make_prepare
from agentfly_jax.rl.train_step import batch_sharding, jit_step, make_train_step


@dataclasses.dataclass(frozen=True)
class ModelParts:
  """The static halves of the models (nnx graphdefs + non-param state) and the optimizers."""
  graphdef: Any
  rest: Any
  optimizer: Any
  critic_graphdef: Any = None
  critic_rest: Any = None
  critic_optimizer: Any = None


def put_global(x: np.ndarray, sharding) -> jax.Array:
  """Host array (the same on every process) -> global array with `sharding`."""
  x = np.asarray(x)
  return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def fetch_metrics(device_metrics: list[dict]) -> dict[str, float]:
  """One device->host transfer for a list of metric dicts; returns each key's mean as float."""
  host = jax.device_get(device_metrics)
  keys = sorted({k for m in host for k in m})
  return {k: float(np.mean([np.asarray(m[k], np.float64) for m in host if k in m])) for k in keys}


class PolicyUpdate:
  """prepare + the minibatch loop for one algorithm/config; jitted functions built once."""

  def __init__(self, parts: ModelParts, config, loss_cfg, estimator: str, mesh, state_sharding):
    c = config
    self.config, self.mesh, self.state_sharding = c, mesh, state_sharding
    self.prepare = make_prepare(parts.graphdef, parts.rest, PrepareConfig(
        estimator=estimator, chunk=c.train.micro_batch_size, temperature=loss_cfg.temperature,
        gamma=c.loss.gamma, lam=c.loss.lam, tis_cap=c.loss.tis_cap,
        overlong_max_tokens=c.rollout.max_total_tokens, overlong_buffer=c.dapo.overlong_buffer,
        overlong_factor=c.dapo.overlong_penalty,
        behaviour_logprobs=loss_cfg.policy_loss == "decoupled_ppo"),
        critic_graphdef=parts.critic_graphdef, critic_rest=parts.critic_rest)
    self._step_fn = make_train_step(parts.graphdef, parts.rest, parts.optimizer, loss_cfg,
                                    critic_graphdef=parts.critic_graphdef,
                                    critic_rest=parts.critic_rest,
                                    critic_optimizer=parts.critic_optimizer)
    self._rows = NamedSharding(mesh, P("fsdp"))
    self._replicated = NamedSharding(mesh, P())
    self._steps: dict[tuple, Any] = {}
    self._takes: dict[tuple, Any] = {}

  def _jitted(self, keys: tuple):
    if keys not in self._steps:
      batch_sh = batch_sharding(self.mesh, dict.fromkeys(keys))
      self._steps[keys] = jit_step(self._step_fn, self.state_sharding, batch_sh)
      self._takes[keys] = jax.jit(take_microbatches, out_shardings=batch_sh)
    return self._steps[keys], self._takes[keys]

  def put_arrays(self, arrays: dict) -> dict:
    """`train_arrays` output -> global arrays, rows padded to a multiple of the fsdp axis and
    split over it."""
    arrays = pad_rows(arrays, self.mesh.shape["fsdp"])
    return {k: put_global(v, self._rows) for k, v in arrays.items()}

  def __call__(self, state, ref_params, arrays: dict, step: int):
    """arrays: `rl.batching.train_arrays` of the step's trajectories (host numpy).
    Returns (new state, list of device metric dicts: prepare's, then one per train step)."""
    c = self.config
    num_rows = len(arrays["group_ids"])
    batch, prep_metrics = self.prepare(state.params, ref_params, state.critic_params,
                                       self.put_arrays(arrays))
    full_b = c.rollout.rows_per_step * c.rollout.num_chains
    per_mini = -(-full_b // c.train.minibatches)
    num_micro = -(-per_mini // c.train.micro_batch_size)
    rng = np.random.default_rng([c.seed, step])
    step_fn, take = self._jitted(tuple(sorted(batch)))
    metrics = [prep_metrics]
    for _ in range(c.train.epochs):
      perm = rng.permutation(num_rows)
      for rows in np.array_split(perm, c.train.minibatches):
        if len(rows) == 0:
          continue
        idx, valid = microbatch_index(rows, c.train.micro_batch_size, num_micro)
        mb = take(batch, put_global(idx, self._replicated), put_global(valid, self._replicated))
        state, m = step_fn(state, mb)
        metrics.append(m)
    return state, metrics


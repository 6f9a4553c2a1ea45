"""One RL update from a rollout batch: jitted prepare, then epochs x minibatches of train steps.

    updater = PolicyUpdate(parts, spec, loss_cfg, estimator, mesh, state_sharding)
    state, metrics = updater(state, ref_params, arrays, step)   # metrics: UpdateMetrics
    metrics.fetch()                                             # {name: float}, one device->host fetch

Everything stays on device between the rollout's arrays and the new state: the padded batch goes
up once, `prepare` (rl/core/prepare.py) adds log-probs / values / advantages in one call, each
minibatch is gathered on device from it, and the step's metrics come back as device scalars for
the caller to fetch once (`UpdateMetrics.fetch`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from agentfly_jax.rl.batching import (
  micro_batch_layout,
  microbatch_index,
  minibatch_layout,
  pad_rows,
  take_microbatches,
)
from agentfly_jax.rl.packing import pack_index, take_packed
from agentfly_jax.rl.core.prepare import PrepareConfig, make_prepare, make_teacher_logprobs
from agentfly_jax.rl.core.train_step import batch_sharding, jit_step, make_train_step
from agentfly_jax.rl.spec_section import view


@dataclasses.dataclass(frozen=True)
class ModelParts:
  """The static halves of the models (nnx graphdefs + non-param state) and the optimizers."""

  graphdef: Any
  rest: Any
  optimizer: Any
  critic_graphdef: Any = None
  critic_rest: Any = None
  critic_optimizer: Any = None
  teacher: Any = None  # on-policy distillation: the teacher's rl/setup.ModelHalves (None: no teacher)


def put_global(x: np.ndarray, sharding) -> jax.Array:
  """Host array (the same on every process) -> global array with `sharding`."""
  x = np.asarray(x)
  return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def fetch_metrics(device_metrics: list[dict]) -> dict[str, float]:
  """One device->host transfer for a list of metric dicts; returns each key's mean as float."""
  host = jax.device_get(device_metrics)
  keys = sorted({k for m in host for k in m})
  return {k: float(np.mean([np.asarray(m[k], np.float64) for m in host if k in m])) for k in keys}


@dataclasses.dataclass(frozen=True)
class UpdateMetrics:
  """What one update measured: `device`, metric dicts of device scalars (prepare's, then one per
  train step); `prepare_s`, the prepare call's wall time (old / ref log-probs, values,
  advantages); `padding_fraction`, of the token slots the train steps computed (None: no step)."""

  device: list
  prepare_s: float
  padding_fraction: float | None

  def fetch(self) -> dict[str, float]:
    """The step's metrics as floats (one device->host transfer): the device metrics' means,
    time/prepare_s, train/padding_fraction."""
    out = fetch_metrics(self.device)
    out["time/prepare_s"] = self.prepare_s  # (inside time/train_s)
    if self.padding_fraction is not None:
      out["train/padding_fraction"] = self.padding_fraction
    return out


def default_prepare_config(estimator: str, **fields) -> PrepareConfig:
  """The prepare call of a default run (`RunSpec()` on one device: its rows per forward pass, its loss's
  temperature and chunking, the spec's gamma / lam / DAPO settings) for `estimator`, with `fields`
  replaced: a PrepareConfig outside a run (tests, benchmarks)."""
  from agentfly_jax.rl.programs import default_loss_config
  from agentfly_jax.rl.spec import RunSpec

  spec = RunSpec()
  chunk = micro_batch_layout(spec.rollout.rows_per_step * spec.rollout.num_chains, spec.train.micro_batch_size, 1)[0]
  return dataclasses.replace(prepare_config(spec, default_loss_config(), estimator, chunk), **fields)


def prepare_config(spec, loss_cfg, estimator: str, chunk: int) -> PrepareConfig:
  """The prepare call's config from the run's typed sections and its loss (`loss_cfg`: the
  temperature and the log-prob chunking it trains with; decoupled PPO needs the sampler's
  log-probs)."""
  return view(  # gamma, lam, tis_cap: config.loss's
    PrepareConfig,
    spec.loss,
    estimator=estimator,
    chunk=chunk,
    temperature=loss_cfg.temperature,
    logits_chunk=loss_cfg.logits_chunk,
    logits_capacity=loss_cfg.logits_capacity,
    overlong_max_tokens=spec.rollout.max_total_tokens,
    overlong_buffer=spec.dapo.overlong_buffer,
    overlong_factor=spec.dapo.overlong_penalty,
    behaviour_logprobs=loss_cfg.policy_loss == "decoupled_ppo",
  )


class PolicyUpdate:
  """prepare + the minibatch loop for one algorithm/config; jitted functions built once.
  `spec`: the run's RunSpec (parsed once at the script)."""

  def __init__(self, parts: ModelParts, spec, loss_cfg, estimator: str, mesh, state_sharding):
    self.spec, self.mesh, self.state_sharding = spec, mesh, state_sharding
    rules = spec.mesh.rules
    self.prepare_chunk = micro_batch_layout(
      spec.rollout.rows_per_step * spec.rollout.num_chains, spec.train.micro_batch_size, mesh.shape["fsdp"]
    )[0]
    prep_cfg = prepare_config(spec, loss_cfg, estimator, self.prepare_chunk)
    self.prepare = make_prepare(
      parts.graphdef,
      parts.rest,
      prep_cfg,
      critic_graphdef=parts.critic_graphdef,
      critic_rest=parts.critic_rest,
      mesh=mesh,
      rules=rules,
    )
    self._step_fn = make_train_step(
      parts.graphdef,
      parts.rest,
      parts.optimizer,
      loss_cfg,
      critic_graphdef=parts.critic_graphdef,
      critic_rest=parts.critic_rest,
      critic_optimizer=parts.critic_optimizer,
      mesh=mesh,
      rules=rules,
    )
    # the models' non-trained state (LoRA: the frozen base) goes in as an argument, never a constant
    self.frozen = (parts.rest, parts.critic_rest)
    self._rows = NamedSharding(mesh, P("fsdp"))
    self._replicated = NamedSharding(mesh, P())
    self._steps: dict[tuple, Any] = {}
    self._takes: dict[tuple, Any] = {}
    self._pack = jax.jit(take_packed)

    self.teacher = parts.teacher
    if parts.teacher is not None:  # its log-probs of the batch's tokens, before each prepare (rl/core/distill.py)
      self._teacher = make_teacher_logprobs(parts.teacher.graphdef, prep_cfg, mesh=mesh, rules=rules)

  def minibatch_layout(self) -> tuple[int, int]:
    """(rows per micro-batch, micro-batches per minibatch) of this run's train steps."""
    return minibatch_layout(self.spec.rollout, self.spec.train, self.mesh.shape["fsdp"])

  def step_program(self, keys) -> Any:
    """The jitted train step for micro-batches holding `keys` (built once per key set)."""
    return self._jitted(tuple(keys))[0]

  def _jitted(self, keys: tuple):
    keys = tuple(sorted(keys))
    if keys not in self._steps:
      batch_sh = batch_sharding(self.mesh, dict.fromkeys(keys))
      self._steps[keys] = jit_step(self._step_fn, self.state_sharding, batch_sh, self.frozen)
      self._takes[keys] = jax.jit(take_microbatches, out_shardings=batch_sh)
    return self._steps[keys], self._takes[keys]

  def put_arrays(self, arrays: dict) -> dict:
    """`train_arrays` output -> global arrays, rows padded to a multiple of the fsdp axis and
    split over it. The sampler's routes ("rollout_experts", a mixture-of-experts policy) go in as
    "routed_experts" under `model.router_replay=rollout` (prepare and the train step route by them), else as
    they are (only measured: router/rollout_mismatch)."""
    arrays = pad_rows(arrays, self.mesh.shape["fsdp"])
    if self.spec.model.router_replay == "rollout" and "rollout_experts" in arrays:
      arrays = {("routed_experts" if k == "rollout_experts" else k): v for k, v in arrays.items()}
    return {k: put_global(v, self._rows) for k, v in arrays.items()}

  def __call__(self, state, ref_params, arrays: dict, step: int):
    """arrays: `rl.batching.train_arrays` of the step's trajectories (host numpy).
    Returns (new state, UpdateMetrics: device metric dicts, prepare time, padding)."""
    train = self.spec.train
    t0 = time.perf_counter()
    num_rows = len(arrays["group_ids"])
    device_arrays = self.put_arrays(arrays)
    if self.teacher is not None:
      device_arrays["teacher_logprobs"] = self._teacher(self.teacher.params, self.teacher.rest, device_arrays)
    batch, prep_metrics = self.prepare(state.params, ref_params, state.critic_params, device_arrays, self.frozen)
    jax.block_until_ready(batch)
    prepare_s = time.perf_counter() - t0  # old (+ ref) log-probs, values, advantages
    micro_size, num_micro = self.minibatch_layout()
    rng = np.random.default_rng([self.spec.seed, step])
    pack = train.pack_sequences
    keys = tuple(batch) + (("segment_ids", "positions") if pack else ())
    step_fn, take = self._jitted(keys)
    host_mask = np.asarray(arrays["attention_mask"], bool)
    metrics = [prep_metrics]
    pad = []
    for _ in range(train.epochs):
      perm = rng.permutation(num_rows)
      for rows in np.array_split(perm, train.minibatches):
        if len(rows) == 0:
          continue
        source = batch
        if pack:  # several trajectories per row: fewer micro-batches (M shrinks with the padding saved)
          index, layout = pack_index(host_mask, rows)
          source = self._pack(batch, {k: put_global(v, self._replicated) for k, v in index.items()})
          rows, num_micro_here = np.arange(layout.num_rows), -(-layout.num_rows // micro_size)
          real = int(index["valid"].sum())
        else:
          num_micro_here = num_micro
          real = int(host_mask[rows].sum())
        pad.append(1.0 - real / (micro_size * max(num_micro_here, -(-len(rows) // micro_size)) * host_mask.shape[1]))
        idx, valid = microbatch_index(rows, micro_size, num_micro_here)
        mb = take(source, put_global(idx, self._replicated), put_global(valid, self._replicated))
        state, m = step_fn(state, mb, self.frozen)
        metrics.append(m)
    padding = float(np.mean(pad)) if pad else None  # of the slots the steps computed
    return state, UpdateMetrics(metrics, prepare_s, padding)

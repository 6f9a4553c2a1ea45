"""One jitted device call from the rollout's padded arrays to the training batch.

    prepare = make_prepare(graphdef, rest, PrepareConfig(...), critic_graphdef=..., critic_rest=...)
    batch, metrics = prepare(params, ref_params, critic_params, arrays)   # all on device

`arrays` are `rl.batching.train_arrays` (target-aligned [B, L], already shifted). One call gives
the trainer's log-probs of the sampled tokens (old), the reference policy's (KL), the critic's
values (PPO), the truncated importance weights, the (DAPO overlong-penalised) scores' advantages
and returns, and the metrics of the sampler/trainer mismatch and of the advantages. Forward
passes run over fixed chunks of `chunk` rows (`lax.map`), so memory stays that of one chunk; the
log-probs of a chunk come from its hidden states `logits_chunk` tokens at a time, so no
[chunk, L, V] logits array exists either.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from agentfly_jax.models.sharding import activation_sharding
from agentfly_jax.rl.core import advantages as adv_lib
from agentfly_jax.rl.core.distill import distill_advantages, distill_metrics
from agentfly_jax.rl.core.shaping import overlong_penalty
from agentfly_jax.rl.core.train_step import critic_values, policy_logprobs_entropy
from agentfly_jax.rl.core.vision import vision_inputs, vision_keys


@dataclasses.dataclass(frozen=True)
class PrepareConfig:
  """The prepare call's static settings. No defaults here: a run's come from its spec
  (rl/update.prepare_config), a standalone one's from a default run's (rl/update.default_prepare_config)."""

  estimator: str  # advantage estimator name (rl/core/advantages.py)
  chunk: int  # rows per forward pass
  logits_chunk: int  # tokens per step of the chunked log-prob scan; 0 = plain [chunk, L, V] logits
  logits_capacity: tuple  # log-probs only at action tokens (LossConfig.logits_capacity)
  temperature: float  # the sampler's temperature (log-probs of logits / T)
  gamma: float
  lam: float
  tis_cap: float  # > 0: is_weights = min(exp(old - sampler), tis_cap)
  overlong_max_tokens: int  # DAPO soft overlong penalty (buffer 0 = off)
  overlong_buffer: int
  overlong_factor: float
  behaviour_logprobs: bool  # pass the sampler's log-probs on (decoupled PPO)
  distill_weight: float  # with arrays["teacher_logprobs"]: the reverse-KL advantage's share (rl/core/distill.py)


def chunked_rows(fn, chunk: int, *arrays):
  """fn(*[chunk, ...] arrays) -> [chunk, ...] applied over the rows of [B, ...] arrays with
  `lax.map`; B is padded up to a multiple of `chunk` with copies of row 0 (sliced off again)."""
  b = arrays[0].shape[0]
  m = -(-b // chunk)
  pad = m * chunk - b

  def split(x):
    if pad:
      x = jnp.concatenate([x, jnp.broadcast_to(x[:1], (pad, *x.shape[1:]))])
    return x.reshape(m, chunk, *x.shape[1:])

  out = jax.lax.map(lambda xs: fn(*xs), tuple(split(x) for x in arrays))
  return out.reshape(m * chunk, *out.shape[2:])[:b]


def _masked_mean(x, mask):
  return jnp.sum(jnp.where(mask, x, 0.0)) / jnp.maximum(jnp.sum(mask), 1)


def action_logprobs(graphdef, params, rest, arrays: dict, cfg: PrepareConfig):
  """f32[B, L] log-probs (at temperature `cfg.temperature`) of the target tokens under the model
  (graphdef, params, rest), `cfg.chunk` rows per forward pass; 0 off the action tokens. With
  arrays["routed_experts"] int32[B, L, Lm, k] (router replay) a mixture-of-experts model routes by them."""
  model = nnx.merge(graphdef, params, rest)
  keys = ("input_ids", "target_ids", "attention_mask", "action_mask") + vision_keys(arrays)
  keys += ("routed_experts",) if "routed_experts" in arrays else ()

  def fn(*xs):
    rows = dict(zip(keys, xs))
    routed = rows.get("routed_experts")
    return policy_logprobs_entropy(
      model,
      *(rows[k] for k in keys[:3]),
      cfg.temperature,
      chunk=cfg.logits_chunk,
      loss_mask=rows["action_mask"],
      capacity=cfg.logits_capacity,
      routed_experts=None if routed is None else jnp.moveaxis(routed, 2, 0),  # [B, L, Lm, k] -> [Lm, B, L, k]
      vision=vision_inputs(rows),
    )[0]

  lp = chunked_rows(fn, cfg.chunk, *(arrays[k] for k in keys))
  return jnp.where(arrays["action_mask"], lp, 0.0)


def truncated_is_weights(old_logprobs, sampler_logprobs, mask, cap: float):
  """f32[B, L] truncated importance weights min(exp(old - sampler), cap) of the trainer's [B, L]
  log-probs against the sampler's (the log-ratio clipped to +-20); 0 off the `mask`ed tokens."""
  w = jnp.exp(jnp.clip(old_logprobs - sampler_logprobs, -20, 20))
  return jnp.where(mask, jnp.minimum(w, cap), 0.0)


def overlong_shaped_scores(scores, mask, group_ids, cfg: PrepareConfig):
  """(f32[B] scores + DAPO's soft overlong penalty of each row's action-token count (bool[B, L]
  `mask`), the penalty's mean f32[] over the real rows (group_ids int32[B] >= 0))."""
  pen = overlong_penalty(
    mask.sum(1), max_tokens=cfg.overlong_max_tokens, buffer=cfg.overlong_buffer, factor=cfg.overlong_factor
  )
  real = group_ids >= 0  # rows of `pad_rows` are not trajectories
  return scores + pen, jnp.sum(jnp.where(real, pen, 0.0)) / jnp.maximum(real.sum(), 1)


def chunked_critic_values(critic_graphdef, critic_params, critic_rest, arrays: dict, chunk: int):
  """f32[B, L] the critic's values at each position, `chunk` rows per forward pass."""
  critic = nnx.merge(critic_graphdef, critic_params, critic_rest)
  return chunked_rows(
    lambda ids, am, act: critic_values(critic, ids, am, act),
    chunk,
    arrays["input_ids"],
    arrays["attention_mask"],
    arrays["action_mask"],
  )


def _policy_batch(graphdef, rest, cfg: PrepareConfig, params, ref_params, arrays: dict) -> tuple[dict, dict]:
  """(the batch's token arrays + old / behaviour / reference log-probs and truncated IS weights as
  on, the mismatch/* metrics of the sampler's log-probs against the trainer's)."""
  from agentfly_jax.sampling.mismatch import logprob_mismatch_metrics

  mask = arrays["action_mask"]
  batch = {k: arrays[k] for k in ("input_ids", "target_ids", "attention_mask", "action_mask") + vision_keys(arrays)}
  batch.update({k: arrays[k] for k in ("routed_experts", "rollout_experts") if k in arrays})  # mixture of experts
  old = action_logprobs(graphdef, params, rest, arrays, cfg)
  batch["old_logprobs"] = old
  metrics = {f"mismatch/{k}": v for k, v in logprob_mismatch_metrics(arrays["sampler_logprobs"], old, mask).items()}
  if cfg.behaviour_logprobs:
    batch["behaviour_logprobs"] = arrays["sampler_logprobs"]
  if ref_params is not None:  # LoRA: the same base (rest), the reference's adapters
    batch["ref_logprobs"] = action_logprobs(graphdef, ref_params, rest, arrays, cfg)
  if cfg.tis_cap > 0:
    batch["is_weights"] = truncated_is_weights(old, arrays["sampler_logprobs"], mask, cfg.tis_cap)
  return batch, metrics


def batch_advantages(cfg: PrepareConfig, arrays: dict, values=None) -> tuple:
  """(advantages f32[B, L], returns [B, L], metrics) of the scores (rewards + DAPO's overlong penalty)
  by `cfg.estimator`; `values` f32[B, L] for a critic's estimators. No forward pass."""
  mask = arrays["action_mask"]
  metrics = {}
  scores = arrays["rewards"].astype(jnp.float32)
  if cfg.overlong_buffer > 0:
    scores, metrics["dapo/overlong_penalty_mean"] = overlong_shaped_scores(scores, mask, arrays["group_ids"], cfg)
  adv, ret = adv_lib.compute(
    cfg.estimator,
    mask=mask,
    scores=scores,
    group_ids=arrays["group_ids"],
    values=values,
    gamma=cfg.gamma,
    lam=cfg.lam,
    turn_rewards=arrays.get("turn_rewards"),  # turn-level estimators (rl/turn_rewards.py)
    anchor_ids=arrays.get("anchor_ids"),
  )
  metrics["adv/mean"] = _masked_mean(adv, mask)
  metrics["adv/abs_mean"] = _masked_mean(jnp.abs(adv), mask)
  return adv.astype(jnp.float32), ret, metrics


def prepare_batch(
  graphdef, rest, cfg: PrepareConfig, params, ref_params, critic_params, arrays: dict, *, critic_graphdef, critic_rest
) -> tuple[dict, dict]:
  """(batch, metrics) of `make_prepare`'s program, unjitted (see there for the arrays)."""
  batch, metrics = _policy_batch(graphdef, rest, cfg, params, ref_params, arrays)
  values = None
  if critic_params is not None:
    values = chunked_critic_values(critic_graphdef, critic_params, critic_rest, arrays, cfg.chunk)
    batch["old_values"] = values
  batch["advantages"], ret, adv_metrics = batch_advantages(cfg, arrays, values)
  if "teacher_logprobs" in arrays:  # on-policy distillation: the teacher's log-probs of these tokens
    t_lp, mask = arrays["teacher_logprobs"], arrays["action_mask"]
    batch["advantages"] = distill_advantages(batch["advantages"], t_lp, batch["old_logprobs"], mask, cfg.distill_weight)
    adv_metrics.update(distill_metrics(t_lp, batch["old_logprobs"], mask))
  if critic_params is not None:
    batch["returns"] = ret.astype(jnp.float32)
  return batch, {**metrics, **adv_metrics}


def make_prepare(graphdef, rest, cfg: PrepareConfig, *, critic_graphdef=None, critic_rest=None, mesh=None, rules=None):
  """Builds the jitted `prepare(params, ref_params, critic_params, arrays, frozen=None) -> (batch, metrics)`.

  `frozen` = (rest, critic_rest) as call-time arguments (LoRA's frozen base: see
  train_step.make_train_step); None: the ones given here. On a multi-device `mesh` its
  activations are constrained by `rules` (models/sharding.py `activation_sharding`).

  arrays: input_ids, target_ids int32[B, L], attention_mask, action_mask bool[B, L],
  sampler_logprobs f32[B, L], rewards f32[B], group_ids int32[B]; a vision-language policy's
  per-row images (rl/core/vision.py VISION_KEYS), passed on into the batch; a mixture-of-experts policy's
  sampler routes, routed_experts (replayed here and in the train step) or rollout_experts (measured there)
  int32[B, L, Lm, k], passed on too.
  ref_params / critic_params may be None (no KL reference / no critic).
  batch: the arrays `train_step` reads, [B, L]: input_ids, target_ids, attention_mask,
  action_mask, old_logprobs, advantages; + ref_logprobs,
  is_weights, old_values, returns when on.
  metrics: f32[] scalars: mismatch/*, adv/mean, adv/abs_mean, dapo/overlong_penalty_mean.
  """

  def prepare(params, ref_params, critic_params, arrays, frozen=None):
    p_rest, c_rest = (rest, critic_rest) if frozen is None else frozen
    with activation_sharding(mesh, rules):
      return prepare_batch(
        graphdef,
        p_rest,
        cfg,
        params,
        ref_params,
        critic_params,
        arrays,
        critic_graphdef=critic_graphdef,
        critic_rest=c_rest,
      )

  return jax.jit(prepare)


def make_teacher_logprobs(graphdef, cfg: PrepareConfig, *, mesh=None, rules=None):
  """The jitted `teacher(params, rest, arrays) -> f32[B, L]`: the teacher's log-probs (temperature 1) of the
  target tokens of `arrays` (input_ids, target_ids, attention_mask, action_mask [B, L]), `cfg.chunk` rows per
  forward pass, 0 off the action tokens; activations constrained by `rules` on a multi-device `mesh`."""
  cfg = dataclasses.replace(cfg, temperature=1.0)
  keys = ("input_ids", "target_ids", "attention_mask", "action_mask")

  def teacher(params, rest, arrays):
    with activation_sharding(mesh, rules):
      return action_logprobs(graphdef, params, rest, {k: arrays[k] for k in keys}, cfg)

  return jax.jit(teacher)

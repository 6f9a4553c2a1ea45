"""The pure, jitted training step: `train_step(state, batch) -> (state, metrics)`.

One call = one optimizer update on one minibatch. The minibatch arrives split into micro-batches
(leading axis M); gradients of each micro-batch's *unreduced* loss sum are accumulated with
`lax.scan` and divided once by the summed denominator, so the update equals the single-batch
global mean exactly (losses return (loss_sum, denom), see `rl/core/losses.py`).

Batch (all arrays [M, mb, L], *target-aligned*: position t describes the prediction of
target_ids[t] = token t+1 of the trajectory from input_ids[:t+1]; the shift is done once, by
`rl.batching.train_arrays`, and nothing here shifts again):
  input_ids int32, target_ids int32, attention_mask bool (of the inputs), action_mask bool (of
  the targets), old_logprobs f32, advantages f32; optional: ref_logprobs f32 (KL),
  behaviour_logprobs f32 (decoupled PPO), is_weights f32 (sampler/trainer mismatch correction),
  returns f32 + old_values f32 (critic, PPO); segment_ids int32 + positions int32 (packed
  rows, `rl/packing.py`: attention stays within a segment, positions restart, seq-mean losses count
  segments); mixture-of-experts policies: routed_experts int32[M, mb, L, Lm, k] (the sampler's
  experts for each input token's Lm sparse layers: replayed when given, `model.router_replay`),
  rollout_experts (the same, only measured: routing mismatch).
The jitted step has explicit in/out shardings on the (fsdp, tp) mesh and donates the state.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from agentfly_jax.models.sharding import activation_sharding
from agentfly_jax.models.token_stats import DEFAULT_CAPACITY, suppress_logits
from agentfly_jax.rl.core import losses
from agentfly_jax.rl.core.train_state import TrainState
from agentfly_jax.rl.core.vision import vision_inputs


@dataclasses.dataclass(frozen=True)
class LossConfig:
  """The train step's static loss settings. No defaults here: a run's come from its spec
  (rl/programs.loss_config), a standalone one's from a default run's (rl/programs.default_loss_config)."""

  policy_loss: str  # registered name in losses: "ppo" | "gspo" | "decoupled_ppo"
  clip_low: float
  clip_high: float  # > clip_low = DAPO clip-higher
  dual_clip: float
  agg: str  # token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm
  kl_coef: float  # KL(policy || reference) penalty in the loss
  kl_kind: str
  entropy_coef: float
  value_clip: float
  temperature: float  # logits / temperature, the sampler's temperature
  logits_chunk: int  # tokens per chunk of the log-prob/entropy scan; 0 = plain [B, L, V] logits
  logits_capacity: tuple  # log-probs only at action tokens, in the smallest of these
  # fractions of L that holds every row's (token_stats.at_loss_positions); () = all
  behaviour_cap: float  # decoupled_ppo: cap of the behaviour importance weight
  router_aux_coef: float  # mixture of experts: x HF's load-balancing loss (models/moe.py)


def _packing(segment_ids, positions) -> dict:
  """Model kwargs for packed rows (none for plain rows)."""
  out = {}
  if segment_ids is not None:
    out["segment_ids"] = segment_ids
  if positions is not None:
    out["positions"] = positions
  return out


def policy_logprobs(
  model,
  input_ids,
  target_ids,
  attention_mask,
  temperature: float = 1.0,
  segment_ids=None,
  positions=None,
  vision: dict | None = None,
):
  """Trainer log-probs of each target token given its prefix.

  input_ids, target_ids int32[B, L], attention_mask bool[B, L] (of the inputs); segment_ids /
  positions int32[B, L] for packed rows; `vision` a VL policy's image arguments (rl/core/vision.py)
  -> (logprobs f32[B, L], logits f32[B, L, V]), the tokens the model never writes
  (ModelConfig.placeholder_token_ids) out of the softmax as the samplers' are.
  """
  logits = model(input_ids, attention_mask=attention_mask, **_packing(segment_ids, positions), **(vision or {}))
  placeholders = getattr(getattr(model, "config", None), "placeholder_token_ids", ())
  logits = suppress_logits(logits.astype(jnp.float32), placeholders)
  return losses.token_logprobs(logits, target_ids, temperature=temperature), logits


def policy_logprobs_entropy(
  model,
  input_ids,
  target_ids,
  attention_mask,
  temperature: float = 1.0,
  chunk: int = 256,
  segment_ids=None,
  positions=None,
  loss_mask=None,
  capacity=(),
  routed_experts=None,
  with_router: bool = False,
  vision: dict | None = None,
):
  """(log-probs, entropies of the predicting softmax) f32[B, L] of each target token; args as
  `policy_logprobs`. `chunk` > 0: chunked over tokens, no [B, L, V] logits
  (CausalLM.token_logprobs_entropy), and with `loss_mask` bool[B, L] and `capacity` (fractions
  of L) only at the mask's positions (0 elsewhere; `token_stats.at_loss_positions`); 0: plain logits.
  A mixture-of-experts policy: `routed_experts` int32[Lm, B, L, k] replayed; `with_router`: also
  its RouterOut (models/moe.py) as a third output. A vision-language policy: `vision` its image
  arguments (rl/core/vision.py vision_inputs: pixel_values, vision_layout, M-RoPE positions)."""
  vision = vision or {}
  if with_router or routed_experts is not None:
    hidden, _, routes = model.hidden_states(
      input_ids,
      attention_mask=attention_mask,
      routed_experts=routed_experts,
      with_router=True,
      **_packing(segment_ids, positions),
    )
    if chunk:
      lp, ent = model.token_logprobs_entropy(
        hidden, target_ids, temperature=temperature, chunk=chunk, loss_mask=loss_mask, capacity=capacity
      )
    else:
      logits = model.next_token_logits(hidden).astype(jnp.float32)
      lp = losses.token_logprobs(logits, target_ids, temperature=temperature)
      ent = losses.entropy_from_logits(logits / temperature)
    return (lp, ent, routes) if with_router else (lp, ent)
  if chunk:
    hidden, _ = model.hidden_states(
      input_ids, attention_mask=attention_mask, **_packing(segment_ids, positions), **vision
    )
    return model.token_logprobs_entropy(
      hidden, target_ids, temperature=temperature, chunk=chunk, loss_mask=loss_mask, capacity=capacity
    )
  lp, logits = policy_logprobs(
    model, input_ids, target_ids, attention_mask, temperature, segment_ids, positions, vision=vision
  )
  return lp, losses.entropy_from_logits(logits / temperature)


def critic_values(critic, input_ids, attention_mask, action_mask):
  """Critic values of the states before each target token, 0 off the action mask.

  input_ids int32[B, L], attention_mask bool[B, L], action_mask bool[B, L] -> f32[B, L].
  """
  values = critic(input_ids, attention_mask=attention_mask).astype(jnp.float32)
  return jnp.where(action_mask, values, 0.0)


def _policy_micro_loss(graphdef, rest, cfg: LossConfig, params, mb):
  model = nnx.merge(graphdef, params, rest)
  seg = mb.get("segment_ids")
  mask = mb["action_mask"]
  moe = getattr(model.config, "is_moe", False)
  routed = mb.get("routed_experts")
  out = policy_logprobs_entropy(
    model,
    mb["input_ids"],
    mb["target_ids"],
    mb["attention_mask"],
    cfg.temperature,
    cfg.logits_chunk,
    seg,
    mb.get("positions"),
    loss_mask=mask,
    capacity=cfg.logits_capacity,
    routed_experts=None if routed is None else jnp.moveaxis(routed, 2, 0),  # [B, L, Lm, k] -> [Lm, B, L, k]
    with_router=moe,
    vision=vision_inputs(mb),
  )
  lp, entropy = out[0], out[1]
  packed = {} if seg is None else {"segment_ids": seg}
  loss_fn = losses.get_policy_loss(cfg.policy_loss)
  extra = {}
  if "behaviour_logprobs" in mb:  # decoupled PPO (asynchronous rollout)
    extra = dict(behaviour_logprobs=mb["behaviour_logprobs"], behaviour_cap=cfg.behaviour_cap)
  pg_sum, denom, pg_metrics = loss_fn(
    lp,
    mb["old_logprobs"],
    mb["advantages"],
    mask,
    clip_low=cfg.clip_low,
    clip_high=cfg.clip_high,
    dual_clip=cfg.dual_clip,
    agg=cfg.agg,
    is_weights=mb.get("is_weights"),
    **extra,
    **packed,
  )
  total = pg_sum
  metrics = {f"actor/{k}": v for k, v in pg_metrics.items()}
  safe = jnp.maximum(denom, 1e-8)
  metrics["actor/pg_loss"] = pg_sum / safe
  ent_sum, _ = losses.aggregate(entropy, mask, cfg.agg, segment_ids=seg)
  metrics["actor/entropy"] = ent_sum / safe
  if cfg.entropy_coef:
    total = total - cfg.entropy_coef * ent_sum
  if "ref_logprobs" in mb:
    kl = losses.kl_penalty(lp, mb["ref_logprobs"], kind=cfg.kl_kind)
    kl_sum, _ = losses.aggregate(kl, mask, cfg.agg, segment_ids=seg)
    metrics["actor/kl_ref"] = kl_sum / safe
    if cfg.kl_coef:
      total = total + cfg.kl_coef * kl_sum
  if moe:
    total = total + _router_terms(model.config, out[2], mb, cfg, denom, metrics)
  return total, (denom, metrics)


def _router_terms(model_cfg, routes, mb, cfg: LossConfig, denom, metrics):
  """A mixture-of-experts policy's router metrics (into `metrics`) and its load-balancing term
  (router_aux_coef x HF's loss over the real tokens, weighted by the micro-batch's `denom`, so the
  step's loss holds the denominator-weighted mean over micro-batches)."""
  from agentfly_jax.models import moe

  tokens = mb["attention_mask"]
  aux = moe.load_balancing_loss(routes.logits, routes.experts, tokens, model_cfg.num_experts)
  metrics["router/aux_loss"] = aux
  metrics.update(moe.router_metrics(routes.experts, tokens, model_cfg.num_experts))
  rollout = mb.get("routed_experts", mb.get("rollout_experts"))
  if rollout is not None:  # the trainer router's own top-k against the sampler's routes, on the action tokens
    own = jax.lax.top_k(routes.logits, model_cfg.num_experts_per_tok)[1]
    recorded = jnp.all(rollout >= 0, axis=(-2, -1))  # -1: no route recorded for that token
    metrics["router/rollout_mismatch"] = moe.routing_mismatch(
      own, jnp.moveaxis(rollout, 2, 0), mb["action_mask"] & recorded
    )
  return cfg.router_aux_coef * aux * denom if cfg.router_aux_coef else 0.0


def _critic_micro_loss(graphdef, rest, cfg: LossConfig, params, mb):
  critic = nnx.merge(graphdef, params, rest)
  values = critic(
    mb["input_ids"], attention_mask=mb["attention_mask"], **_packing(mb.get("segment_ids"), mb.get("positions"))
  )
  mask = mb["action_mask"]
  vf_sum, denom, vf_metrics = losses.value_loss(
    values.astype(jnp.float32),
    mb["old_values"],
    mb["returns"],
    mask,
    clip=cfg.value_clip,
    agg=cfg.agg,
    segment_ids=mb.get("segment_ids"),
  )
  metrics = {f"critic/{k}": v for k, v in vf_metrics.items()}
  metrics["critic/vf_loss"] = vf_sum / jnp.maximum(denom, 1e-8)
  return vf_sum, (denom, metrics)


def accumulate_gradients(micro_loss: Callable, params, batch: dict):
  """Sums grads of per-micro-batch loss sums over the leading axis; returns (grads / denom, denom, metrics).

  micro_loss(params, mb) -> (loss_sum, (denom, metrics)); batch: dict of [M, mb, ...] arrays.
  Metrics are averaged over the micro-batches that hold a trained token (padding ones skipped).
  """
  grad_fn = jax.grad(micro_loss, has_aux=True)

  def body(carry, mb):
    g_acc, d_acc = carry
    grads, (denom, metrics) = grad_fn(params, mb)
    g_acc = jax.tree.map(jnp.add, g_acc, grads)
    return (g_acc, d_acc + denom), (metrics, denom > 0)

  zeros = jax.tree.map(jnp.zeros_like, params)
  (g_sum, denom), (metrics, filled) = jax.lax.scan(body, (zeros, jnp.zeros((), jnp.float32)), batch)
  grads = jax.tree.map(lambda g: jnp.where(denom > 0, g / jnp.maximum(denom, 1e-8), 0.0), g_sum)
  w = filled.astype(jnp.float32) / jnp.maximum(filled.sum(), 1)  # all-padding micro-batches measure nothing
  metrics = jax.tree.map(lambda m: jnp.tensordot(w, m.astype(jnp.float32), axes=1), metrics)
  return grads, denom, metrics


def make_train_step(
  policy_graphdef,
  policy_rest,
  optimizer: optax.GradientTransformation,
  cfg: LossConfig,
  *,
  critic_graphdef=None,
  critic_rest=None,
  critic_optimizer: optax.GradientTransformation | None = None,
  mesh=None,
  rules=None,
):
  """Builds the pure `train_step(state, batch, frozen=None) -> (state, metrics)` (not yet jitted).
  On a multi-device `mesh` its activations are constrained by `rules` (models/sharding.py
  `activation_sharding`).

  `frozen`: (policy rest, critic rest) passed at call time, e.g. LoRA's frozen base: arrays a
  jitted function closes over become constants of the compiled program (a copy of the weights in
  the executable and the compile cache), so whatever is large must be an argument. None: the
  `policy_rest` / `critic_rest` given here (no arrays in them without LoRA).
  """

  def train_step(state: TrainState, batch: dict, frozen=None):
    with activation_sharding(mesh, rules):
      return _train_step(state, batch, frozen)

  def _train_step(state: TrainState, batch: dict, frozen):
    p_rest, c_rest = (policy_rest, critic_rest) if frozen is None else frozen
    policy_loss = lambda p, mb: _policy_micro_loss(policy_graphdef, p_rest, cfg, p, mb)  # noqa: E731
    critic_loss = None
    if critic_graphdef is not None:
      critic_loss = lambda p, mb: _critic_micro_loss(critic_graphdef, c_rest, cfg, p, mb)  # noqa: E731
    grads, denom, metrics = accumulate_gradients(policy_loss, state.params, batch)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics["actor/grad_norm"] = optax.global_norm(grads)
    metrics["actor/update_norm"] = optax.global_norm(updates)
    metrics["actor/loss_denom"] = denom
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    if critic_loss is not None:
      c_grads, _, c_metrics = accumulate_gradients(critic_loss, state.critic_params, batch)
      c_updates, c_opt = critic_optimizer.update(c_grads, state.critic_opt_state, state.critic_params)
      metrics.update(c_metrics)
      metrics["critic/grad_norm"] = optax.global_norm(c_grads)
      new_state = new_state.replace(
        critic_params=optax.apply_updates(state.critic_params, c_updates), critic_opt_state=c_opt
      )
    return new_state, metrics

  return train_step


def make_sft_step(
  graphdef,
  rest,
  optimizer: optax.GradientTransformation,
  *,
  logits_chunk: int = 256,
  logits_capacity=DEFAULT_CAPACITY,
  mesh=None,
  rules=None,
):
  """Supervised warm start: masked next-token NLL on `action_mask` tokens (token-mean, exact
  under micro-batching). Same state/batch layout as `train_step` (only input_ids, target_ids,
  attention_mask, action_mask and a vision-language policy's image keys (rl/core/vision.py) are read). Log-probs as the RL step computes them: chunked
  (`logits_chunk`; 0 = plain [B, L, V] logits), only at action tokens (`logits_capacity`).
  `sft_step(state, batch, frozen=None)`: `frozen` = the model's rest at call time (LoRA's base;
  see make_train_step), else `rest`; `mesh` / `rules`: activation shardings as in `make_train_step`."""

  def micro_loss(params, mb, rest):
    model = nnx.merge(graphdef, params, rest)
    mask = mb["action_mask"]
    lp, _ = policy_logprobs_entropy(
      model,
      mb["input_ids"],
      mb["target_ids"],
      mb["attention_mask"],
      chunk=logits_chunk,
      loss_mask=mask,
      capacity=logits_capacity,
      vision=vision_inputs(mb),
    )
    mask = mask.astype(jnp.float32)
    nll_sum = -jnp.sum(lp * mask)
    denom = jnp.sum(mask)
    return nll_sum, (denom, {"sft/nll": nll_sum / jnp.maximum(denom, 1.0)})

  def sft_step(state: TrainState, batch: dict, frozen=None):
    with activation_sharding(mesh, rules):
      return _sft_step(state, batch, frozen)

  def _sft_step(state: TrainState, batch: dict, frozen):
    frozen_rest = rest if frozen is None else frozen
    grads, _, metrics = accumulate_gradients(lambda p, mb: micro_loss(p, mb, frozen_rest), state.params, batch)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    metrics["sft/grad_norm"] = optax.global_norm(grads)
    return state.replace(
      step=state.step + 1, params=optax.apply_updates(state.params, updates), opt_state=opt_state
    ), metrics

  return sft_step


# ----------------------------------------------------------------------------- sharding + jit


def state_shardings(
  state: Any,
  mesh: jax.sharding.Mesh,
  param_specs=None,
  critic_specs=None,
  *,
  optimizer: optax.GradientTransformation,
  critic_optimizer=None,
):
  """NamedShardings for every leaf of a TrainState (arrays or `jax.eval_shape` structs): params
  follow their partition specs (None: replicated); every copy of the params inside the optimizer
  state (moments) gets the params' shardings, found by optax from `optimizer.init`
  (`optax.tree_map_params`); the rest (counts, step, rng) is replicated."""
  replicated = NamedSharding(mesh, P())

  def from_specs(tree, specs):
    if specs is None:
      return jax.tree.map(lambda _: replicated, tree)
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))

  def opt_shardings(opt, opt_state, p_shard):
    return optax.tree_map_params(
      opt,
      lambda _, sh: sh,
      opt_state,
      p_shard,
      transform_non_params=lambda _: replicated,
      is_leaf=lambda x: isinstance(x, nnx.Variable),
    )

  p_sh = from_specs(state.params, param_specs)
  c_sh = None if state.critic_params is None else from_specs(state.critic_params, critic_specs)
  return state.replace(
    step=replicated,
    params=p_sh,
    opt_state=opt_shardings(optimizer, state.opt_state, p_sh),
    critic_params=c_sh,
    critic_opt_state=None if c_sh is None else opt_shardings(critic_optimizer, state.critic_opt_state, c_sh),
    rng=None if state.rng is None else replicated,
  )


def batch_sharding(mesh: jax.sharding.Mesh, batch: dict) -> dict:
  """Micro-batch arrays [M, mb, ...]: the mb (batch) axis is split over 'fsdp' (data parallel); on an
  expert-parallel mesh the rows are split over 'expert' only inside the experts (models/moe.py)."""
  return {k: NamedSharding(mesh, P(None, "fsdp")) for k in batch}


def jit_step(step_fn, state_sh, batch_sh, frozen=None):
  """jax.jit with explicit shardings and the state donated. With `frozen` (the step's third
  argument, e.g. (rest, critic_rest) under LoRA) it takes that argument with the shardings its
  arrays have, never donated (the sampler may share them)."""
  if frozen is None:
    return jax.jit(step_fn, in_shardings=(state_sh, batch_sh), out_shardings=(state_sh, None), donate_argnums=(0,))
  frozen_sh = jax.tree.map(lambda x: x.sharding, frozen)
  return jax.jit(
    step_fn, in_shardings=(state_sh, batch_sh, frozen_sh), out_shardings=(state_sh, None), donate_argnums=(0,)
  )

"""The pure, jitted training step: `train_step(state, batch) -> (state, metrics)`.

One call = one optimizer update on one minibatch. The minibatch arrives split into micro-batches
(leading axis M); gradients of each micro-batch's *unreduced* loss sum are accumulated with
`lax.scan` and divided once by the summed denominator, so the update equals the single-batch
global mean exactly (losses return (loss_sum, denom), see `rl/losses.py`).

Batch (all arrays [M, mb, T], token-position aligned like the Trajectory: position t holds token t,
its action-mask bit and its sampler log-prob; the loss shifts by one internally):
  token_ids int32, attention_mask bool, action_mask bool, old_logprobs f32, advantages f32;
  optional: ref_logprobs f32 (KL), is_weights f32 (sampler/trainer mismatch correction),
  returns f32 + old_values f32 (critic, PPO), segment_ids int32 + positions int32 (packed rows,
  `rl/packing.py`: attention stays within a segment, positions restart, seq-mean losses count
  segments; a segment's first token must not be an action token).
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

from agentfly_jax.rl import losses
from agentfly_jax.rl.train_state import TrainState


@dataclasses.dataclass(frozen=True)
class LossConfig:
  policy_loss: str = "ppo"          # registered name in losses: "ppo" | "gspo"
  clip_low: float = 0.2
  clip_high: float = 0.2            # > clip_low = DAPO clip-higher
  dual_clip: float = 3.0
  agg: str = "token-mean"           # token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm
  kl_coef: float = 0.0              # KL(policy || reference) penalty in the loss
  kl_kind: str = "k3"
  entropy_coef: float = 0.0
  value_clip: float = 0.5
  temperature: float = 1.0          # logits / temperature, the sampler's temperature
  logits_chunk: int = 256           # tokens per chunk of the log-prob/entropy scan; 0 = plain [B, T, V] logits


def _shifted(mb: dict, key: str):
  return mb[key][:, 1:] if key in mb else None


def _packing(segment_ids, positions) -> dict:
  """Model kwargs for the inputs (tokens :-1) of packed rows (none for plain rows)."""
  out = {}
  if segment_ids is not None:
    out["segment_ids"] = segment_ids[:, :-1]
  if positions is not None:
    out["positions"] = positions[:, :-1]
  return out


def policy_logprobs(model, token_ids, attention_mask, temperature: float = 1.0, segment_ids=None, positions=None):
  """Trainer log-probs of each token given its prefix, position-aligned.

  token_ids int32[B, T], attention_mask bool[B, T] (segment_ids / positions int32[B, T]: packed
  rows) -> (logprobs f32[B, T] (position 0 is 0), logits f32[B, T-1, V]).
  """
  logits = model(token_ids[:, :-1], attention_mask=attention_mask[:, :-1], **_packing(segment_ids, positions))
  lp = losses.token_logprobs(logits.astype(jnp.float32), token_ids[:, 1:], temperature=temperature)
  return jnp.pad(lp, ((0, 0), (1, 0))), logits


def policy_logprobs_entropy(model, token_ids, attention_mask, temperature: float = 1.0, chunk: int = 256,
                            segment_ids=None, positions=None):
  """(log-probs f32[B, T-1] of tokens 1.., entropies f32[B, T-1] of the softmax that predicts
  them) for token_ids int32[B, T], attention_mask bool[B, T] (segment_ids / positions: packed
  rows). `chunk` > 0: chunked over tokens, no [B, T, V] logits
  (CausalLM.token_logprobs_entropy); 0: plain logits."""
  if chunk:
    hidden, _ = model.hidden_states(token_ids[:, :-1], attention_mask=attention_mask[:, :-1],
                                    **_packing(segment_ids, positions))
    return model.token_logprobs_entropy(hidden, token_ids[:, 1:], temperature=temperature, chunk=chunk)
  lp, logits = policy_logprobs(model, token_ids, attention_mask, temperature, segment_ids, positions)
  return lp[:, 1:], losses.entropy_from_logits(logits.astype(jnp.float32) / temperature)


def _policy_micro_loss(graphdef, rest, cfg: LossConfig, params, mb):
  model = nnx.merge(graphdef, params, rest)
  lp, entropy = policy_logprobs_entropy(model, mb["token_ids"], mb["attention_mask"], cfg.temperature,
                                        cfg.logits_chunk, mb.get("segment_ids"), mb.get("positions"))
  mask = mb["action_mask"][:, 1:]
  seg = _shifted(mb, "segment_ids")
  packed = {} if seg is None else {"segment_ids": seg}
  loss_fn = losses.get_policy_loss(cfg.policy_loss)
  pg_sum, denom, pg_metrics = loss_fn(
      lp, _shifted(mb, "old_logprobs"), _shifted(mb, "advantages"), mask,
      clip_low=cfg.clip_low, clip_high=cfg.clip_high, dual_clip=cfg.dual_clip, agg=cfg.agg,
      is_weights=_shifted(mb, "is_weights"), **packed)
  total = pg_sum
  metrics = {f"actor/{k}": v for k, v in pg_metrics.items()}
  safe = jnp.maximum(denom, 1e-8)
  metrics["actor/pg_loss"] = pg_sum / safe
  ent_sum, _ = losses.aggregate(entropy, mask, cfg.agg, segment_ids=seg)
  metrics["actor/entropy"] = ent_sum / safe
  if cfg.entropy_coef:
    total = total - cfg.entropy_coef * ent_sum
  if "ref_logprobs" in mb:
    kl = losses.kl_penalty(lp, _shifted(mb, "ref_logprobs"), kind=cfg.kl_kind)
    kl_sum, _ = losses.aggregate(kl, mask, cfg.agg, segment_ids=seg)
    metrics["actor/kl_ref"] = kl_sum / safe
    if cfg.kl_coef:
      total = total + cfg.kl_coef * kl_sum
  return total, (denom, metrics)


def _critic_micro_loss(graphdef, rest, cfg: LossConfig, params, mb):
  critic = nnx.merge(graphdef, params, rest)
  values = critic(mb["token_ids"][:, :-1], attention_mask=mb["attention_mask"][:, :-1],
                  **_packing(mb.get("segment_ids"), mb.get("positions")))
  mask = mb["action_mask"][:, 1:]
  vf_sum, denom, vf_metrics = losses.value_loss(
      values.astype(jnp.float32), _shifted(mb, "old_values"), _shifted(mb, "returns"), mask,
      clip=cfg.value_clip, agg=cfg.agg, segment_ids=_shifted(mb, "segment_ids"))
  metrics = {f"critic/{k}": v for k, v in vf_metrics.items()}
  metrics["critic/vf_loss"] = vf_sum / jnp.maximum(denom, 1e-8)
  return vf_sum, (denom, metrics)


def accumulate_gradients(micro_loss: Callable, params, batch: dict):
  """Sums grads of per-micro-batch loss sums over the leading axis; returns (grads / denom, denom, metrics).

  micro_loss(params, mb) -> (loss_sum, (denom, metrics)); batch: dict of [M, mb, ...] arrays.
  Metrics are averaged over micro-batches.
  """
  grad_fn = jax.grad(micro_loss, has_aux=True)

  def body(carry, mb):
    g_acc, d_acc = carry
    grads, (denom, metrics) = grad_fn(params, mb)
    g_acc = jax.tree.map(jnp.add, g_acc, grads)
    return (g_acc, d_acc + denom), metrics

  zeros = jax.tree.map(jnp.zeros_like, params)
  (g_sum, denom), metrics = jax.lax.scan(body, (zeros, jnp.zeros((), jnp.float32)), batch)
  grads = jax.tree.map(lambda g: jnp.where(denom > 0, g / jnp.maximum(denom, 1e-8), 0.0), g_sum)
  metrics = jax.tree.map(lambda m: jnp.mean(m, axis=0), metrics)
  return grads, denom, metrics


def make_train_step(policy_graphdef, policy_rest, optimizer: optax.GradientTransformation,
                    cfg: LossConfig, *, critic_graphdef=None, critic_rest=None,
                    critic_optimizer: optax.GradientTransformation | None = None):
  """Builds the pure `train_step(state, batch) -> (state, metrics)` (not yet jitted)."""

  policy_loss = lambda p, mb: _policy_micro_loss(policy_graphdef, policy_rest, cfg, p, mb)
  critic_loss = None
  if critic_graphdef is not None:
    critic_loss = lambda p, mb: _critic_micro_loss(critic_graphdef, critic_rest, cfg, p, mb)

  def train_step(state: TrainState, batch: dict):
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
      new_state = new_state.replace(critic_params=optax.apply_updates(state.critic_params, c_updates),
                                    critic_opt_state=c_opt)
    return new_state, metrics

  return train_step


def make_sft_step(graphdef, rest, optimizer: optax.GradientTransformation):
  """Supervised warm start: masked next-token NLL on `action_mask` tokens (token-mean, exact
  under micro-batching). Same state/batch layout as `train_step` (only token_ids, attention_mask,
  action_mask are read)."""

  def micro_loss(params, mb):
    model = nnx.merge(graphdef, params, rest)
    lp, _ = policy_logprobs(model, mb["token_ids"], mb["attention_mask"])
    mask = mb["action_mask"][:, 1:].astype(jnp.float32)
    nll_sum = -jnp.sum(lp[:, 1:] * mask)
    denom = jnp.sum(mask)
    return nll_sum, (denom, {"sft/nll": nll_sum / jnp.maximum(denom, 1.0)})

  def sft_step(state: TrainState, batch: dict):
    grads, _, metrics = accumulate_gradients(micro_loss, state.params, batch)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    metrics["sft/grad_norm"] = optax.global_norm(grads)
    return state.replace(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                         opt_state=opt_state), metrics

  return sft_step


# ----------------------------------------------------------------------------- sharding + jit

def state_shardings(state: Any, mesh: jax.sharding.Mesh, param_specs=None, critic_specs=None):
  """NamedShardings for every leaf of a TrainState: params (and their optimizer moments) follow
  the partition rules; everything else is replicated on the mesh."""
  replicated = NamedSharding(mesh, P())

  def from_specs(tree, specs):
    if specs is None:
      return jax.tree.map(lambda _: replicated, tree)
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                        is_leaf=lambda x: isinstance(x, P))

  p_sh = from_specs(state.params, param_specs)
  c_sh = None if state.critic_params is None else from_specs(state.critic_params, critic_specs)

  def opt_shardings(opt_state, params, p_shard):
    # optax moments mirror the params tree; match them by structure, replicate the rest.
    p_struct = jax.tree.structure(params)
    p_leaves = jax.tree.leaves(p_shard)

    def walk(node):
      try:
        if jax.tree.structure(node) == p_struct:
          return jax.tree.unflatten(jax.tree.structure(node), p_leaves)
      except Exception:  # noqa: BLE001
        pass
      return None

    def map_node(node):
      sh = walk(node)
      if sh is not None:
        return sh
      if isinstance(node, tuple) and hasattr(node, "_fields"):  # NamedTuple optax states
        return type(node)(*[map_node(c) for c in node])
      if isinstance(node, (tuple, list)):
        return type(node)(map_node(c) for c in node)
      if isinstance(node, dict):
        return {k: map_node(v) for k, v in node.items()}
      return jax.tree.map(lambda _: replicated, node)

    return map_node(opt_state)

  return state.replace(
      step=replicated,
      params=p_sh,
      opt_state=opt_shardings(state.opt_state, state.params, p_sh),
      critic_params=c_sh,
      critic_opt_state=None if c_sh is None else opt_shardings(state.critic_opt_state, state.critic_params, c_sh),
      rng=None if state.rng is None else replicated,
  )


def batch_sharding(mesh: jax.sharding.Mesh, batch: dict) -> dict:
  """Micro-batch arrays [M, mb, ...]: the mb (batch) axis is split over 'fsdp' (data parallel)."""
  return {k: NamedSharding(mesh, P(None, "fsdp")) for k in batch}


def jit_step(step_fn, state_sh, batch_sh):
  """jax.jit with explicit shardings and the state donated."""
  return jax.jit(step_fn, in_shardings=(state_sh, batch_sh), out_shardings=(state_sh, None),
                 donate_argnums=(0,))

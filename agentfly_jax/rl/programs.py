"""The builders of a run's jitted programs, shared by the trainer and `experiments/aot_compile.py`
(which lowers the same programs for a TPU topology without weights).

    loss_cfg = loss_config(config, decoupled=False)
    optimizer, critic_optimizer = policy_optimizers(config)
    sharding = train_state_sharding(params, critic_params, optimizer, critic_optimizer, mesh, specs, c_specs)
    step, batch_sharding = sft_step_program(graphdef, rest, sft_optimizer(config), loss_cfg, mesh, rules, sh)
"""
from __future__ import annotations

import jax

from agentfly_jax.models.token_stats import capacity_fractions
from agentfly_jax.rl.config import ALGORITHMS, resolved_agg
from agentfly_jax.rl.train_state import create_train_state, make_optimizer
from agentfly_jax.rl.train_step import LossConfig, batch_sharding, jit_step, make_sft_step, state_shardings

SFT_KEYS = ("input_ids", "target_ids", "attention_mask", "action_mask")


def loss_config(config, *, decoupled: bool = False) -> LossConfig:
  """The policy (and critic) loss of `config`'s algorithm; `decoupled`: decoupled PPO (AReaL),
  for off-policy (async, stale) batches."""
  algo = ALGORITHMS[config.algo]
  return LossConfig(
      policy_loss="decoupled_ppo" if decoupled else algo["policy_loss"], clip_low=config.loss.clip_low,
      clip_high=config.loss.clip_high, dual_clip=config.loss.dual_clip, agg=resolved_agg(config),
      kl_coef=config.loss.kl_coef, kl_kind=config.loss.kl_kind,
      entropy_coef=config.loss.entropy_coef, value_clip=config.loss.value_clip,
      temperature=config.rollout.temperature if config.rollout.temperature > 0 else 1.0,
      logits_chunk=config.train.logits_chunk,
      logits_capacity=capacity_fractions(config.train.get("logits_capacity", ())),  # .get: runs saved before it
      behaviour_cap=config.loss.behaviour_cap)


def policy_optimizers(config):
  """(the policy's AdamW, the critic's or None when the algorithm has no critic)."""
  t = config.train
  optimizer = make_optimizer(lr=t.lr, warmup_steps=t.warmup_steps, total_steps=t.steps, schedule=t.schedule,
                             weight_decay=t.weight_decay, max_grad_norm=t.max_grad_norm)
  critic_optimizer = make_optimizer(lr=config.critic.lr, warmup_steps=config.critic.warmup_steps,
                                    max_grad_norm=t.max_grad_norm) if ALGORITHMS[config.algo]["critic"] else None
  return optimizer, critic_optimizer


def sft_optimizer(config):
  return make_optimizer(lr=config.sft.lr, max_grad_norm=config.train.max_grad_norm)


def train_state_sharding(params, critic_params, optimizer, critic_optimizer, mesh, param_specs, critic_specs):
  """Shardings of a TrainState of `params` (+ `critic_params`; arrays or abstract) under the optimizers."""
  abstract = jax.eval_shape(lambda p, cp: create_train_state(
      p, optimizer, critic_params=cp, critic_optimizer=critic_optimizer), params, critic_params)
  return state_shardings(abstract, mesh, param_specs, critic_specs, optimizer=optimizer,
                         critic_optimizer=critic_optimizer)


def sft_step_program(graphdef, rest, optimizer, loss_cfg: LossConfig, mesh, rules, state_sharding, *,
                     frozen=None):
  """(the jitted SFT step, its micro-batch shardings {key: NamedSharding}). `frozen`: the model's
  rest as the step's third argument (LoRA's base: never a constant of the program), else closed over."""
  batch_sh = batch_sharding(mesh, dict.fromkeys(SFT_KEYS))
  step = jit_step(make_sft_step(graphdef, rest, optimizer, logits_chunk=loss_cfg.logits_chunk,
                                logits_capacity=loss_cfg.logits_capacity, mesh=mesh, rules=rules),
                  state_sharding, batch_sh, frozen)
  return step, batch_sh

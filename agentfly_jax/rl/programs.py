"""The builders of a run's jitted programs, shared by the trainer and `experiments/aot_compile.py`
(which lowers the same programs for a TPU topology without weights).

    loss_cfg = loss_config(spec, decoupled=False)     # spec: rl.spec.RunSpec (RunSpec.from_config at the script)
    optimizer, critic_optimizer = policy_optimizers(spec)
    sharding = train_state_sharding(params, critic_params, optimizer, critic_optimizer, mesh, specs, c_specs)
    step, batch_sharding = sft_step_program(graphdef, rest, sft_optimizer(spec), loss_cfg, mesh, rules, sh)
"""

from __future__ import annotations

import jax

from agentfly_jax.rl.core.train_state import create_train_state, make_optimizer
from agentfly_jax.rl.core.train_step import LossConfig, batch_sharding, jit_step, make_sft_step, state_shardings
from agentfly_jax.rl.spec_section import view

SFT_KEYS = ("input_ids", "target_ids", "attention_mask", "action_mask")


def loss_config(spec, *, decoupled: bool = False) -> LossConfig:
  """The policy (and critic) loss of the run's algorithm (`spec`: the run's RunSpec, parsed
  once at the script); `decoupled`: decoupled PPO (AReaL), for off-policy (async, stale) batches (the
  trainer passes `spec.decoupled`)."""
  algo = spec.algorithm
  return view(  # clip_low/high, dual_clip, kl_coef, kl_kind, entropy_coef, value_clip, behaviour_cap: config.loss's
    LossConfig,
    spec.loss,
    policy_loss="decoupled_ppo" if decoupled else algo.policy_loss,
    agg=algo.agg,
    temperature=spec.rollout.temperature if spec.rollout.temperature > 0 else 1.0,
    logits_chunk=spec.train.logits_chunk,
    logits_capacity=spec.train.capacity,
  )


def default_loss_config(**fields) -> LossConfig:
  """The loss of a default run (`RunSpec()`: its algorithm's policy loss and aggregation, the spec's
  clip, KL and log-prob chunking) with `fields` replaced: a LossConfig outside a run (tests, benchmarks)
  whose values are the spec's, written nowhere else."""
  import dataclasses

  from agentfly_jax.rl.spec import RunSpec

  return dataclasses.replace(loss_config(RunSpec()), **fields)


def policy_optimizers(spec):
  """(the policy's AdamW, the critic's or None when the algorithm has no critic)."""
  t = spec.train
  optimizer = make_optimizer(
    lr=t.lr,
    warmup_steps=t.warmup_steps,
    total_steps=t.steps,
    schedule=t.schedule,
    weight_decay=t.weight_decay,
    max_grad_norm=t.max_grad_norm,
  )
  critic_optimizer = (
    make_optimizer(lr=spec.critic.lr, warmup_steps=spec.critic.warmup_steps, max_grad_norm=t.max_grad_norm)
    if spec.algorithm.critic
    else None
  )
  return optimizer, critic_optimizer


def sft_optimizer(spec):
  return make_optimizer(lr=spec.sft.lr, max_grad_norm=spec.train.max_grad_norm)


def train_state_sharding(params, critic_params, optimizer, critic_optimizer, mesh, param_specs, critic_specs):
  """Shardings of a TrainState of `params` (+ `critic_params`; arrays or abstract) under the optimizers."""
  abstract = jax.eval_shape(
    lambda p, cp: create_train_state(p, optimizer, critic_params=cp, critic_optimizer=critic_optimizer),
    params,
    critic_params,
  )
  return state_shardings(
    abstract, mesh, param_specs, critic_specs, optimizer=optimizer, critic_optimizer=critic_optimizer
  )


class TrainStates:
  """Makes TrainStates of a run's params (+ PPO's critic) on its mesh: `sharding_for(optimizer)`
  and `new(params, optimizer, critic_params, sharding=)` (the policy optimizer's state sharding
  is computed once)."""

  def __init__(self, params, critic_params, optimizer, critic_optimizer, mesh, param_specs, critic_specs, seed: int):
    self.params, self.critic_params = params, critic_params
    self.optimizer, self.critic_optimizer = optimizer, critic_optimizer
    self.mesh, self.param_specs, self.critic_specs, self.seed = mesh, param_specs, critic_specs, seed
    self.sharding = self.sharding_for(optimizer)

  def sharding_for(self, optimizer):
    """Shardings of a TrainState of the run's params (+ critic, under the policy optimizer) under `optimizer`."""
    if optimizer is self.optimizer and getattr(self, "sharding", None) is not None:
      return self.sharding
    critic = self.critic_params if optimizer is self.optimizer else None
    return train_state_sharding(
      self.params, critic, optimizer, self.critic_optimizer, self.mesh, self.param_specs, self.critic_specs
    )

  def new(self, params, optimizer=None, critic_params=None, *, sharding=None):
    """A fresh TrainState (optimizer: the run's by default), placed on the mesh."""
    optimizer = optimizer or self.optimizer
    make = lambda p, cp: create_train_state(
      p,
      optimizer,
      critic_params=cp,  # noqa: E731
      critic_optimizer=self.critic_optimizer,
      seed=self.seed,
    )
    # Built by a jit with the target shardings: also valid across processes (no host arrays).
    return jax.jit(make, out_shardings=sharding or self.sharding_for(optimizer))(params, critic_params)


def sft_step_program(
  graphdef, rest, optimizer, loss_cfg: LossConfig, mesh, rules, state_sharding, *, frozen=None, vision: bool = False
):
  """(the jitted SFT step, its micro-batch shardings {key: NamedSharding}). `frozen`: the model's
  rest as the step's third argument (LoRA's base: never a constant of the program), else closed over.
  `vision`: the batch also holds each row's images (rl/core/vision.py VISION_KEYS)."""
  from agentfly_jax.rl.core.vision import VISION_KEYS

  batch_sh = batch_sharding(mesh, dict.fromkeys(SFT_KEYS + (VISION_KEYS if vision else ())))
  step = jit_step(
    make_sft_step(
      graphdef,
      rest,
      optimizer,
      logits_chunk=loss_cfg.logits_chunk,
      logits_capacity=loss_cfg.logits_capacity,
      mesh=mesh,
      rules=rules,
    ),
    state_sharding,
    batch_sh,
    frozen,
  )
  return step, batch_sh

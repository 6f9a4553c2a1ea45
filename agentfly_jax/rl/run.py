"""One run's fixed parts and the operations on them that every phase shares.

    spec = RunSpec.from_config(config)          # at the script: the config parsed once
    run = open_run(spec, workdir)               # build_run's parts + the programs + the checkpointer
    trajs = rollout(run, rows, seed=1)          # the run's agent, sampler and rollout limits
    state = new_state(run, params)              # a TrainState on the run's mesh

`Run` holds only what is fixed for the run (nothing in it changes from step to step: the loop's
state is rl/loop.LoopState). Its parts are where `build_run` put them (`run.parts.policy.graphdef`,
`run.parts.sampler`, ...); the programs (loss config, optimizers, TrainState maker, the policy
update) are built here once from the spec.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax

from agentfly_jax.checkpoint import Checkpointer
from agentfly_jax.rl import stages
from agentfly_jax.rl.programs import TrainStates, loss_config, policy_optimizers
from agentfly_jax.rl.setup import RunParts, build_run
from agentfly_jax.rl.spec import RunSpec
from agentfly_jax.rl.stages import SamplerWeights
from agentfly_jax.rl.update import ModelParts, PolicyUpdate
from agentfly_jax.tasks.from_config import task_fingerprint


@dataclasses.dataclass(frozen=True)
class Run:
  """What is fixed for one run: its spec, `build_run`'s parts, the workdir, the programs built on
  them (the loss config, optimizers, TrainState maker `states`, the jitted policy `update`), the
  sampler's weights handle, the checkpointer and the task's fingerprint (evaluate.py checks it)."""

  spec: RunSpec
  parts: RunParts
  workdir: str
  loss_cfg: Any  # rl/core/train_step.LossConfig (decoupled PPO in async runs: spec.decoupled)
  optimizer: Any
  critic_optimizer: Any  # None without a critic
  states: TrainStates
  update: PolicyUpdate
  weights: SamplerWeights
  checkpointer: Checkpointer
  task_fingerprint: str


def open_run(spec: RunSpec, workdir: str, *, task=None, parts: RunParts | None = None) -> Run:
  """The run of `spec` in `workdir`: `parts` (default: `build_run(spec, workdir, task=task)`), its
  programs and checkpointer. Writes nothing but the tokenizer of a random-init model (config.json
  is written when training starts: rl/loop.train)."""
  if spec.asynchronous and jax.process_count() > 1:
    raise ValueError("config.rollout.mode='async' runs on one process; multi-host runs are sync")
  workdir = os.path.abspath(workdir)
  os.makedirs(workdir, exist_ok=True)
  parts = parts if parts is not None else build_run(spec, workdir, task=task)
  policy, critic = parts.policy, parts.critic
  loss_cfg = loss_config(spec, decoupled=spec.decoupled)  # decoupled: clip against the proximal policy (AReaL)
  optimizer, critic_optimizer = policy_optimizers(spec)
  states = TrainStates(
    policy.params,
    critic.params if critic is not None else None,
    optimizer,
    critic_optimizer,
    parts.mesh,
    policy.specs,
    critic.specs if critic is not None else None,
    spec.seed,
  )
  model_parts = ModelParts(
    policy.graphdef,
    policy.rest,
    optimizer,
    critic.graphdef if critic is not None else None,
    critic.rest if critic is not None else None,
    critic_optimizer,
    teacher=parts.teacher,
  )
  return Run(
    spec=spec,
    parts=parts,
    workdir=workdir,
    loss_cfg=loss_cfg,
    optimizer=optimizer,
    critic_optimizer=critic_optimizer,
    states=states,
    update=PolicyUpdate(model_parts, spec, loss_cfg, spec.algorithm.estimator, parts.mesh, states.sharding),
    weights=SamplerWeights(parts.sampler, parts.sampler_shardings),
    checkpointer=Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=spec.checkpoint.keep),
    task_fingerprint=task_fingerprint(parts.task, parts.train_stream.rows),
  )


def new_state(run: Run, params, optimizer=None, critic_params=None, *, sharding=None):
  """A fresh TrainState of `params` (+ `critic_params`) under `optimizer` (the run's by default),
  placed on the run's mesh."""
  return run.states.new(params, optimizer, critic_params, sharding=sharding)


def rows_at(run: Run, position: int, n: int) -> list[dict]:
  """Rows position..position+n of the run's training stream (data/row_stream.RowStream: every row
  once per epoch, reshuffled per epoch by the run's seed)."""
  return run.parts.train_stream.at(position, n)


def rollout(run: Run, rows, *, sampler=None, num_chains=None, temperature=None, seed=0) -> list:
  """Trajectories of `rows` (group_id = row index) by the run's agent (or its endpoint agent) on
  `sampler` (default the run's) under the run's rollout limits; see `stages.rollout`."""
  p = run.parts
  return stages.rollout(
    p.agent,
    rows,
    sampler=sampler or p.sampler,
    rollout_spec=run.spec.rollout,
    end_of_turn_id=p.end_of_turn_id,
    env_provider=p.env_provider,
    agent_fn=p.task.agent_fn,
    reward_only_fields=p.task.reward_only_fields,
    num_chains=num_chains,
    temperature=temperature,
    seed=seed,
  )


def vision_arrays_of(run) -> tuple | None:
  """(image processor, policy ModelConfig, patch multiple) of a vision-language policy's run, else None."""
  cfg = run.parts.model_config
  if cfg is None or cfg.vision is None:
    return None
  if run.parts.agent.vision is None:
    raise ValueError(f"config.model.family={run.spec.model.family!r} trains on images but the agent has no vision")
  return run.parts.agent.vision, cfg, run.spec.model.vision.patch_multiple

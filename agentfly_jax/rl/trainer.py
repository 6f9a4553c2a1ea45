"""`Trainer`: the notebook's one-object door to a run, over the functions of rl/run.py and rl/loop.py.

    trainer = Trainer(config, workdir, task=None)   # RunSpec.from_config (the one parse) + open_run
    records = trainer.train()                       # rl/loop.train_run; trainer.state: the final TrainState
    trajs = trainer.rollout(rows)                   # the run's agent and sampler (rl/run.rollout)
    metrics = trainer.evaluate(params)              # greedy eval (rl/evaluation.py)

Scripts that already hold a RunSpec call the functions directly (experiments/train.py:
`build_run` + `loop.train`). The run's parts are `trainer.run.parts` (tokenizer, agent, sampler,
policy halves, rows, ...), its programs `trainer.run` (loss_cfg, optimizer, update, states,
weights, checkpointer); the SFT warm start and its cache are rl/sft_cache.py's functions of `trainer.run`.
"""

from __future__ import annotations

from typing import Callable

from agentfly_jax.rl import evaluation, loop, run as run_ops
from agentfly_jax.rl.spec import RunSpec


class Trainer:
  """One run: `config` (an ml_collections config: configs/*.py + flags; one saved by an older
  version is migrated) parsed once into `self.spec`; `task`: a `Task` given in Python instead of
  `config.task`; `self.run`: the run's fixed parts (rl/run.Run). Nothing below reads the
  ConfigDict again."""

  def __init__(self, config, workdir: str, *, task=None):
    self.spec = RunSpec.from_config(config, custom_task=task is not None)
    self.run = run_ops.open_run(self.spec, workdir, task=task)
    self.state = None  # the final TrainState after `train()`

  def train(self, *, before_step: Callable[[int], None] | None = None) -> list[dict]:
    """Runs (or resumes) the run to `train.steps`; returns the metrics records (process 0; [] on
    the others) and leaves the final TrainState in `self.state`."""
    records, final = loop.train_run(self.run, before_step=before_step)
    self.state = final.state
    return records

  def rollout(self, rows, *, sampler=None, num_chains=None, temperature=None, seed=0) -> list:
    """Trajectories of `rows` (group_id = row index), see rl/run.rollout."""
    return run_ops.rollout(self.run, rows, sampler=sampler, num_chains=num_chains, temperature=temperature, seed=seed)

  def evaluate(self, params, rows=None, *, seed=0) -> dict:
    """Greedy single-chain rollout on `rows` (default the eval rows) -> eval/* metrics."""
    return evaluation.evaluate(self.run, params, rows, seed=seed)

  def new_state(self, params, optimizer=None, critic_params=None, *, sharding=None):
    """A fresh TrainState (optimizer: the run's by default), placed on the mesh."""
    return run_ops.new_state(self.run, params, optimizer, critic_params, sharding=sharding)

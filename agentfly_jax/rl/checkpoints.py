"""A run's checkpoints: the TrainState every `checkpoint.every` steps with the data position (and a
LoRA run's base identity), and the KL reference kept apart so keep-last-N never deletes it.

    save(run, step, state, data_position)
    state, data_position = restore(run, step, state)      # a LoRA checkpoint only onto its own base
    ref_params = kl_reference(run, state.params, resumed=False)   # None without KL
    opened = open_for_evaluation(workdir, step=None)         # a saved run, its checkpoint on the sampler
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import jax.numpy as jnp

from agentfly_jax.checkpoint import Checkpointer
from agentfly_jax.rl.run import Run, open_run
from agentfly_jax.rl.spec import RunSpec


def checkpoint_meta(run: Run, data_position: int) -> dict:
  """A checkpoint's JSON: the data position, and under LoRA the base's identity (the state holds
  only the adapters)."""
  meta = {"data_position": data_position}
  if run.parts.base_identity is not None:
    meta["lora_base"] = run.parts.base_identity
  return meta


def check_lora_base(run: Run, meta: dict, step: int) -> None:
  """A LoRA checkpoint resumes only onto the base it was trained on: ValueError naming both."""
  ours, saved = run.parts.base_identity, meta.get("lora_base")
  if ours is not None and saved is not None and saved["sha256"] != ours["sha256"]:
    raise ValueError(
      f"{run.checkpointer.directory} step {step}: its LoRA adapters were trained on the base "
      f"{saved['source']} (sha256 {saved['sha256'][:12]}...), but this run's base "
      f"{ours['source']} has sha256 {ours['sha256'][:12]}..."
    )


def save(run: Run, step: int, state, data_position: int) -> None:
  """Saves `state` as step `step` (asynchronously; `run.checkpointer.wait()` to finish)."""
  run.checkpointer.save(step, state, checkpoint_meta(run, data_position))


def restore(run: Run, step: int, state) -> tuple[object, int]:
  """(the TrainState of checkpoint `step`, restored into `state`'s structure and shardings, the
  data position it was saved at)."""
  state, meta = run.checkpointer.restore(step, state)
  check_lora_base(run, meta, step)
  return state, int(meta["data_position"])


def kl_reference(run: Run, params, *, resumed: bool):
  """The KL reference (None when `loss.kl_coef` is 0): the policy at RL step 0, a copy
  (train_step donates state.params) kept in its own checkpoint so keep-last-N never deletes it and
  a resumed run uses the same one. Under LoRA `params` are the adapters: the reference is the
  shared frozen base + a copy of the step-0 adapters (zero B, i.e. the base itself, unless an SFT
  warm start trained them), so no second copy of the base weights exists."""
  if run.spec.loss.kl_coef <= 0:
    return None
  ref_ckpt = Checkpointer(os.path.join(run.workdir, "reference"), max_to_keep=1, async_save=False)
  if resumed:
    ref = ref_ckpt.restore(None, {"params": params})[0]["params"]
  else:
    ref = jax.tree.map(jnp.copy, params)
    ref_ckpt.save(0, {"params": ref}, {})
  ref_ckpt.close()
  return ref


@dataclasses.dataclass(frozen=True)
class OpenedRun:
  """A saved run opened for evaluation: the run rebuilt from its config.json, the TrainState of
  checkpoint `step` (already on the run's sampler), and, when the task the config rebuilds differs
  from the one the run trained on (task.json's fingerprint), why (else None)."""

  run: Run
  state: Any
  step: int
  task_changed: str | None = None


def open_for_evaluation(
  workdir: str, step: int | None = None, *, config=None, task=None, allow_changed_task: bool = False
) -> OpenedRun:
  """The run saved in `workdir` (config.json, read only; `config`: this config instead, e.g. the saved
  one with a rollout field changed), its checkpoint `step` (default the latest)
  restored through `restore` (a LoRA checkpoint only onto the base it was trained on) and pushed to
  the run's sampler; the run's compiled programs load from its compile cache. `task`: a Task /
  TaskSpec given in Python instead of the config's. FileNotFoundError when the folder holds no run
  or no checkpoint; ValueError when the task does not rebuild, the LoRA base differs, or the task's
  content differs from the one trained on (unless `allow_changed_task`: then `task_changed` says why)."""
  from agentfly_jax.rl.scale.compile_cache import enable_compile_cache
  from agentfly_jax.tasks.from_config import task_fingerprint

  workdir = os.path.abspath(workdir)
  path = os.path.join(workdir, "config.json")
  if config is None:
    if not os.path.exists(path):
      raise FileNotFoundError(f"{path} not found (is {workdir} a run directory written by training?)")
    with open(path) as f:
      config = json.load(f)
  spec = RunSpec.from_config(config)  # a run saved by any version (migrated inside): today's fields
  enable_compile_cache(spec.train.compile_cache)
  spec = dataclasses.replace(spec, log=dataclasses.replace(spec.log, progress=False))
  run = open_run(spec, workdir, task=task)
  changed = None
  record = os.path.join(workdir, "task.json")
  if os.path.exists(record):
    with open(record) as f:
      trained = json.load(f)
    if trained["fingerprint"] != task_fingerprint(run.parts.task, run.parts.train_stream.rows):
      changed = (
        f"{workdir} was trained on a task ({trained['name']!r}) whose content (rows, tools, reward, demo policy) "
        "differs from what its config.json rebuilds (a Task given in Python, or edited task files)"
      )
      if not allow_changed_task:
        raise ValueError(changed)
  step = run.checkpointer.latest_step() if step is None else step
  if step is None or step not in run.checkpointer.all_steps():
    raise FileNotFoundError(
      f"{run.checkpointer.directory}: no checkpoint"
      + ("" if step is None else f" of step {step}")
      + f" (saved steps: {run.checkpointer.all_steps()})"
    )
  policy, critic = run.parts.policy, run.parts.critic
  state = run.states.new(policy.params, critic_params=critic.params if critic is not None else None)
  state, _ = restore(run, step, state)
  run.parts.sampler.update_weights(state.params)
  return OpenedRun(run=run, state=state, step=step, task_changed=changed)

"""A run's checkpoints: the TrainState every `checkpoint.every` steps with the data position (and a
LoRA run's base identity), and the KL reference kept apart so keep-last-N never deletes it.

    save(run, step, state, data_position)
    state, data_position = restore(run, step, state)      # a LoRA checkpoint only onto its own base
    ref_params = kl_reference(run, state.params, resumed=False)   # None without KL
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp

from agentfly_jax.checkpoint import Checkpointer
from agentfly_jax.rl.run import Run


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

"""Orbax checkpoints of the whole training state: params, optimizer, step, RNG, data position.

`Checkpointer(directory, max_to_keep=3, async_save=True)` wraps an orbax `CheckpointManager`
with two items per step: `state` (any pytree of arrays: the TrainState) and `meta` (JSON: data
position, RNG seeds, config snapshot, ...). Saves are asynchronous (orbax writes in a background
thread); `wait()` blocks until the last save is durable. A run killed mid-save leaves the previous
step intact (orbax commits a step atomically by renaming its temporary directory).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp


class Checkpointer:
  """Keep-last-N, async orbax checkpoints of (state pytree, JSON metadata)."""

  def __init__(self, directory: str, *, max_to_keep: int = 3, async_save: bool = True):
    self.directory = os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True, enable_async_checkpointing=async_save)
    self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, state: Any, meta: dict) -> None:
    """Starts saving `state` (pytree of jax/np arrays) and `meta` (JSON-able) as `step`."""
    self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))

  def restore(self, step: int | None, target: Any) -> tuple[Any, dict]:
    """Restores (state, meta) at `step` (latest if None) into the structure/shardings of `target`.

    `target` is a pytree like the saved state (e.g. a freshly initialised TrainState); its arrays'
    shardings decide where restored arrays are placed. A state saved with the other decoder-layer
    layout (unrolled vs scanned, `models/layer_stack.py`) is restored in its own layout, then
    stacked / unstacked into `target`'s and placed with `target`'s shardings.
    """
    from agentfly_jax.models.layer_stack import to_layout, tree_layout

    if step is None:
      step = self.latest_step()
    if step is None:
      raise FileNotFoundError(f"no checkpoint to restore in {self.directory}")
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
    want = tree_layout(abstract)
    saved = tree_layout(self._manager.item_metadata(step)["state"]) if want else None
    restored = self._manager.restore(
      step,
      args=ocp.args.Composite(state=ocp.args.StandardRestore(to_layout(abstract, saved)), meta=ocp.args.JsonRestore()),
    )
    state = restored["state"]
    if saved is not None and saved != want:
      shardings = jax.tree.map(lambda x: x.sharding, abstract)
      state = jax.device_put(to_layout(state, want), shardings)
    return state, dict(restored["meta"])

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()

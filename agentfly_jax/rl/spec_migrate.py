"""Saved run configs brought up to today's fields (rl/spec.migrate is the entry point): options added since get
the behaviour the saving version had, removed options at their neutral value are dropped, legacy fields mapped.
Pure dict work over today's defaults (passed in), so this module imports nothing of the spec."""

from __future__ import annotations

from typing import Mapping

from agentfly_jax.rl.spec_section import fail

# What runs saved before a field existed did without it, where it differs from today's default (else: the default).
OLD_BEHAVIOUR = {
  ("train", "logits_capacity"): (),  # before the field: log-probs at every position
}


# Options removed since: the value under which a saved run behaved as today's code does (the field is dropped);
# any other value names a behaviour this version no longer has, and loading it is refused.
REMOVED = {
  ("rollout", "branch_temperature"): 0.0,  # turn shared_turns alone sampled at another temperature
  ("train", "skip_zero_adv_rows"): False,  # tied groups' rows left out of the update (True: see _migrate_skip)
  ("train", "skip_keeps_batch_mean"): False,  # with the skip: those rows kept in the loss's denominator
  ("loss", "neg_adv_weight"): 1.0,  # negative advantages scaled
  ("dapo", "cut_turn_penalty"): 0.0,  # a chain cut at max_tokens_per_turn scored below its reward
  ("eval", "counted_checkpoint"): "last_within_budget",  # the counted-step rule (it had one value)
}

# A user task's env fields that became keys of config.task.row_defaults, in groups: a group's fields are copied
# over when any of them is set (the value "" of the other kept: a row naming either OpenEnv server kept its own).
TASK_ROW_DEFAULT_GROUPS = (("gym_id",), ("openenv_url", "openenv_app"))


def migrate_saved(config, defaults: dict) -> dict:
  """`config` (a dict or ConfigDict saved by any earlier version) over `defaults` (today's RunSpec as a dict):
  every field it lacks gets the value that version ran with (OLD_BEHAVIOUR, else today's default); what it has
  is kept; a removed option at its neutral value is dropped (REMOVED; another value: an error naming it). Nested
  free mappings (mesh.rules) are merged key by key."""
  saved = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  saved = {k: dict(v) if isinstance(v, Mapping) else v for k, v in saved.items()}  # (the caller's dict kept)
  _migrate_skip(saved)
  for (section, key), neutral in REMOVED.items():
    values = saved.get(section)
    if isinstance(values, dict) and key in values:
      if values[key] != neutral:
        fail(f"{section}.{key}", values[key], f"removed option; a saved run loads only with its neutral {neutral!r}")
      del values[key]
  merged = defaults
  for (section, key), value in OLD_BEHAVIOUR.items():
    if key not in (saved.get(section) or {}):
      merged[section][key] = value
  _migrate_model_remat(saved)
  _migrate_task_row_defaults(saved)
  _overlay(merged, saved)
  return merged


def _migrate_skip(saved: dict) -> None:
  """train.skip_zero_adv_rows with skip_keeps_batch_mean (both True) made the unskipped update at a smaller cost
  (the tied rows' advantages are 0 and they stayed in the mean): today's update, so both are dropped."""
  train = saved.get("train")
  if isinstance(train, dict) and train.get("skip_zero_adv_rows") is True and train.get("skip_keeps_batch_mean") is True:
    train.pop("skip_zero_adv_rows")
    train.pop("skip_keeps_batch_mean")


def _migrate_model_remat(saved: dict) -> None:
  """The legacy bool model.remat (before train.remat) as train.remat: True = "full"; train.remat wins when set."""
  model = saved.get("model")
  if not isinstance(model, dict) or "remat" not in model:
    return
  legacy = model["remat"]
  saved["model"] = {k: v for k, v in model.items() if k != "remat"}  # (the caller's dict left as it was)
  if not isinstance(legacy, bool):
    fail("model.remat", legacy, "legacy field: a bool (use train.remat for a policy name)")
  if legacy and not (saved.get("train") or {}).get("remat"):
    saved["train"] = {**(saved.get("train") or {}), "remat": "full"}


def _migrate_task_row_defaults(saved: dict) -> None:
  """A user task's legacy config.task.gym_id / openenv_url / openenv_app as config.task.row_defaults (the keys
  row_defaults already has win)."""
  task = saved.get("task")
  if not isinstance(task, dict) or not any(f in task for group in TASK_ROW_DEFAULT_GROUPS for f in group):
    return
  task = dict(task)  # (the caller's dict left as it was)
  row_defaults = dict(task.get("row_defaults") or {})
  for group in TASK_ROW_DEFAULT_GROUPS:
    values = {f: task.pop(f, "") for f in group}
    if any(values.values()):
      row_defaults = {**values, **row_defaults}
  task["row_defaults"] = row_defaults
  saved["task"] = task


def _overlay(base: dict, saved: dict) -> None:
  for key, value in saved.items():
    if isinstance(value, dict) and isinstance(base.get(key), dict):
      _overlay(base[key], value)
    else:
      base[key] = value

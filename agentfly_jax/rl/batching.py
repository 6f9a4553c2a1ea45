"""From trajectories to training arrays: rollout metrics, DAPO filters, advantages, minibatches.

Pure numpy/jnp helpers the trainer loop calls between the rollout and `train_step`.
"""
from __future__ import annotations

import collections
from typing import Sequence

import numpy as np


def bucket(n: int, multiple: int) -> int:
  return max(multiple, -(-n // multiple) * multiple)


def rollout_metrics(trajs: Sequence, *, success_threshold: float = 0.5, prefix: str = "rollout") -> dict:
  """reward mean/std, success rate, turns (mean, max), tool calls and tool errors per tool,
  environments allocated (per chain, per env type), finish reasons, tokens (AgentFly's panels)."""
  rewards = np.array([t.reward for t in trajs], np.float64)
  m = {
      f"{prefix}/reward_mean": float(rewards.mean()) if len(rewards) else 0.0,
      f"{prefix}/reward_std": float(rewards.std()) if len(rewards) else 0.0,
      f"{prefix}/success_rate": float((rewards > success_threshold).mean()) if len(rewards) else 0.0,
      f"{prefix}/turns_mean": float(np.mean([t.num_turns for t in trajs])) if trajs else 0.0,
      f"{prefix}/turns_max": int(max((t.num_turns for t in trajs), default=0)),
      f"{prefix}/tokens_total_mean": float(np.mean([len(t.token_ids) for t in trajs])) if trajs else 0.0,
      f"{prefix}/tokens_generated_mean": float(np.mean([int(t.action_mask.sum()) for t in trajs])) if trajs else 0.0,
      f"{prefix}/num_chains": len(trajs),
  }
  calls = collections.Counter(c.get("name", "?") for t in trajs for c in t.tool_calls)
  failed = sum(1 for t in trajs for c in t.tool_calls if not c.get("ok", True))
  m[f"{prefix}/tool_calls_per_chain"] = sum(calls.values()) / max(1, len(trajs))
  m[f"{prefix}/tool_errors_per_chain"] = failed / max(1, len(trajs))
  errors = collections.Counter(c.get("name", "?") for t in trajs for c in t.tool_calls if not c.get("ok", True))
  for name, count in calls.items():
    m[f"{prefix}/tool_calls/{name}"] = count / max(1, len(trajs))
    m[f"{prefix}/tool_errors/{name}"] = errors[name] / max(1, len(trajs))
  envs = collections.Counter(name for t in trajs for name in getattr(t, "env_names", ()))
  m[f"{prefix}/envs_per_chain"] = sum(envs.values()) / max(1, len(trajs))
  for name, count in envs.items():
    m[f"{prefix}/envs/{name}"] = count
  for reason, count in collections.Counter(t.finish_reason for t in trajs).items():
    m[f"{prefix}/finish/{reason}"] = count / max(1, len(trajs))
  extra = collections.defaultdict(list)
  for t in trajs:
    for k, v in (t.reward_metrics or {}).items():
      if isinstance(v, (int, float)):
        extra[k].append(float(v))
  for k, vs in extra.items():
    m[f"{prefix}/reward_metric/{k}"] = float(np.mean(vs))
  return m


def drop_zero_variance_groups(trajs: Sequence) -> tuple[list, int]:
  """DAPO dynamic sampling: keep only groups whose rewards differ. Returns (kept, groups dropped)."""
  groups = collections.defaultdict(list)
  for t in trajs:
    groups[t.group_id].append(t)
  kept, dropped = [], 0
  for gid in sorted(groups):
    rs = [t.reward for t in groups[gid]]
    if len(rs) > 1 and max(rs) - min(rs) > 1e-9:
      kept.extend(groups[gid])
    else:
      dropped += 1
  return kept, dropped


def overlong_penalty(num_generated: np.ndarray, *, max_tokens: int, buffer: int, factor: float) -> np.ndarray:
  """DAPO soft overlong punishment, counted in generated tokens: 0 up to max-buffer, then linear
  down to -factor at max_tokens (and below past it)."""
  if buffer <= 0:
    return np.zeros_like(num_generated, dtype=np.float32)
  over = np.asarray(num_generated, np.float32) - (max_tokens - buffer)
  return -np.clip(over, 0, None) / buffer * factor


def to_microbatches(batch: dict, rows: np.ndarray, micro_batch_size: int, num_micro: int | None = None) -> dict:
  """Selects `rows` and reshapes every array to [M, micro_batch_size, ...], padding with
  all-masked copies of row 0 (they add 0 to every loss sum and denominator). A fixed `num_micro`
  keeps shapes static across steps (no recompiles when the batch shrinks)."""
  n = len(rows)
  m = max(num_micro or 0, -(-n // micro_batch_size))
  total = m * micro_batch_size
  idx = np.concatenate([rows, np.full(total - n, rows[0] if n else 0, rows.dtype)])
  valid = np.arange(total) < n
  out = {}
  for k, v in batch.items():
    sel = v[idx]
    if k == "action_mask":
      sel = sel & valid[:, None]
    out[k] = sel.reshape(m, micro_batch_size, *sel.shape[1:])
  return out

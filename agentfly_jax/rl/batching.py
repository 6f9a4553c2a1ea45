"""From trajectories to training arrays: rollout metrics, DAPO filters, advantages, minibatches.

Pure numpy/jnp helpers the trainer loop calls between the rollout and `train_step`.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import numpy as np

from agentfly_jax.agents.display import mask_segments
from agentfly_jax.rl.core.shaping import overlong_penalty  # noqa: F401 (its home is core: prepare jits it)


def bucket(n: int, multiple: int) -> int:
  return max(multiple, -(-n // multiple) * multiple)


def train_arrays(trajs: Sequence, *, pad_id: int, multiple: int = 64, length: int | None = None) -> dict:
  """Trajectories -> target-aligned padded arrays; the one place the next-token shift happens.

  Position t of every [B, L] array describes predicting token t+1 of the trajectory from tokens
  0..t: input_ids[t] = token t, target_ids[t] = token t+1, attention_mask of the inputs,
  action_mask / sampler_logprobs of the targets. L = `length`, else the longest trajectory minus
  one rounded up to `multiple` (few distinct shapes, few compilations).

  Returns {"input_ids" int32[B, L], "target_ids" int32[B, L], "attention_mask" bool[B, L],
  "action_mask" bool[B, L], "sampler_logprobs" f32[B, L], "rewards" f32[B], "group_ids" int32[B]}; when
  a trajectory carries the sampler's routes (a mixture-of-experts policy), "rollout_experts" int32[B, L, Lm, k]
  too: the experts of each input token (-1 where none was recorded; `rollout_routes`).
  """
  from agentfly_jax.agents.trajectory import pad_batch

  need = max(len(t.token_ids) for t in trajs) - 1
  if length is None:
    length = bucket(need, multiple)
  elif length < need:
    raise ValueError(f"train_arrays: length={length} < longest trajectory - 1 = {need}")
  arr = pad_batch(trajs, max_len=length + 1, pad_id=pad_id)
  out = {
    "input_ids": arr["token_ids"][:, :-1],
    "target_ids": arr["token_ids"][:, 1:],
    "attention_mask": arr["attention_mask"][:, :-1],
    "action_mask": arr["action_mask"][:, 1:],
    "sampler_logprobs": arr["sampler_logprobs"][:, 1:].astype(np.float32),
    "rewards": np.asarray(arr["rewards"], np.float32),
    "group_ids": np.asarray(arr["group_ids"], np.int32),
  }
  routes = rollout_routes(trajs, length)
  if routes is not None:
    out["rollout_experts"] = routes
  return out


def rollout_routes(trajs: Sequence, length: int) -> np.ndarray | None:
  """int32[B, length, Lm, k]: each trajectory's recorded routes (Trajectory.routed_experts) at its input
  positions, -1 where none was recorded (a chain's tail the sampler never fed, a trajectory without routes,
  padding: the trainer's router decides there, models/moe.route); None when no trajectory has routes."""
  shapes = {t.routed_experts.shape[1:] for t in trajs if getattr(t, "routed_experts", None) is not None}
  if not shapes:
    return None
  if len(shapes) > 1:
    raise ValueError(f"trajectories carry routes of different shapes [Lm, k]: {sorted(shapes)}")
  out = np.full((len(trajs), length, *shapes.pop()), -1, np.int32)
  for i, t in enumerate(trajs):
    if getattr(t, "routed_experts", None) is not None:
      n = min(len(t.routed_experts), length)
      out[i, :n] = t.routed_experts[:n]
  return out


def chain_success(traj, threshold: float = 0.5) -> bool:
  """A chain's success: its reward's own "success" metric where the reward reports one (WebShop:
  reward 1.0, where a partial purchase scores 0.25-0.83), else reward > `threshold`."""
  own = (traj.reward_metrics or {}).get("success")
  return float(own) > 0 if isinstance(own, (int, float)) else bool(traj.reward > threshold)


def rollout_metrics(trajs: Sequence, *, success_threshold: float = 0.5, prefix: str = "rollout") -> dict:
  """reward mean/std, success rate, turns (mean, max), tool calls and tool errors per tool,
  environments allocated (per chain, per env type), finish reasons, tokens (AgentFly's panels).

  Success: `chain_success` per chain."""
  rewards = np.array([t.reward for t in trajs], np.float64)
  success = np.array([chain_success(t, success_threshold) for t in trajs], np.float64)
  m = {
    f"{prefix}/reward_mean": float(rewards.mean()) if len(rewards) else 0.0,
    f"{prefix}/reward_std": float(rewards.std()) if len(rewards) else 0.0,
    f"{prefix}/success_rate": float(success.mean()) if len(rewards) else 0.0,
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
  branch = group_branch_turns(trajs)
  if branch:  # groups of >= 2 chains: the turn where their chains first differ
    m[f"{prefix}/group_branch_turn_mean"] = float(np.mean(branch))
  clamped = sum(getattr(t, "clamped_requests", 0) for t in trajs)
  if clamped:  # endpoint requests whose max_tokens was clamped to the run's per-turn limit
    m[f"{prefix}/clamped_max_tokens"] = clamped
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


def model_turns(traj) -> list[tuple[int, ...]]:
  """A trajectory's model turns: each maximal run of `action_mask` True, as a tuple of ids."""
  ids = np.asarray(traj.token_ids).tolist()
  return [tuple(ids[a:b]) for a, b, is_model in mask_segments(traj.action_mask) if is_model]


def group_branch_turns(trajs: Sequence) -> list[int]:
  """For each group of >= 2 chains, the first model turn (0-based) at which its chains' tokens
  differ (a group whose chains never differ: its shortest chain's number of turns). With
  `rollout.shared_turns=K` and a deterministic environment every group branches at >= K."""
  groups = collections.defaultdict(list)
  for t in trajs:
    groups[t.group_id].append(model_turns(t))
  out = []
  for chains in groups.values():
    if len(chains) < 2:
      continue
    shortest = min(len(c) for c in chains)
    out.append(next((k for k in range(shortest) if len({c[k] for c in chains}) > 1), shortest))
  return out


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


def micro_batch_layout(num_rows: int, max_micro_batch_size: int, multiple: int = 1) -> tuple[int, int]:
  """(micro_batch_size, num_micro) for `num_rows` rows with at most `max_micro_batch_size` rows
  per micro-batch: the fewest micro-batches, then the smallest equal size that holds the rows,
  rounded up to a multiple of `multiple` (the data-parallel axis), so a batch is never padded up
  to the cap (8 rows with a cap of 16 -> (8, 1); 24 -> (12, 2)). With multiple 1, padding is
  under num_micro rows."""
  if max_micro_batch_size < 1 or multiple < 1:
    raise ValueError(
      f"micro_batch_layout: max_micro_batch_size and multiple must be >= 1, got {max_micro_batch_size}, {multiple}"
    )
  n = max(1, int(num_rows))
  num_micro = -(-n // max_micro_batch_size)
  size = -(-n // num_micro)
  return -(-size // multiple) * multiple, num_micro


def minibatch_layout(rollout, train, fsdp: int = 1) -> tuple[int, int]:
  """(rows per micro-batch, micro-batches per minibatch) of a run's train steps: the step's
  `rollout.rows_per_step x rollout.num_chains` rows in `train.minibatches` minibatches, each in
  micro-batches of at most `train.micro_batch_size` rows, a multiple of `fsdp` (`micro_batch_layout`:
  no padding up to the cap). `rollout` / `train`: the run spec's or config's sections."""
  per_minibatch = -(-rollout.rows_per_step * rollout.num_chains // train.minibatches)
  return micro_batch_layout(per_minibatch, train.micro_batch_size, fsdp)


def microbatch_index(rows: np.ndarray, micro_batch_size: int, num_micro: int | None = None):
  """Row indices [M, mb] selecting `rows` in order, padded with row 0 (or rows[0]), and a
  validity mask [M, mb] (False on padding). With `num_micro` given, mb = `micro_batch_size` and
  M = max(num_micro, rows needed): a fixed layout keeps shapes static across steps (no
  recompiles when the batch shrinks). Without it, `micro_batch_size` is a cap and the layout is
  `micro_batch_layout(len(rows), micro_batch_size)` (no padding up to the cap)."""
  rows = np.asarray(rows)
  n = len(rows)
  if num_micro is None:
    micro_batch_size, num_micro = micro_batch_layout(n, micro_batch_size)
  m = max(num_micro or 0, -(-n // micro_batch_size))
  total = m * micro_batch_size
  idx = np.concatenate([rows, np.full(total - n, rows[0] if n else 0, rows.dtype)])
  valid = np.arange(total) < n
  return idx.reshape(m, micro_batch_size).astype(np.int32), valid.reshape(m, micro_batch_size)


def take_microbatches(batch: dict, idx, valid) -> dict:
  """Every [B, ...] array of `batch` -> [M, mb, ...] rows `idx`; `action_mask` is cleared where
  `valid` is False (padding rows add 0 to every loss sum and denominator). Works on numpy arrays
  and, inside jit, on jnp arrays."""
  out = {}
  for k, v in batch.items():
    sel = v[idx]
    if k == "action_mask":
      sel = sel & valid[..., None]
    out[k] = sel
  return out


def to_microbatches(batch: dict, rows: np.ndarray, micro_batch_size: int, num_micro: int | None = None) -> dict:
  """Selects `rows` and reshapes every array to [M, micro_batch_size, ...], padding with
  all-masked copies of row 0 (see `microbatch_index`, `take_microbatches`)."""
  idx, valid = microbatch_index(rows, micro_batch_size, num_micro)
  return take_microbatches(batch, idx, valid)


def pad_rows(arrays: dict, multiple: int) -> dict:
  """Pads every [B, ...] array of `train_arrays` output to a multiple of `multiple` rows with
  inert rows: nothing attended or trained on, reward 0, and group ids -1, -2, ... (each its own
  group, so no real group's advantages change). Real rows are those with group_ids >= 0."""
  b = len(arrays["group_ids"])
  pad = -b % multiple
  if not pad:
    return arrays
  out = {}
  for k, v in arrays.items():
    fill = np.zeros((pad, *v.shape[1:]), v.dtype)
    if k == "group_ids":
      fill = -1 - np.arange(pad, dtype=v.dtype)
    elif k == "attention_mask":
      fill[:, 0] = True  # one attended position: no all-masked softmax
    out[k] = np.concatenate([v, fill])
  return out

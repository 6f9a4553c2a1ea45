"""The stages of one RL step as plain functions: each takes what it uses and returns what it makes.

    rows = train_stream.at(position, n)                                    # data/row_stream.RowStream
    trajs = rollout(agent, rows, sampler=..., rollout_spec=spec.rollout, ...)
    arrays, metrics = step_arrays(trajs, pad_id=..., dynamic_sampling=...)  # host arrays or None
    state, metrics = update(policy_update, state, ref_params, arrays, step)
    metrics = sync(weights, state.params)                                 # {"sync/bytes": ...}
    metrics = evaluate(weights, params, lambda: rollout(...), keep_loaded=...)

`rl/loop.py` composes them; the SFT warm start is `rl/sft_cache.train_sft` (rl/sft.train_on_demos' steps).
Nothing here keeps state between calls: the counters a step reports are differences of snapshots taken around it.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from typing import Any, Callable, Sequence

import jax

from agentfly_jax.data.row_fields import REWARD_ONLY_FIELDS
from agentfly_jax.rl import distributed
from agentfly_jax.rl.batching import drop_zero_variance_groups, rollout_metrics, train_arrays
from agentfly_jax.sampling.protocol import SamplingParams, SyncStats


def rollout(
  agent,
  rows: list[dict],
  *,
  sampler,
  rollout_spec,
  end_of_turn_id: int,
  env_provider,
  agent_fn: Callable | None = None,
  reward_only_fields: Sequence[str] = REWARD_ONLY_FIELDS,
  num_chains: int | None = None,
  temperature: float | None = None,
  seed: int = 0,
) -> list:
  """Trajectories of `rows` (group_id = row index) under `rollout_spec` (rl/spec.RolloutSection;
  `num_chains` / `temperature` override it, as the greedy eval's does). On several processes each rolls out its share of
  the rows with its own sampler and all get the whole list back. `agent_fn`: a black-box agent
  run through the OpenAI-compatible endpoint instead of the built-in loop. `reward_only_fields`: the row
  fields no agent sees (the task's; data/row_fields.py)."""
  from agentfly_jax.agents.rollout import run_rollout

  r = rollout_spec
  local = distributed.process_share(rows, "rows of a rollout")
  run = run_rollout
  if agent_fn is not None:
    from agentfly_jax.agents.endpoint_rollout import run_endpoint_rollout

    run = functools.partial(run_endpoint_rollout, agent_fn=agent_fn, max_body_bytes=r.endpoint_max_body_bytes)
  params = SamplingParams(
    temperature=r.temperature if temperature is None else temperature,
    top_p=r.top_p,
    top_k=r.top_k,
    max_new_tokens=r.max_tokens_per_turn,
    stop_token_ids=(end_of_turn_id,),
  )
  trajs = run(
    agent,
    local,
    sampler=sampler,
    num_chains=num_chains or r.num_chains,
    max_turns=r.max_turns,
    sampling_params=params,
    max_tokens_per_turn=r.max_tokens_per_turn,
    max_total_tokens=r.max_total_tokens,
    # at most a training step's chains at once, in evaluations too: the env pools are sized for a step, and a
    # chain waiting on a full pool past the acquire timeout fails (64 shop test goals at once on 32 instances did)
    concurrency=min(r.concurrency, r.rows_per_step * r.num_chains),
    seed=seed,
    group_offset=distributed.share_offset(len(rows)),
    env_provider=env_provider,
    shared_turns=r.shared_turns,
    chain_timeout_s=r.chain_timeout_s,
    reward_only_fields=reward_only_fields,
  )
  return distributed.gather_objects(trajs)


def scored(trajs: list, metric: str) -> list:
  """The trajectories with `reward` replaced by the score they train on: their reward metric `metric`
  (`loss.score_metric`: advantages from e.g. the success indicator while the shaped reward is logged;
  "" = the reward). A trajectory without that metric: ValueError naming it and the metrics it has."""
  if not metric:
    return trajs
  out = []
  for t in trajs:
    value = (t.reward_metrics or {}).get(metric)
    if not isinstance(value, (int, float)):
      raise ValueError(
        f"config.loss.score_metric={metric!r}: trajectory (group {t.group_id}, chain {t.chain_id}) has no number "
        f"under that name; its reward metrics: {sorted(t.reward_metrics or {})}"
      )
    out.append(dataclasses.replace(t, reward=float(value)))
  return out


def step_arrays(
  trajs: list,
  *,
  pad_id: int,
  dynamic_sampling: bool,
  score_metric: str = "",
  turn_level: bool = False,
  vision: tuple | None = None,
) -> tuple[dict | None, dict]:
  """(target-aligned host arrays of the trajectories that train, or None when DAPO's dynamic
  sampling dropped every group; the rollout's metrics: rollout/*, dapo/groups_dropped). The host half
  of the training batch: `update`'s jitted prepare (rl/core/prepare.py) makes the batch from these. Rewards
  are the trajectories' scores (`scored`: the reward or its metric `score_metric`); rollout/* report the rewards as they were. `turn_level`:
  + the per-turn rewards and anchor ids of rl/turn_rewards.turn_arrays (turn-level estimators).
  `vision`: (VisionProcessor, the policy's ModelConfig, patch_multiple) of a vision-language policy:
  + each row's images (rl/vision_batch.image_arrays)."""
  metrics: dict[str, Any] = rollout_metrics(trajs)
  trajs = [t for t in trajs if len(t.token_ids)]  # a chain that failed before any request: counted, not trained
  trajs = scored(trajs, score_metric)
  if dynamic_sampling:
    trajs, dropped = drop_zero_variance_groups(trajs)
    metrics["dapo/groups_dropped"] = dropped
  if not trajs:
    return None, metrics
  arrays = train_arrays(trajs, pad_id=pad_id)
  if turn_level:
    from agentfly_jax.rl.turn_rewards import turn_arrays

    arrays.update(turn_arrays(trajs))
  if vision is not None:
    from agentfly_jax.rl.vision_batch import image_arrays

    processor, model_cfg, patch_multiple = vision
    length = arrays["input_ids"].shape[1]
    arrays.update(image_arrays(trajs, processor, model_cfg, length=length, patch_multiple=patch_multiple))
  return arrays, metrics


def update(policy_update, state, ref_params, arrays: dict | None, step: int) -> tuple[Any, dict]:
  """(the new TrainState, the update's metrics as floats: one device->host fetch). No arrays
  (everything dropped): the state as it was, no metrics."""
  if arrays is None:
    return state, {}
  state, metrics = policy_update(state, ref_params, arrays, step)
  return state, metrics.fetch()


class SamplerWeights:
  """The sampler and the params it holds: `load(params)` pushes them unless already loaded.
  `lock` serialises users of the sampler (the async rollout thread, evaluation). `placement`:
  the shardings of a sampler on its own sub-mesh (config.mesh.sampler_devices): each push copies
  the trainer's params onto them."""

  def __init__(self, sampler, placement=None):
    self.sampler = sampler
    self.placement = placement
    self.lock = threading.RLock()
    self._loaded = None

  @property
  def loaded(self):
    return self._loaded

  def load(self, params) -> SyncStats | None:
    """What the push moved (None: the sampler already holds `params`, nothing was pushed)."""
    if params is self._loaded:
      return None
    local = distributed.host_local(params)
    if self.placement is not None:
      local = jax.device_put(local, self.placement)
    stats = self.sampler.update_weights(local)
    self._loaded = params
    if stats is None:  # a sampler that does not say: the bytes of what it was given
      stats = SyncStats(bytes=int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(local))))
    return stats


def sampler_mark(sampler):
  """A snapshot of the sampler's prefix-cache counters (None: it has no prefix cache); a continuous-batching
  engine's counters restart here (`engine_metrics`)."""
  engine_metrics(sampler)
  store = getattr(sampler, "prefix_store", None)
  return None if store is None else dataclasses.replace(store.stats)


def sampler_metrics(sampler, mark) -> dict[str, float]:
  """The sampler's work since `mark` (sampler_mark): the engine's (`engine_metrics`) and the prefix cache's,
  sampler/prefilled_tokens, the prompt tokens whose keys / values were computed, and sampler/prefix_reused_frac,
  the share of prompt tokens reused from earlier calls ({} without either)."""
  out = engine_metrics(sampler)
  store = getattr(sampler, "prefix_store", None)
  if store is None or mark is None:
    return out
  prefilled = store.stats.prefilled_tokens - mark.prefilled_tokens
  reused = store.stats.reused_tokens - mark.reused_tokens
  out.update(
    {"sampler/prefilled_tokens": float(prefilled), "sampler/prefix_reused_frac": reused / max(prefilled + reused, 1)}
  )
  return out


def engine_metrics(sampler) -> dict[str, float]:
  """A continuous-batching sampler's counters since the last call (slot occupancy, KV pages, preemptions,
  queue waits, prefill / decode tok/s: sampling/engine/scheduler.Engine.metrics), reset; {} for samplers
  without them."""
  metrics = getattr(sampler, "metrics", None)
  return dict(metrics(reset=True)) if callable(metrics) else {}


def release_prefix_cache(sampler) -> None:
  """Frees the sampler's stored keys / values (a synchronous step's update is about to change the
  weights they belong to, and the update needs the memory)."""
  store = getattr(sampler, "prefix_store", None)
  if store is not None:
    store.clear()


def sync(weights: SamplerWeights, params) -> dict[str, float]:
  """Pushes `params` to the sampler: {"sync/bytes": bytes moved} (LoRA: the adapters; vLLM
  without LoRA support: merged weights; 0 when it already held them)."""
  stats = weights.load(params)
  return {"sync/bytes": float(stats.bytes if stats is not None else 0)}


def evaluate(weights: SamplerWeights, params, run_rollout: Callable[[], list], *, restore: bool) -> dict:
  """Greedy rollout metrics (eval/*) of `params`: pushed to the sampler unless it holds them,
  `run_rollout()` run under the sampler's lock; `restore`: put the weights the sampler held back
  after (an async producer's)."""
  with weights.lock:
    held = weights.loaded
    weights.load(params)
    trajs = run_rollout()
    if restore and held is not None:
      weights.load(held)
  return rollout_metrics(trajs, prefix="eval")

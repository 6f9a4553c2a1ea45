"""The RL loop as functions over explicit state: rollout -> rewards -> one jitted prepare -> jitted,
sharded updates -> weight sync.

    spec = RunSpec.from_config(config)            # the script parses the config, once
    parts = build_run(spec, workdir)              # rl/setup.py: task, tokenizer, models, sampler, agent
    records = train(spec, parts, workdir)         # resumes from workdir's latest checkpoint if any

Per step (`rl_step`, over the stages of rl/stages.py, each taking what it uses and returning what it
makes): dataset rows -> multi-chain multi-turn rollout (agents/, the Sampler; on several processes
each rolls out its share, rl/distributed.py) -> `step_arrays`: rollout metrics, (DAPO dynamic sampling),
target-aligned padded arrays (rl/batching.train_arrays, the one next-token shift) -> `update`
(rl/update.PolicyUpdate: one jitted prepare of old/ref log-probs, values, advantages, mismatch
metrics; epochs x minibatches of `train_step`; metrics fetched once) -> `sync` (the sampler's
weights) -> (evaluate) -> metrics (rl/run_log.py; process 0) -> checkpoint (rl/checkpoints.py).

What changes from step to step is the `LoopState`; what does not is the `Run` (rl/run.py). Every mode takes
each step's batch from one rollout stream (rl/rollout_stream.py): staleness 0 in this thread (sync), or a
producer thread (async, partial); step counters (tool calls, env acquires) are differences of snapshots.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import jax
from flax import nnx

from agentfly_jax.envs.pool_metrics import env_pool_metrics
from agentfly_jax.metrics import read_jsonl, truncate_jsonl
from agentfly_jax.rl import checkpoints, distributed, run_log, stages, throughput
from agentfly_jax.rl.chain_failures import ChainFailureGuard
from agentfly_jax.rl.evaluation import evaluate
from agentfly_jax.rl.rollout_stream import open_stream
from agentfly_jax.rl.run import Run, new_state, open_run, vision_arrays_of
from agentfly_jax.rl.sft_cache import sft_params
from agentfly_jax.rl.turn_rewards import needs_turn_arrays
from agentfly_jax.tools.limits import tool_counts, tool_metrics


@dataclasses.dataclass
class LoopState:
  """What changes from step to step: the TrainState, the KL reference (None without KL), the
  position in the training-row stream, the tools' counts where the last step's rollout ended
  (async: the next step's tool metrics count the producer's calls from there), and the run's
  step counters: the throughput meter and the failed-chain guard."""

  state: Any
  ref_params: Any
  data_position: int
  tools_seen: dict = dataclasses.field(default_factory=dict)
  meter: throughput.StepMeter | None = None
  chain_guard: ChainFailureGuard | None = None


def train(spec, parts, workdir: str, *, before_step: Callable[[int], None] | None = None) -> list[dict]:
  """Runs (or resumes) the run of `spec` on `parts` (rl/setup.build_run) in `workdir` to
  `train.steps`; returns the metrics records (process 0; [] on the others)."""
  return train_run(open_run(spec, workdir, parts=parts), before_step=before_step)[0]


def train_run(run: Run, *, before_step: Callable[[int], None] | None = None) -> tuple[list[dict], LoopState]:
  """(the metrics records (process 0; [] on the others), the final LoopState) of running (or
  resuming) `run` to `train.steps`. `before_step(step)`: called before each step (tests inject
  faults there)."""
  primary = distributed.is_primary()
  if primary:  # a run's record, written by the loop's start, not by building parts
    run_log.write_run_record(run)
  loop, start = start_loop(run)
  loop.tools_seen = tool_counts(run.parts.agent.tools.values())  # counts start with the run's own rollouts
  stream = open_stream(run, loop, start)
  writer = run_log.open_writers(run.spec, run.workdir) if primary else None
  loop = rl_steps(run, loop, start, stream, writer, before_step)
  stream.close()
  run.checkpointer.wait()
  distributed.barrier("train_done")
  if not primary:
    return [], loop
  writer.close()
  return run_log.plot_run(run.spec, run.workdir, read_jsonl(run_log.metrics_path(run.workdir))), loop


def start_loop(run: Run) -> tuple[LoopState, int]:
  """The loop state at the first step to run: restored from the latest checkpoint, or fresh (SFT
  warm start, critic warm start, step-0 checkpoint and eval). Returns (state, last step done)."""
  spec, policy, critic = run.spec, run.parts.policy, run.parts.critic
  start = run.checkpointer.latest_step()
  params, critic_params = policy.params, critic.params if critic is not None else None
  counters = dict(
    meter=throughput.StepMeter(jax.device_count()),  # tokens/s + time split per step (rl/throughput.py)
    chain_guard=ChainFailureGuard(spec.rollout.max_error_share, spec.rollout.error_patience, "config.rollout."),
  )
  pre_sft = {}  # step 0's record: greedy eval before the SFT warm start, its NLL and time
  if start is None and spec.sft.steps > 0:
    if spec.eval.every and spec.eval.before_sft:
      pre_sft = {k.replace("eval/", "eval_pre_sft/"): v for k, v in evaluate(run, params, seed=spec.seed).items()}
    t_sft = time.perf_counter()
    params, sft_metrics = sft_params(run)
    pre_sft.update(sft_metrics, **{"time/sft_s": time.perf_counter() - t_sft})
    if spec.algorithm.critic:
      critic_params = warm_start_critic(critic_params, params)
  state = new_state(run, params, run.optimizer, critic_params)
  ref_params = checkpoints.kl_reference(run, state.params, resumed=start is not None)
  if start is not None:
    state, data_position = checkpoints.restore(run, start, state)
    if distributed.is_primary():
      truncate_jsonl(run_log.metrics_path(run.workdir), start)
    return LoopState(state, ref_params, data_position, **counters), start
  checkpoints.save(run, 0, state, 0)
  record = {**pre_sft, **(evaluate(run, state.params, seed=spec.seed) if spec.eval.every else {})}
  if record and distributed.is_primary():  # the SFT's record also when no eval runs
    run_log.append_record(run.workdir, 0, record)
  return LoopState(state, ref_params, 0, **counters), 0


def rl_step(run: Run, loop: LoopState, step: int, stream) -> tuple[LoopState, dict]:
  """One RL step: the stream's batch (rl/rollout_stream.py: sync, async or partial), its arrays, update,
  the new weights published, (eval). Returns the new loop state + metrics."""
  spec, p = run.spec, run.parts
  t0 = time.perf_counter()
  tools = p.agent.tools.values()
  got = stream.get(step, loop)
  trajs = got.trajectories
  t_rollout = time.perf_counter()
  loop.chain_guard.check(step, trajs)  # every chain failed, or too many for too long: ChainsFailedError
  tools_seen = tool_counts(tools)
  arrays, metrics = stages.step_arrays(
    trajs,
    pad_id=p.tokenizer.pad_token_id,
    dynamic_sampling=spec.dapo.dynamic_sampling,
    score_metric=spec.loss.score_metric,
    turn_level=needs_turn_arrays(spec.algorithm.estimator),  # turn_gae / gigpo: per-turn rewards
    vision=vision_arrays_of(run),
  )
  metrics["time/step_arrays_s"] = time.perf_counter() - t_rollout
  metrics.update(tool_metrics(tools, since=got.tools_before))  # tools/<name>/calls, errors, wait_s
  metrics.update(got.metrics)  # sampler/*, async/*
  state, update_metrics = stages.update(run.update, loop.state, loop.ref_params, arrays, step)
  metrics.update(update_metrics)
  t_train = time.perf_counter()
  sync_metrics = stream.publish(step, state.params)  # sync: loaded now; async: before the producer's next batch
  t_sync = time.perf_counter()
  if spec.eval.every and step % spec.eval.every == 0:
    metrics.update(evaluate(run, state.params, seed=spec.seed))
    metrics["time/eval_s"] = time.perf_counter() - t_sync
  metrics.update(
    {
      "time/rollout_s": t_rollout - t0,
      "time/train_s": t_train - t_rollout,
      "time/sync_s": t_sync - t_train,
      "time/step_s": time.perf_counter() - t0,
    }
  )
  metrics.update(sync_metrics)
  metrics.update(env_pool_metrics(p.env_provider, got.env_mark))  # env/<type>/in_use, ...
  metrics.update(loop.meter.step_metrics(trajs, arrays, metrics))  # throughput/*, time/split/*, tok/s
  position = loop.data_position + spec.rollout.rows_per_step
  return dataclasses.replace(loop, state=state, data_position=position, tools_seen=tools_seen), metrics


def rl_steps(run: Run, loop: LoopState, start: int, stream, writer, before_step=None) -> LoopState:
  """Steps start+1 .. train.steps: each step's metrics written (`writer`: process 0's, else None),
  checkpoints every `checkpoint.every` and at the end, the progress bar advanced."""
  spec = run.spec
  bar = run_log.progress_bar(spec, enabled=spec.log.progress and writer is not None, initial=start)
  t_loop = time.perf_counter()
  loop.meter.reset()  # the first step's sampler / env busy time starts here
  for step in range(start + 1, spec.train.steps + 1):
    if before_step is not None:
      before_step(step)
    loop, metrics = rl_step(run, loop, step, stream)
    metrics.update(stream.idle_metrics(metrics, time.perf_counter() - t_loop))  # async/*_idle_frac
    if writer is not None:
      writer.write(step, metrics)
    if (spec.checkpoint.every and step % spec.checkpoint.every == 0) or step == spec.train.steps:
      checkpoints.save(run, step, loop.state, loop.data_position)
    bar.set_postfix(**run_log.postfix(metrics))
    bar.update(1)
  bar.close()
  return loop


def warm_start_critic(critic_params, policy_params):
  """Copies the policy's trunk weights into the critic (same paths), keeps the value head."""
  flat_c = dict(nnx.to_flat_state(critic_params))
  flat_p = dict(nnx.to_flat_state(policy_params))
  for path, var in flat_c.items():
    if path in flat_p and flat_p[path].shape == var.shape:
      flat_c[path] = flat_p[path]
  return nnx.from_flat_state(flat_c)

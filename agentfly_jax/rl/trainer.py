"""The RL loop: rollout -> rewards -> one jitted prepare -> jitted, sharded updates -> weight sync.

    trainer = Trainer(config, workdir)          # parses the config once (rl/spec.RunSpec), builds the run
    trainer.train()                             # resumes from workdir's latest checkpoint if any

Per step (the stages of rl/stages.py, each taking what it uses and returning what it makes):
dataset rows -> multi-chain multi-turn rollout (agents/, the Sampler; on several processes each
rolls out its share, rl/distributed.py) -> `prepare`: rollout metrics, (DAPO dynamic sampling),
target-aligned padded arrays (rl/batching.train_arrays, the one next-token shift) -> `update`
(rl/update.PolicyUpdate: one jitted prepare of old/ref log-probs, values, advantages, mismatch
metrics; epochs x minibatches of `train_step`; metrics fetched once) -> `sync` (the sampler's
weights) -> (evaluate) -> metrics (JSONL / TensorBoard / W&B, progress bar; process 0) ->
checkpoint.

The loop's state is explicit: `train()` threads the TrainState, the KL reference params and the
data position through `_run_step`; the trainer object holds only what is fixed for the run (the
RunSpec, the parts `build_run` made, the programs). Step counters (tool calls, env acquires) are
differences of snapshots taken before the step's rollout.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from agentfly_jax.checkpoint import Checkpointer
from agentfly_jax.envs.pool_metrics import env_pool_metrics, env_usage_mark
from agentfly_jax.metrics import (
  JsonlWriter,
  MultiWriter,
  TensorBoardWriter,
  WandbWriter,
  plot_curves,
  read_jsonl,
  truncate_jsonl,
)
from agentfly_jax.rl import distributed, partial_rollout, stages, throughput
from agentfly_jax.rl.chain_failures import ChainFailureGuard
from agentfly_jax.rl.programs import TrainStates, loss_config, policy_optimizers
from agentfly_jax.rl.setup import build_run
from agentfly_jax.rl.spec import RunSpec
from agentfly_jax.rl.stages import SamplerWeights
from agentfly_jax.rl.turn_rewards import needs_turn_arrays
from agentfly_jax.rl.update import ModelParts, PolicyUpdate
from agentfly_jax.tasks.from_config import task_fingerprint
from agentfly_jax.tools.limits import tool_counts, tool_metrics


@dataclasses.dataclass
class LoopState:
  """What changes from step to step: the TrainState, the KL reference (None without KL), the
  position in the training-row stream, and the tools' counts where the last step's rollout
  ended (async: the next step's tool metrics count the producer's calls from there)."""

  state: Any
  ref_params: Any
  data_position: int
  tools_seen: dict = dataclasses.field(default_factory=dict)


class Trainer:
  """Holds the parts of one run; `train()` runs (or resumes) it. `config`: an ml_collections
  config (configs/*.py + flags; one saved by an older version is migrated), parsed once into
  `self.spec` (rl/spec.RunSpec: `RunSpec.from_config` migrates it); `task`: a `Task` given in
  Python instead of `config.task`. Nothing below reads the ConfigDict again."""

  def __init__(self, config, workdir: str, *, task=None):
    spec = RunSpec.from_config(config, custom_task=task is not None)
    self.spec = spec
    self.asynchronous, self.decoupled = spec.asynchronous, spec.decoupled
    if self.asynchronous and jax.process_count() > 1:
      raise ValueError("config.rollout.mode='async' runs on one process; multi-host runs are sync")
    self.workdir = os.path.abspath(workdir)
    os.makedirs(self.workdir, exist_ok=True)  # (config.json is written when training starts: `train`)
    self.algo = dataclasses.asdict(spec.algorithm)  # {estimator, policy_loss, critic, agg} (overrides applied)
    self.parts = parts = build_run(spec, self.workdir, task=task)
    self.task, self.tokenizer, self.agent = parts.task, parts.tokenizer, parts.agent
    self.env_provider = parts.env_provider
    self.sampler, self.mesh = parts.sampler, parts.mesh
    self.weights = SamplerWeights(parts.sampler, parts.sampler_shardings)
    policy, critic = parts.policy, parts.critic
    self.graphdef, self.rest, self.param_specs = policy.graphdef, policy.rest, policy.specs
    self.critic_graphdef, self.critic_rest, self.critic_specs = (
      (critic.graphdef, critic.rest, critic.specs) if critic is not None else (None, None, None)
    )
    self.train_rows, self.eval_rows = parts.train_rows, parts.eval_rows
    self.task_fingerprint = task_fingerprint(self.task, self.train_rows)  # evaluate.py checks it
    self.init_params = policy.params
    self.init_critic_params = critic.params if critic is not None else None
    self.lora, self.base_identity = parts.lora, parts.base_identity  # LoRA: params = adapters; the base is in rest
    self.end_of_turn_id = parts.end_of_turn_id
    self.loss_cfg = loss_config(spec, decoupled=self.decoupled)  # decoupled: clip against the proximal policy (AReaL)
    self.optimizer, self.critic_optimizer = policy_optimizers(spec)
    self.checkpointer = Checkpointer(os.path.join(self.workdir, "checkpoints"), max_to_keep=spec.checkpoint.keep)
    self.meter = throughput.StepMeter(jax.device_count())  # tokens/s + time split per step (rl/throughput.py)
    self.chain_guard = ChainFailureGuard(spec.rollout.max_error_share, spec.rollout.error_patience, "config.rollout.")
    self.states = TrainStates(
      self.init_params,
      self.init_critic_params,
      self.optimizer,
      self.critic_optimizer,
      self.mesh,
      self.param_specs,
      self.critic_specs,
      spec.seed,
    )
    self.state_sharding = self.states.sharding
    self.update = PolicyUpdate(
      ModelParts(
        self.graphdef, self.rest, self.optimizer, self.critic_graphdef, self.critic_rest, self.critic_optimizer
      ),
      spec,
      self.loss_cfg,
      spec.algorithm.estimator,
      self.mesh,
      self.state_sharding,
    )

  # ------------------------------------------------------------------ state
  def state_sharding_for(self, optimizer):
    """Shardings of a TrainState of this run's params (+ critic) under `optimizer`."""
    return self.states.sharding_for(optimizer)

  def new_state(self, params, optimizer=None, critic_params=None, *, state_sharding=None):
    """A fresh TrainState (optimizer: this run's by default), placed on the mesh."""
    return self.states.new(params, optimizer, critic_params, sharding=state_sharding)

  # ------------------------------------------------------------------ rollout
  def rollout(self, rows, *, sampler=None, num_chains=None, temperature=None, seed=0):
    """Trajectories of `rows` (group_id = row index), see `stages.rollout`."""
    return stages.rollout(
      self.agent,
      rows,
      sampler=sampler or self.sampler,
      rollout_spec=self.spec.rollout,
      end_of_turn_id=self.end_of_turn_id,
      env_provider=self.env_provider,
      agent_fn=self.task.agent_fn,
      num_chains=num_chains,
      temperature=temperature,
      seed=seed,
    )

  def _rows_at(self, position: int, n: int) -> list[dict]:
    """Rows position..position+n of the endless, per-epoch reshuffled training stream."""
    return stages.rows_at(self.train_rows, self.spec.seed, position, n)

  # ------------------------------------------------------------------ SFT warm start
  def sft_runner(self, optimizer):
    """An `sft.SftRunner` of this run's policy with `optimizer` (experiments/make_warmstart.py)."""
    from agentfly_jax.rl.sft import SftRunner

    return SftRunner(
      self.graphdef,
      self.rest,
      optimizer,
      states=self.states,
      loss_cfg=self.loss_cfg,
      mesh=self.mesh,
      rules=self.spec.mesh.rules,
      pad_id=self.tokenizer.pad_token_id,
      micro_batch_size=self.spec.train.micro_batch_size,
    )

  def sft_cache_path(self, steps: int | None = None) -> str:
    """The `sft.cache_dir` folder of this run's SFT params (of an SFT of `steps` steps, default
    the config's): keyed by the task, seed, model and sft config and the rollout limits that
    shape the demos (so RL's chains, rows and temperature can change and reuse it)."""
    import hashlib

    c = self.spec.to_dict()  # the run's values as plain dicts (the key's bytes: sort_keys below)
    sft = {k: v for k, v in c["sft"].items() if k != "cache_dir"}
    if steps is not None:
      sft["steps"] = int(steps)
    key = json.dumps(
      {
        "task": self.spec.task_name,
        "task_content": self.task_fingerprint,
        "seed": c["seed"],
        "model": c["model"],
        "rollout": {k: c["rollout"][k] for k in ("max_turns", "max_tokens_per_turn", "max_total_tokens")},
        "sft": sft,
      },
      sort_keys=True,
    )
    return os.path.join(os.path.abspath(self.spec.sft.cache_dir), hashlib.sha256(key.encode()).hexdigest()[:16])

  def run_sft(self, *, steps: int | None = None, after_step=None) -> tuple[Any, list[float]]:
    """The SFT warm start from the initial params (`steps` steps, default the config's;
    `after_step(steps_done, params)` as in rl/sft.run_sft). Returns (params, per-step NLL)."""
    from agentfly_jax.rl.programs import sft_optimizer
    from agentfly_jax.rl.sft import run_sft

    spec = self.spec
    sft = spec.sft if steps is None else dataclasses.replace(spec.sft, steps=int(steps))
    return run_sft(
      self.sft_runner(sft_optimizer(spec)),
      self.init_params,
      task=self.task,
      tokenizer=self.tokenizer,
      end_of_turn_id=self.end_of_turn_id,
      sft=sft,
      seed=spec.seed,
      rollout=self.rollout,
      progress=spec.log.progress,
      after_step=after_step,
    )

  def save_sft_cache(self, params, steps: int | None = None) -> str:
    """Writes SFT params (of `steps` steps, default the config's) to `sft_cache_path(steps)`."""
    steps = self.spec.sft.steps if steps is None else int(steps)
    path = self.sft_cache_path(steps)
    cache = Checkpointer(path, max_to_keep=1, async_save=False)
    cache.save(0, {"params": params}, {"sft_steps": steps})
    cache.close()
    return path

  def _sft_cached(self) -> tuple[Any, dict]:
    """(SFT params, their sft/* metrics), from `sft.cache_dir` when a run with the same
    task/model/sft config saved them (then no metrics: nothing was trained)."""
    cache_dir = self.spec.sft.cache_dir
    if cache_dir:
      cache = Checkpointer(self.sft_cache_path(), max_to_keep=1, async_save=False)
      found = cache.latest_step() is not None
      restored = cache.restore(None, {"params": self.init_params})[0]["params"] if found else None
      cache.close()
      if found:
        return restored, {}
    params, nll = self.run_sft()
    if cache_dir:
      self.save_sft_cache(params)
    return params, {"sft/nll_first": nll[0], "sft/nll_last": nll[-1]}

  # ------------------------------------------------------------------ evaluation
  def evaluate(self, params, rows=None, *, seed=0) -> dict:
    """Greedy single-chain rollout on eval rows -> eval/* metrics (pushes `params` to the
    sampler unless it already holds them; an async rollout's weights are put back after)."""
    rows = rows or self.eval_rows
    return stages.evaluate(
      self.weights,
      params,
      lambda: self.rollout(rows, num_chains=1, temperature=0.0, seed=seed),
      restore=self.asynchronous,
    )

  # ------------------------------------------------------------------ the loop
  def _start(self, jsonl_path: str) -> tuple[LoopState, int]:
    """The loop state at the first step to run: restored from the latest checkpoint, or fresh
    (SFT warm start, critic warm start, step-0 checkpoint and eval). Returns (state, last step done)."""
    spec = self.spec
    start = self.checkpointer.latest_step()
    params, critic_params = self.init_params, self.init_critic_params
    pre_sft = {}  # step 0's record: greedy eval before the SFT warm start, its NLL and time
    if start is None and spec.sft.steps > 0:
      if spec.eval.every and spec.eval.before_sft:
        pre_sft = {k.replace("eval/", "eval_pre_sft/"): v for k, v in self.evaluate(params, seed=spec.seed).items()}
      t_sft = time.perf_counter()
      params, sft_metrics = self._sft_cached()
      pre_sft.update(sft_metrics, **{"time/sft_s": time.perf_counter() - t_sft})
      if spec.algorithm.critic:
        critic_params = _warm_start_critic(critic_params, params)
    state = self.new_state(params, self.optimizer, critic_params)
    ref_params = self._reference(state.params, resumed=start is not None)
    if start is not None:
      state, meta = self.checkpointer.restore(start, state)
      self._check_base(meta, start)
      if distributed.is_primary():
        truncate_jsonl(jsonl_path, start)
      return LoopState(state, ref_params, int(meta["data_position"])), start
    self.checkpointer.save(0, state, self._meta(0))
    if spec.eval.every:
      eval_metrics = {**pre_sft, **self.evaluate(state.params, seed=spec.seed)}
      if distributed.is_primary():
        _append(jsonl_path, 0, eval_metrics)
    return LoopState(state, ref_params, 0), 0

  def _meta(self, data_position: int) -> dict:
    """A checkpoint's JSON: the data position, and under LoRA the base's identity (the state
    holds only the adapters)."""
    meta = {"data_position": data_position}
    if self.base_identity is not None:
      meta["lora_base"] = self.base_identity
    return meta

  def _check_base(self, meta: dict, step: int) -> None:
    """A LoRA checkpoint resumes only onto the base it was trained on."""
    saved = meta.get("lora_base")
    if self.base_identity is not None and saved is not None and saved["sha256"] != self.base_identity["sha256"]:
      raise ValueError(
        f"{self.checkpointer.directory} step {step}: its LoRA adapters were trained on the base "
        f"{saved['source']} (sha256 {saved['sha256'][:12]}...), but this run's base "
        f"{self.base_identity['source']} has sha256 {self.base_identity['sha256'][:12]}..."
      )

  def _reference(self, params, *, resumed: bool):
    """The KL reference: the policy at RL step 0, a copy (train_step donates state.params) kept
    in its own checkpoint so keep-last-N never deletes it and a resumed run uses the same one.
    Under LoRA `params` are the adapters: the reference is the shared frozen base + a copy of
    the step-0 adapters (zero B, i.e. the base itself, unless an SFT warm start trained them),
    so no second copy of the base weights exists."""
    if self.spec.loss.kl_coef <= 0:
      return None
    ref_ckpt = Checkpointer(os.path.join(self.workdir, "reference"), max_to_keep=1, async_save=False)
    if resumed:
      ref = ref_ckpt.restore(None, {"params": params})[0]["params"]
    else:
      ref = jax.tree.map(jnp.copy, params)
      ref_ckpt.save(0, {"params": ref}, {})
    ref_ckpt.close()
    return ref

  def _rollout_step(self, position: int, step: int) -> list:
    """The trajectories of step `step`, whose rows start at data position `position`."""
    rows = self._rows_at(position, self.spec.rollout.rows_per_step)
    return self.rollout(rows, seed=self.spec.seed * 1_000_003 + step)

  def _run_step(self, loop: LoopState, step: int, producer=None) -> tuple[LoopState, dict]:
    """One RL step: rollout (or the async producer's batch), prepare, update, weight sync /
    publish, (eval). Returns the new loop state + metrics."""
    spec = self.spec
    t0 = time.perf_counter()
    tools = self.agent.tools.values()
    if producer is None:
      env_mark = env_usage_mark(self.env_provider)  # the step reports only its own acquires ...
      tools_before = tool_counts(tools)  # ... and its own tool calls (not the last eval's)
      prefix_mark = stages.prefix_cache_mark(self.sampler)
      trajs = self._rollout_step(loop.data_position, step)
      rollout_metrics = stages.prefix_cache_metrics(self.sampler, prefix_mark)  # sampler/prefix_*
      stages.release_prefix_cache(self.sampler)  # stale after this step's update; frees memory for it
    else:
      from agentfly_jax.rl.async_rollout import staleness_metrics

      env_mark, tools_before = None, loop.tools_seen  # the producer's rollouts since the last step
      batch = producer.get(step)
      trajs = batch.trajectories
      rollout_metrics = partial_rollout.batch_metrics(producer, batch, step, spec, staleness_metrics)  # async/*
    t_rollout = time.perf_counter()
    self.chain_guard.check(step, trajs)  # every chain failed, or too many for too long: ChainsFailedError
    tools_seen = tool_counts(tools)
    arrays, metrics = stages.prepare(
      trajs,
      pad_id=self.tokenizer.pad_token_id,
      dynamic_sampling=spec.dapo.dynamic_sampling,
      score_metric=spec.loss.score_metric,
      turn_level=needs_turn_arrays(spec.algorithm.estimator),  # turn_gae / gigpo: per-turn rewards
    )
    arrays = partial_rollout.after_prepare(arrays, trajs, step, spec, metrics)  # partial: stale turns leave the loss
    metrics["time/host_prepare_s"] = time.perf_counter() - t_rollout
    metrics.update(tool_metrics(tools, since=tools_before))  # tools/<name>/calls, errors, wait_s
    metrics.update(rollout_metrics)
    state, update_metrics = stages.update(self.update, loop.state, loop.ref_params, arrays, step)
    metrics.update(update_metrics)
    t_train = time.perf_counter()
    if producer is None:
      sync_metrics = stages.sync(self.weights, state.params)
    else:
      producer.publish(step, state.params)
    t_sync = time.perf_counter()
    if spec.eval.every and step % spec.eval.every == 0:
      metrics.update(self.evaluate(state.params, seed=spec.seed))
      metrics["time/eval_s"] = time.perf_counter() - t_sync
    metrics.update(
      {
        "time/rollout_s": t_rollout - t0,
        "time/train_s": t_train - t_rollout,
        "time/sync_s": t_sync - t_train,
        "time/step_s": time.perf_counter() - t0,
      }
    )
    if producer is None:
      metrics.update(sync_metrics)
    metrics.update(env_pool_metrics(self.env_provider, env_mark))  # env/<type>/in_use, ...
    metrics.update(self.meter.step_metrics(trajs, arrays, metrics))  # throughput/*, time/split/*, tok/s
    return LoopState(state, loop.ref_params, loop.data_position + spec.rollout.rows_per_step, tools_seen), metrics

  def train(self) -> list[dict]:
    """Runs (or resumes) the run to `train.steps`; returns the metrics records (process 0; []
    on the others). Leaves the final TrainState in `self.state`."""
    spec = self.spec
    jsonl_path = os.path.join(self.workdir, "metrics.jsonl")
    if distributed.is_primary():  # a run's record, written by the loop's start, not by building parts
      with open(os.path.join(self.workdir, "config.json"), "w") as f:
        f.write(json.dumps(spec.to_dict(), indent=2))
      with open(os.path.join(self.workdir, "task.json"), "w") as f:
        json.dump({"name": spec.task_name, "fingerprint": self.task_fingerprint}, f)
    loop, start = self._start(jsonl_path)
    loop.tools_seen = tool_counts(self.agent.tools.values())  # tool counts start with the run's own rollouts
    producer = self._start_sampling(loop, start)
    primary = distributed.is_primary()
    writer = self._writer(jsonl_path) if primary else None
    loop = self._steps(loop, start, producer, writer)
    if producer is not None:
      producer.close()
    self.checkpointer.wait()
    self.state = loop.state  # the final state, for callers after train()
    distributed.barrier("train_done")
    if not primary:
      return []
    writer.close()
    return self._plot(read_jsonl(jsonl_path))

  def _start_sampling(self, loop: LoopState, start: int):
    """Loads the sampler with the loop's params; async: starts and returns the rollout producer
    (its steps after `start`, from the loop's data position), else None."""
    spec = self.spec
    if not self.asynchronous:
      self.weights.load(loop.state.params)
      return None
    if spec.rollout.partial:  # chains span policy versions; groups carry over steps
      return partial_rollout.start_producer(self, loop, start)
    from agentfly_jax.rl.async_rollout import RolloutProducer

    self.weights.load(jax.tree.map(jnp.copy, loop.state.params))  # a copy: the train step donates the params
    pos0 = loop.data_position
    return RolloutProducer(
      lambda s: self._rollout_step(pos0 + (s - start - 1) * spec.rollout.rows_per_step, s),
      self.weights,
      first_step=start + 1,
      last_step=spec.train.steps,
      max_staleness=spec.rollout.max_staleness,
      start_version=start,
    ).start()

  def _steps(self, loop: LoopState, start: int, producer, writer) -> LoopState:
    """Steps start+1 .. train.steps: each step's metrics written (`writer`: process 0's, else
    None), checkpoints every `checkpoint.every` and at the end, the progress bar advanced."""
    spec = self.spec
    primary = writer is not None
    bar = _progress(spec.train.steps, spec.algo, spec.log.progress and primary, initial=start)
    t_loop, trainer_wait = time.perf_counter(), 0.0
    self.meter.reset()  # the first step's sampler / env busy time starts here
    for step in range(start + 1, spec.train.steps + 1):
      loop, metrics = self._run_step(loop, step, producer)
      if producer is not None:
        trainer_wait += metrics["time/rollout_s"]
        metrics.update(_async_idle_metrics(producer, trainer_wait, time.perf_counter() - t_loop))
      if writer is not None:
        writer.write(step, metrics)
      if (spec.checkpoint.every and step % spec.checkpoint.every == 0) or step == spec.train.steps:
        self.checkpointer.save(step, loop.state, self._meta(loop.data_position))
      bar.set_postfix(
        reward=f"{metrics['rollout/reward_mean']:.2f}",
        success=f"{metrics['rollout/success_rate']:.2f}",
        **({"error": f"{metrics['rollout/finish/error']:.2f}"} if metrics.get("rollout/finish/error") else {}),
        **throughput.postfix(metrics),
      )
      bar.update(1)
    bar.close()
    return loop

  def _plot(self, records: list[dict]) -> list[dict]:
    """Plots the reward / success curves of `records` to workdir/reward.png; returns them."""
    spec = self.spec
    plot_curves(
      records,
      ["rollout/reward_mean", "rollout/success_rate", "eval/success_rate"],
      os.path.join(self.workdir, "reward.png"),
      title=f"{spec.name}: {spec.algo} on {spec.task_name}",
      labels={
        "rollout/reward_mean": "reward (sampled rollouts)",
        "rollout/success_rate": f"success, sampled (T={spec.rollout.temperature:g})",
        "eval/success_rate": "success, greedy eval (held-out)",
      },
    )
    throughput.plot_throughput(records, os.path.join(self.workdir, "throughput.png"), title=f"{spec.name}: throughput")
    return records

  def _writer(self, jsonl_path: str):
    spec = self.spec
    writers = [JsonlWriter(jsonl_path)]
    if spec.log.tensorboard:
      writers.append(TensorBoardWriter(os.path.join(self.workdir, "tb")))
    if spec.log.wandb:
      writers.append(WandbWriter(spec.log.wandb_project, spec.to_dict(), name=spec.name))
    return MultiWriter(writers)


def _warm_start_critic(critic_params, policy_params):
  """Copies the policy's trunk weights into the critic (same paths), keeps the value head."""
  flat_c = dict(nnx.to_flat_state(critic_params))
  flat_p = dict(nnx.to_flat_state(policy_params))
  for path, var in flat_c.items():
    if path in flat_p and flat_p[path].shape == var.shape:
      flat_c[path] = flat_p[path]
  return nnx.from_flat_state(flat_c)


def _async_idle_metrics(producer, trainer_wait_s: float, wall_s: float) -> dict:
  """async/trainer_idle_frac (the trainer's wait for batches over the loop's wall time so far) and
  async/sampler_idle_frac (the producer's idle over its idle + busy time)."""
  return {
    "async/trainer_idle_frac": trainer_wait_s / wall_s,
    "async/sampler_idle_frac": producer.idle_s / max(1e-9, producer.idle_s + producer.busy_s),
  }


def _append(path, step, metrics):
  w = JsonlWriter(path)
  w.write(step, metrics)
  w.close()


def _progress(total, desc, enabled, initial=0):
  from tqdm.auto import tqdm

  return tqdm(total=total, desc=desc, initial=initial, disable=not enabled, dynamic_ncols=True)

"""The RL loop: rollout -> rewards -> one jitted prepare -> jitted, sharded updates -> weight sync.

    trainer = Trainer(config, workdir)          # validates the config first, builds everything
    trainer.train()                             # resumes from workdir's latest checkpoint if any

Per step: dataset rows -> multi-chain multi-turn rollout (agents/, the Sampler; on several
processes each rolls out its share, rl/distributed.py) -> rollout metrics -> (DAPO dynamic
sampling) -> target-aligned padded arrays (rl/batching.train_arrays, the one next-token shift)
-> `PolicyUpdate` (rl/update.py): one jitted prepare (old/ref log-probs, values, advantages,
mismatch metrics; rl/prepare.py), epochs x minibatches of `train_step` (rl/train_step.py) ->
metrics fetched once -> `sampler.update_weights` -> metrics (JSONL / TensorBoard / W&B, progress
bar; process 0) -> checkpoint.

The loop's state is explicit: `train()` threads the TrainState, the KL reference params and the
data position through `_run_step`; the trainer object holds only what is fixed for the run.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentfly_jax.checkpoint import Checkpointer
from agentfly_jax.envs.pool_metrics import env_pool_metrics, start_env_step
from agentfly_jax.envs.provider import DeferredEnvProvider
from agentfly_jax.metrics import (JsonlWriter, MultiWriter, TensorBoardWriter, WandbWriter,
                                  plot_curves, read_jsonl, truncate_jsonl)
from agentfly_jax.rl import distributed
from agentfly_jax.rl.batching import drop_zero_variance_groups, rollout_metrics, train_arrays
from agentfly_jax.rl.config import ALGORITHMS, validate_config
from agentfly_jax.rl.setup import build_components
from agentfly_jax.rl.programs import loss_config, policy_optimizers, train_state_sharding
from agentfly_jax.rl.train_state import create_train_state
from agentfly_jax.rl.update import ModelParts, PolicyUpdate, fetch_metrics
from agentfly_jax.sampling.protocol import SamplingParams
from agentfly_jax.tasks.from_config import task_fingerprint, task_name
from agentfly_jax.tools.limits import tool_metrics

@dataclasses.dataclass
class LoopState:
  """What changes from step to step: the TrainState, the KL reference (None without KL) and the
  position in the training-row stream."""
  state: Any
  ref_params: Any
  data_position: int


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
    self.last_bytes = 0  # bytes the last push moved (LoRA: the adapters; vLLM without LoRA support: merged weights)

  @property
  def loaded(self):
    return self._loaded

  def load(self, params) -> bool:
    """Returns whether weights were pushed (False: the sampler already holds `params`)."""
    if params is self._loaded:
      return False
    local = distributed.host_local(params)
    if self.placement is not None:
      local = jax.device_put(local, self.placement)
    self.sampler.update_weights(local)
    self._loaded = params
    self.last_bytes = getattr(self.sampler, "last_sync_bytes", None) or int(
        sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(local)))
    return True


class Trainer:
  """Holds the components of one run; `train()` runs (or resumes) it."""

  def __init__(self, config, workdir: str, *, task=None):
    validate_config(config, custom_task=task is not None)
    self.config = config
    self.asynchronous = config.rollout.mode == "async"
    if self.asynchronous and jax.process_count() > 1:
      raise ValueError("config.rollout.mode='async' runs on one process; multi-host runs are sync")
    # max_staleness 0 makes async the sync loop exactly: keep the algorithm's own loss then.
    self.decoupled = (self.asynchronous and config.rollout.max_staleness > 0
                      and ALGORITHMS[config.algo]["policy_loss"] == "ppo")
    self.workdir = os.path.abspath(workdir)
    os.makedirs(self.workdir, exist_ok=True)
    if distributed.is_primary():
      with open(os.path.join(self.workdir, "config.json"), "w") as f:
        f.write(config.to_json(indent=2))
    self.algo = ALGORITHMS[config.algo]
    c = build_components(config, self.workdir, task=task)
    self.task, self.tokenizer, self.agent = c.task, c.tokenizer, c.agent
    # The run's env provider, passed to every rollout and read for the pool metrics (the agent's
    # own, else the process default: resolved when a chain first needs an environment).
    self.env_provider = DeferredEnvProvider(self.agent.env_provider)
    self.sampler, self.mesh = c.sampler, c.mesh
    self.weights = SamplerWeights(c.sampler, c.sampler_shardings)
    self.graphdef, self.rest, self.param_specs = c.graphdef, c.rest, c.param_specs
    self.critic_graphdef, self.critic_rest, self.critic_specs = c.critic_graphdef, c.critic_rest, c.critic_specs
    self.train_rows, self.eval_rows = c.train_rows, c.eval_rows
    self.task_fingerprint = task_fingerprint(self.task, self.train_rows)  # evaluate.py checks it
    self.init_params, self.init_critic_params = c.params, c.critic_params
    self.lora, self.base_identity = c.lora, c.base_identity  # LoRA: params = adapters; the base is in rest
    self.end_of_turn_id = c.end_of_turn_id
    self.loss_cfg = loss_config(config, decoupled=self.decoupled)  # decoupled: clip against the proximal policy (AReaL)
    self.optimizer, self.critic_optimizer = policy_optimizers(config)
    self.checkpointer = Checkpointer(os.path.join(self.workdir, "checkpoints"), max_to_keep=config.checkpoint.keep)
    self.state_sharding = self.state_sharding_for(self.optimizer)
    self.update = PolicyUpdate(
        ModelParts(self.graphdef, self.rest, self.optimizer, self.critic_graphdef, self.critic_rest,
                   self.critic_optimizer),
        config, self.loss_cfg, self.algo["estimator"], self.mesh, self.state_sharding)

  # ------------------------------------------------------------------ state
  def state_sharding_for(self, optimizer):
    """Shardings of a TrainState of this run's params (+ critic) under `optimizer`."""
    return train_state_sharding(self.init_params, self.init_critic_params if optimizer is self.optimizer else None,
                                optimizer, self.critic_optimizer, self.mesh, self.param_specs, self.critic_specs)

  def new_state(self, params, optimizer=None, critic_params=None, *, state_sharding=None):
    """A fresh TrainState (optimizer: this run's by default), placed on the mesh."""
    optimizer = optimizer or self.optimizer
    make = lambda p, cp: create_train_state(p, optimizer, critic_params=cp,
                                            critic_optimizer=self.critic_optimizer, seed=self.config.seed)
    # Built by a jit with the target shardings: also valid across processes (no host arrays).
    return jax.jit(make, out_shardings=state_sharding or self.state_sharding)(params, critic_params)

  def _new_state(self, params, optimizer, critic_params=None):
    """(state, shardings), as before the restructuring (experiments/evaluate.py uses it)."""
    sh = self.state_sharding if optimizer is self.optimizer else self.state_sharding_for(optimizer)
    return self.new_state(params, optimizer, critic_params, state_sharding=sh), sh

  # ------------------------------------------------------------------ rollout
  def _sampling_params(self, temperature: float) -> SamplingParams:
    r = self.config.rollout
    return SamplingParams(temperature=temperature, top_p=r.top_p, top_k=r.top_k,
                          max_new_tokens=r.max_tokens_per_turn, stop_token_ids=(self.end_of_turn_id,))

  def rollout(self, rows, *, sampler=None, num_chains=None, temperature=None, seed=0):
    """Trajectories of `rows` (group_id = row index). On several processes each rolls out its
    share of the rows with its own sampler and all get the whole list back."""
    from agentfly_jax.agents.rollout import run_rollout
    r = self.config.rollout
    local = distributed.process_share(rows, "rows of a rollout")
    agent_fn = getattr(self.task, "agent_fn", None)
    if agent_fn is not None:  # a black-box agent, through the OpenAI-compatible endpoint
      from agentfly_jax.agents.endpoint_rollout import run_endpoint_rollout
      run_rollout = functools.partial(run_endpoint_rollout, agent_fn=agent_fn)
    trajs = run_rollout(
        self.agent, local, sampler=sampler or self.sampler, num_chains=num_chains or r.num_chains,
        max_turns=r.max_turns,
        sampling_params=self._sampling_params(r.temperature if temperature is None else temperature),
        max_tokens_per_turn=r.max_tokens_per_turn, max_total_tokens=r.max_total_tokens,
        concurrency=r.concurrency, seed=seed, group_offset=distributed.share_offset(len(rows)),
        env_provider=self.env_provider)
    return distributed.gather_objects(trajs)

  def _rows_at(self, position: int, n: int) -> list[dict]:
    """Rows position..position+n of the endless, per-epoch reshuffled training stream."""
    out, total = [], len(self.train_rows)
    for p in range(position, position + n):
      epoch, i = divmod(p, total)
      perm = np.random.default_rng([self.config.seed, epoch]).permutation(total)
      out.append(self.train_rows[int(perm[i])])
    return out

  # ------------------------------------------------------------------ SFT warm start
  def _sft_cache_key(self) -> str:
    c = self.config
    return json.dumps({
        "task": task_name(c), "task_content": self.task_fingerprint, "seed": c.seed,
        "model": c.model.to_dict(), "rollout": c.rollout.to_dict(),
        "sft": {k: v for k, v in c.sft.to_dict().items() if k != "cache_dir"}}, sort_keys=True)

  def _sft_cached(self) -> tuple[Any, dict]:
    """(SFT params, their sft/* metrics), from `sft.cache_dir` when a run with the same
    task/model/sft config saved them (then no metrics: nothing was trained)."""
    import hashlib
    from agentfly_jax.rl.sft import run_sft
    c = self.config

    def train():
      params, nll = run_sft(self)
      return params, {"sft/nll_first": nll[0], "sft/nll_last": nll[-1]}
    if not c.sft.cache_dir:
      return train()
    key = self._sft_cache_key()
    path = os.path.join(os.path.abspath(c.sft.cache_dir), hashlib.sha256(key.encode()).hexdigest()[:16])
    cache = Checkpointer(path, max_to_keep=1, async_save=False)
    target = {"params": self.init_params}
    if cache.latest_step() is not None:
      restored, _ = cache.restore(None, target)
      cache.close()
      return restored["params"], {}
    params, metrics = train()
    cache.save(0, {"params": params}, {"config": key})
    cache.close()
    return params, metrics

  # ------------------------------------------------------------------ evaluation
  def evaluate(self, params, rows=None, *, seed=0) -> dict:
    """Greedy single-chain rollout on eval rows -> eval/* metrics (pushes `params` to the
    sampler unless it already holds them; an async rollout's weights are put back after)."""
    with self.weights.lock:
      held = self.weights.loaded
      self.weights.load(params)
      trajs = self.rollout(rows or self.eval_rows, num_chains=1, temperature=0.0, seed=seed)
      if self.asynchronous and held is not None:
        self.weights.load(held)
    return rollout_metrics(trajs, prefix="eval")

  # ------------------------------------------------------------------ the loop
  def _start(self, jsonl_path: str) -> tuple[LoopState, int]:
    """The loop state at the first step to run: restored from the latest checkpoint, or fresh
    (SFT warm start, critic warm start, step-0 checkpoint and eval). Returns (state, last step done)."""
    c = self.config
    start = self.checkpointer.latest_step()
    params, critic_params = self.init_params, self.init_critic_params
    pre_sft = {}  # step 0's record: greedy eval before the SFT warm start, its NLL and time
    if start is None and c.sft.steps > 0:
      if c.eval.every:
        pre_sft = {k.replace("eval/", "eval_pre_sft/"): v for k, v in self.evaluate(params, seed=c.seed).items()}
      t_sft = time.perf_counter()
      params, sft_metrics = self._sft_cached()
      pre_sft.update(sft_metrics, **{"time/sft_s": time.perf_counter() - t_sft})
      if self.algo["critic"]:
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
    if c.eval.every:
      eval_metrics = {**pre_sft, **self.evaluate(state.params, seed=c.seed)}
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
      raise ValueError(f"{self.checkpointer.directory} step {step}: its LoRA adapters were trained on the base "
                       f"{saved['source']} (sha256 {saved['sha256'][:12]}...), but this run's base "
                       f"{self.base_identity['source']} has sha256 {self.base_identity['sha256'][:12]}...")

  def _reference(self, params, *, resumed: bool):
    """The KL reference: the policy at RL step 0, a copy (train_step donates state.params) kept
    in its own checkpoint so keep-last-N never deletes it and a resumed run uses the same one.
    Under LoRA `params` are the adapters: the reference is the shared frozen base + a copy of
    the step-0 adapters (zero B, i.e. the base itself, unless an SFT warm start trained them),
    so no second copy of the base weights exists."""
    if self.config.loss.kl_coef <= 0:
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
    rows = self._rows_at(position, self.config.rollout.rows_per_step)
    return self.rollout(rows, seed=self.config.seed * 1_000_003 + step)

  def _run_step(self, loop: LoopState, step: int, producer=None) -> tuple[LoopState, dict]:
    """One RL step: rollout (or the async producer's batch), update, weight sync / publish,
    (eval). Returns the new loop state + metrics."""
    c = self.config
    t0 = time.perf_counter()
    async_metrics = {}
    if producer is None:
      start_env_step(self.env_provider)  # the step reports only its own acquires
      tool_metrics(self.agent.tools.values())  # ... and its own tool calls (not the last eval's)
      trajs = self._rollout_step(loop.data_position, step)
    else:
      from agentfly_jax.rl.async_rollout import staleness_metrics
      batch = producer.get(step)
      trajs = batch.trajectories
      async_metrics = staleness_metrics(batch, step, c.rollout.max_staleness)
    t_rollout = time.perf_counter()
    metrics: dict[str, Any] = rollout_metrics(trajs)
    metrics.update(tool_metrics(self.agent.tools.values()))  # tools/<name>/calls, errors, wait_s
    metrics.update(async_metrics)
    if c.dapo.dynamic_sampling:
      trajs, dropped = drop_zero_variance_groups(trajs)
      metrics["dapo/groups_dropped"] = dropped
    state = loop.state
    if trajs:
      arrays = train_arrays(trajs, pad_id=self.tokenizer.pad_token_id)
      state, device_metrics = self.update(state, loop.ref_params, arrays, step)
      metrics.update(fetch_metrics(device_metrics))  # the step's one device->host fetch
      metrics["time/prepare_s"] = self.update.last_prepare_s  # (inside time/train_s)
      if self.update.last_padding_fraction is not None:
        metrics["train/padding_fraction"] = self.update.last_padding_fraction
    t_train = time.perf_counter()
    if producer is None:
      self.weights.load(state.params)
    else:
      producer.publish(step, state.params)
    t_sync = time.perf_counter()
    if c.eval.every and step % c.eval.every == 0:
      metrics.update(self.evaluate(state.params, seed=c.seed))
      metrics["time/eval_s"] = time.perf_counter() - t_sync
    metrics.update({"time/rollout_s": t_rollout - t0, "time/train_s": t_train - t_rollout,
                    "time/sync_s": t_sync - t_train, "time/step_s": time.perf_counter() - t0})
    if producer is None:
      metrics["sync/bytes"] = float(self.weights.last_bytes)
    metrics.update(env_pool_metrics(self.env_provider))  # env/<type>/in_use, ...
    return LoopState(state, loop.ref_params, loop.data_position + c.rollout.rows_per_step), metrics

  def train(self) -> list[dict]:
    c = self.config
    jsonl_path = os.path.join(self.workdir, "metrics.jsonl")
    if distributed.is_primary():
      with open(os.path.join(self.workdir, "task.json"), "w") as f:
        json.dump({"name": task_name(c), "fingerprint": self.task_fingerprint}, f)
    loop, start = self._start(jsonl_path)
    producer = None
    tool_metrics(self.agent.tools.values())  # tool counts start with the run's own rollouts
    if self.asynchronous:  # the sampler gets a copy: the train step donates loop.state.params
      from agentfly_jax.rl.async_rollout import RolloutProducer
      self.weights.load(jax.tree.map(jnp.copy, loop.state.params))
      pos0 = loop.data_position
      producer = RolloutProducer(
          lambda s: self._rollout_step(pos0 + (s - start - 1) * c.rollout.rows_per_step, s),
          self.weights, first_step=start + 1, last_step=c.train.steps,
          max_staleness=c.rollout.max_staleness, start_version=start).start()
    else:
      self.weights.load(loop.state.params)
    primary = distributed.is_primary()
    writer = self._writer(jsonl_path) if primary else None
    bar = _progress(c.train.steps, c.algo, c.log.progress and primary, initial=start)
    t_loop, trainer_wait = time.perf_counter(), 0.0
    for step in range(start + 1, c.train.steps + 1):
      loop, metrics = self._run_step(loop, step, producer)
      if producer is not None:
        trainer_wait += metrics["time/rollout_s"]
        wall = time.perf_counter() - t_loop
        metrics["async/trainer_idle_frac"] = trainer_wait / wall
        metrics["async/sampler_idle_frac"] = producer.idle_s / max(1e-9, producer.idle_s + producer.busy_s)
      if writer is not None:
        writer.write(step, metrics)
      if step % c.checkpoint.every == 0 or step == c.train.steps:
        self.checkpointer.save(step, loop.state, self._meta(loop.data_position))
      bar.set_postfix(reward=f"{metrics['rollout/reward_mean']:.2f}",
                      success=f"{metrics['rollout/success_rate']:.2f}")
      bar.update(1)
    bar.close()
    if producer is not None:
      producer.close()
    self.checkpointer.wait()
    self.state = loop.state  # the final state, for callers after train()
    distributed.barrier("train_done")
    if not primary:
      return []
    writer.close()
    records = read_jsonl(jsonl_path)
    plot_curves(records, ["rollout/reward_mean", "rollout/success_rate", "eval/success_rate"],
                os.path.join(self.workdir, "reward.png"), title=f"{c.name}: {c.algo} on {task_name(c)}",
                labels={"rollout/reward_mean": "reward (sampled rollouts)",
                        "rollout/success_rate": f"success, sampled (T={c.rollout.temperature:g})",
                        "eval/success_rate": "success, greedy eval (held-out)"})
    return records

  def _writer(self, jsonl_path: str):
    c = self.config
    writers = [JsonlWriter(jsonl_path)]
    if c.log.tensorboard:
      writers.append(TensorBoardWriter(os.path.join(self.workdir, "tb")))
    if c.log.wandb:
      writers.append(WandbWriter(c.log.wandb_project, json.loads(c.to_json()), name=c.name))
    return MultiWriter(writers)


def _warm_start_critic(critic_params, policy_params):
  """Copies the policy's trunk weights into the critic (same paths), keeps the value head."""
  flat_c = dict(nnx.to_flat_state(critic_params))
  flat_p = dict(nnx.to_flat_state(policy_params))
  for path, var in flat_c.items():
    if path in flat_p and flat_p[path].shape == var.shape:
      flat_c[path] = flat_p[path]
  return nnx.from_flat_state(flat_c)


def _append(path, step, metrics):
  w = JsonlWriter(path)
  w.write(step, metrics)
  w.close()


def _progress(total, desc, enabled, initial=0):
  from tqdm.auto import tqdm
  return tqdm(total=total, desc=desc, initial=initial, disable=not enabled, dynamic_ncols=True)

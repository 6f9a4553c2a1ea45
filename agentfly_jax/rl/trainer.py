"""The RL loop: rollout -> rewards -> advantages -> jitted, sharded updates -> weight sync.

    trainer = Trainer(config, workdir)          # validates the config first, builds everything
    trainer.train()                             # resumes from workdir's latest checkpoint if any

Per step: dataset rows -> multi-chain multi-turn rollout (agents/, the Sampler) -> rollout metrics
-> (DAPO dynamic sampling) -> padded [B, T] arrays -> trainer log-probs (old), mismatch vs the
sampler, reference log-probs (KL), critic values (PPO) -> advantages (rl/advantages.py by name)
-> epochs x minibatches of `train_step` (rl/train_step.py; micro-batched, donated, sharded)
-> `sampler.update_weights` -> metrics (JSONL / TensorBoard / W&B, progress bar) -> checkpoint.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentfly_jax.checkpoint import Checkpointer
from agentfly_jax.metrics import (JsonlWriter, MultiWriter, TensorBoardWriter, WandbWriter,
                                  plot_curves, read_jsonl, truncate_jsonl)
from agentfly_jax.rl import advantages as adv_lib
from agentfly_jax.rl.batching import (bucket, drop_zero_variance_groups, overlong_penalty,
                                      rollout_metrics, to_microbatches)
from agentfly_jax.rl.config import ALGORITHMS, resolved_agg, validate_config
from agentfly_jax.rl.setup import build_components
from agentfly_jax.rl.train_state import create_train_state, make_optimizer
from agentfly_jax.rl.train_step import (LossConfig, batch_sharding, jit_step, make_sft_step,
                                        make_train_step, policy_logprobs, state_shardings)
from agentfly_jax.sampling.protocol import SamplingParams


class Trainer:
  """Holds the components of one run; `train()` runs (or resumes) it."""

  def __init__(self, config, workdir: str, *, task=None):
    validate_config(config, custom_task=task is not None)
    self.config = config
    self.workdir = os.path.abspath(workdir)
    os.makedirs(self.workdir, exist_ok=True)
    with open(os.path.join(self.workdir, "config.json"), "w") as f:
      f.write(config.to_json(indent=2))
    self.algo = ALGORITHMS[config.algo]
    c = build_components(config, self.workdir, task=task)
    self.task, self.tokenizer, self.agent = c.task, c.tokenizer, c.agent
    self.sampler, self.mesh = c.sampler, c.mesh
    self.graphdef, self.rest, self.param_specs = c.graphdef, c.rest, c.param_specs
    self.critic_graphdef, self.critic_rest, self.critic_specs = c.critic_graphdef, c.critic_rest, c.critic_specs
    self.train_rows, self.eval_rows = c.train_rows, c.eval_rows
    self._init_params, self._init_critic_params = c.params, c.critic_params
    self.end_of_turn_id = c.end_of_turn_id
    self.loss_cfg = LossConfig(
        policy_loss=self.algo["policy_loss"], clip_low=config.loss.clip_low,
        clip_high=config.loss.clip_high, dual_clip=config.loss.dual_clip, agg=resolved_agg(config),
        kl_coef=config.loss.kl_coef, kl_kind=config.loss.kl_kind,
        entropy_coef=config.loss.entropy_coef, value_clip=config.loss.value_clip,
        temperature=config.rollout.temperature if config.rollout.temperature > 0 else 1.0)
    self.optimizer = make_optimizer(
        lr=config.train.lr, warmup_steps=config.train.warmup_steps, total_steps=config.train.steps,
        schedule=config.train.schedule, weight_decay=config.train.weight_decay,
        max_grad_norm=config.train.max_grad_norm)
    self.critic_optimizer = make_optimizer(lr=config.critic.lr, warmup_steps=config.critic.warmup_steps,
                                           max_grad_norm=config.train.max_grad_norm) if self.algo["critic"] else None
    self.checkpointer = Checkpointer(os.path.join(self.workdir, "checkpoints"), max_to_keep=config.checkpoint.keep)
    self._logprob_fn = jax.jit(lambda p, ids, am: policy_logprobs(
        nnx.merge(self.graphdef, p, self.rest), ids, am, self.loss_cfg.temperature)[0])
    if self.algo["critic"]:
      self._value_fn = jax.jit(lambda p, ids, am: nnx.merge(self.critic_graphdef, p, self.critic_rest)(
          ids[:, :-1], attention_mask=am[:, :-1]))
    self._steps_jitted = {}

  # ------------------------------------------------------------------ state
  def _new_state(self, params, optimizer, critic_params=None):
    state = create_train_state(params, optimizer, critic_params=critic_params,
                               critic_optimizer=self.critic_optimizer, seed=self.config.seed)
    sh = state_shardings(state, self.mesh, self.param_specs, self.critic_specs)
    return jax.device_put(state, sh), sh

  def _jitted(self, kind: str, state_sh, example_batch):
    if kind not in self._steps_jitted:
      if kind == "sft":
        fn = make_sft_step(self.graphdef, self.rest, self._sft_optimizer)
      else:
        fn = make_train_step(self.graphdef, self.rest, self.optimizer, self.loss_cfg,
                             critic_graphdef=self.critic_graphdef, critic_rest=self.critic_rest,
                             critic_optimizer=self.critic_optimizer)
      self._steps_jitted[kind] = jit_step(fn, state_sh, batch_sharding(self.mesh, example_batch))
    return self._steps_jitted[kind]

  def _put_batch(self, mb: dict) -> dict:
    sh = batch_sharding(self.mesh, mb)
    return {k: jax.device_put(v, sh[k]) for k, v in mb.items()}

  # ------------------------------------------------------------------ rollout
  def _sampling_params(self, temperature: float) -> SamplingParams:
    r = self.config.rollout
    return SamplingParams(temperature=temperature, top_p=r.top_p, top_k=r.top_k,
                          max_new_tokens=r.max_tokens_per_turn, stop_token_ids=(self.end_of_turn_id,))

  def rollout(self, rows, *, sampler=None, num_chains=None, temperature=None, seed=0):
    from agentfly_jax.agents.rollout import run_rollout
    r = self.config.rollout
    return run_rollout(
        self.agent, rows, sampler=sampler or self.sampler, num_chains=num_chains or r.num_chains,
        max_turns=r.max_turns,
        sampling_params=self._sampling_params(r.temperature if temperature is None else temperature),
        max_tokens_per_turn=r.max_tokens_per_turn, max_total_tokens=r.max_total_tokens,
        concurrency=r.concurrency, seed=seed)

  def _rows_at(self, position: int, n: int) -> list[dict]:
    """Rows position..position+n of the endless, per-epoch reshuffled training stream."""
    out, total = [], len(self.train_rows)
    for p in range(position, position + n):
      epoch, i = divmod(p, total)
      perm = np.random.default_rng([self.config.seed, epoch]).permutation(total)
      out.append(self.train_rows[int(perm[i])])
    return out

  # ------------------------------------------------------------------ arrays
  def _arrays(self, trajs) -> dict:
    from agentfly_jax.agents.trajectory import pad_batch
    T = bucket(max(len(t.token_ids) for t in trajs), 64)
    arr = pad_batch(trajs, max_len=T, pad_id=self.tokenizer.pad_token_id)
    return {k: np.asarray(v) for k, v in arr.items()}

  def _per_row(self, fn, params, arr, mb: int) -> np.ndarray:
    """Runs fn(params, ids, attention_mask) in fixed-size chunks of `mb` rows (static shapes)."""
    B = arr["token_ids"].shape[0]
    outs = []
    for s in range(0, B, mb):
      ids, am = arr["token_ids"][s:s + mb], arr["attention_mask"][s:s + mb]
      n = ids.shape[0]
      if n < mb:
        ids = np.concatenate([ids, np.repeat(ids[:1], mb - n, 0)])
        am = np.concatenate([am, np.repeat(am[:1], mb - n, 0)])
      outs.append(np.asarray(fn(params, ids, am))[:n])
    return np.concatenate(outs)

  def _prepare(self, state, trajs, metrics: dict) -> dict:
    """Padded arrays + old/ref log-probs + values + advantages, all [B, T] position-aligned."""
    c = self.config
    arr = self._arrays(trajs)
    mb = c.train.micro_batch_size
    mask = arr["action_mask"]
    old_lp = self._per_row(self._logprob_fn, state.params, arr, mb)
    try:
      from agentfly_jax.sampling.mismatch import logprob_mismatch_metrics
    except ImportError:  # the samplers package is older than the mismatch metrics
      logprob_mismatch_metrics = None
    if logprob_mismatch_metrics is not None:
      metrics.update({f"mismatch/{k}": float(v) for k, v in logprob_mismatch_metrics(
          jnp.asarray(arr["sampler_logprobs"]), jnp.asarray(old_lp), jnp.asarray(mask)).items()})
    batch = {"token_ids": arr["token_ids"], "attention_mask": arr["attention_mask"],
             "action_mask": mask, "old_logprobs": old_lp.astype(np.float32)}
    if c.loss.kl_coef > 0:
      batch["ref_logprobs"] = self._per_row(self._logprob_fn, self._ref_params, arr, mb).astype(np.float32)
    if c.loss.tis_cap > 0:
      w = np.exp(np.clip(old_lp - arr["sampler_logprobs"], -20, 20))
      batch["is_weights"] = np.where(mask, np.minimum(w, c.loss.tis_cap), 0).astype(np.float32)
    scores = arr["rewards"].astype(np.float32)
    if c.dapo.overlong_buffer > 0:
      pen = overlong_penalty(mask.sum(1), max_tokens=c.rollout.max_total_tokens, buffer=c.dapo.overlong_buffer,
                             factor=c.dapo.overlong_penalty)
      metrics["dapo/overlong_penalty_mean"] = float(pen.mean())
      scores = scores + pen
    values = None
    if self.algo["critic"]:
      v = self._per_row(self._value_fn, state.critic_params, arr, mb)
      values = np.pad(v, ((0, 0), (1, 0))).astype(np.float32) * mask
      batch["old_values"] = values
    adv, ret = adv_lib.compute(self.algo["estimator"], mask=jnp.asarray(mask), scores=jnp.asarray(scores),
                               group_ids=jnp.asarray(arr["group_ids"]),
                               values=None if values is None else jnp.asarray(values),
                               gamma=c.loss.gamma, lam=c.loss.lam)
    batch["advantages"] = np.asarray(adv, np.float32)
    if self.algo["critic"]:
      batch["returns"] = np.asarray(ret, np.float32)
    m = mask.astype(bool)
    metrics["adv/mean"] = float(batch["advantages"][m].mean()) if m.any() else 0.0
    metrics["adv/abs_mean"] = float(np.abs(batch["advantages"][m]).mean()) if m.any() else 0.0
    return batch

  # ------------------------------------------------------------------ SFT warm start
  def _sft_cached(self) -> Any:
    """SFT params, from `sft.cache_dir` when a run with the same task/model/sft config saved them."""
    import hashlib
    c = self.config
    if not c.sft.cache_dir:
      return self._sft()
    key = json.dumps({"task": c.task, "seed": c.seed, "model": c.model.to_dict(), "sft": {
        k: v for k, v in c.sft.to_dict().items() if k != "cache_dir"}, "rollout": c.rollout.to_dict()},
        sort_keys=True)
    path = os.path.join(os.path.abspath(c.sft.cache_dir), hashlib.sha256(key.encode()).hexdigest()[:16])
    cache = Checkpointer(path, max_to_keep=1, async_save=False)
    target = {"params": self._init_params}
    if cache.latest_step() is not None:
      restored, _ = cache.restore(None, target)
      cache.close()
      return restored["params"]
    params = self._sft()
    cache.save(0, {"params": params}, {"config": key})
    cache.close()
    return params

  def _sft(self) -> Any:
    from agentfly_jax.rl.sft import ScriptedPolicySampler, sft_batch
    c = self.config
    self._sft_optimizer = make_optimizer(lr=c.sft.lr, max_grad_norm=c.train.max_grad_norm)
    state, sh = self._new_state(self._init_params, self._sft_optimizer)
    p_tool = c.sft.tool_use_prob
    demo = ScriptedPolicySampler(
        self.tokenizer, lambda text, rng: self.task.scripted_response(text, rng.random() < p_tool, rng),
        self.end_of_turn_id, seed=c.seed)
    mb = c.train.micro_batch_size
    losses = []
    bar = _progress(c.sft.steps, "sft", c.log.progress)
    for i in range(c.sft.steps):
      rows = self.task.make_rows(c.sft.rows_per_step, seed=10_000_000 + c.seed * 100_003 + i)
      trajs = self.rollout(rows, sampler=demo, num_chains=1, seed=c.seed * 7919 + i)
      batch = sft_batch(self._arrays(trajs), demo)
      mbatch = self._put_batch(to_microbatches(batch, np.arange(len(trajs)), mb))
      step_fn = self._jitted("sft", sh, mbatch)
      state, m = step_fn(state, mbatch)
      losses.append(float(m["sft/nll"]))
      bar.set_postfix(nll=f"{losses[-1]:.3f}")
      bar.update(1)
    bar.close()
    self.sft_losses = losses
    return state.params

  # ------------------------------------------------------------------ evaluation
  def evaluate(self, params, rows=None, *, seed=0) -> dict:
    """Greedy single-chain rollout on eval rows -> eval/* metrics."""
    self.sampler.update_weights(params)
    trajs = self.rollout(rows or self.eval_rows, num_chains=1, temperature=0.0, seed=seed)
    return rollout_metrics(trajs, prefix="eval")

  # ------------------------------------------------------------------ the loop
  def train(self) -> list[dict]:
    c = self.config
    jsonl_path = os.path.join(self.workdir, "metrics.jsonl")
    start = self.checkpointer.latest_step()
    params = self._init_params
    if start is None and c.sft.steps > 0:
      params = self._sft_cached()
      self.sampler.update_weights(params)
    critic_params = self._init_critic_params
    if self.algo["critic"] and start is None and c.sft.steps > 0:
      critic_params = _warm_start_critic(critic_params, params)
    state, state_sh = self._new_state(params, self.optimizer, critic_params)
    # The KL reference is the policy at RL step 0: a copy (train_step donates state.params), kept
    # in its own checkpoint so keep-last-N never deletes it and a resumed run uses the same one.
    self._ref_params = None
    if c.loss.kl_coef > 0:
      ref_ckpt = Checkpointer(os.path.join(self.workdir, "reference"), max_to_keep=1, async_save=False)
      if start is not None:
        self._ref_params = ref_ckpt.restore(None, {"params": state.params})[0]["params"]
      else:
        self._ref_params = jax.tree.map(jnp.copy, state.params)
        ref_ckpt.save(0, {"params": self._ref_params}, {})
      ref_ckpt.close()
    meta = {"data_position": 0}
    if start is not None:
      state, meta = self.checkpointer.restore(start, state)
      truncate_jsonl(jsonl_path, start)
    else:
      start = 0
      self.checkpointer.save(0, state, meta)
      if c.eval.every:
        _append(jsonl_path, 0, self.evaluate(state.params, seed=c.seed))
    self.sampler.update_weights(state.params)
    writer = self._writer(jsonl_path)
    bar = _progress(c.train.steps, c.algo, c.log.progress, initial=start)
    position = int(meta["data_position"])
    for step in range(start + 1, c.train.steps + 1):
      t0 = time.perf_counter()
      metrics: dict[str, Any] = {}
      rows = self._rows_at(position, c.rollout.rows_per_step)
      position += c.rollout.rows_per_step
      trajs = self.rollout(rows, seed=c.seed * 1_000_003 + step)
      t_rollout = time.perf_counter()
      metrics.update(rollout_metrics(trajs))
      if c.dapo.dynamic_sampling:
        trajs, dropped = drop_zero_variance_groups(trajs)
        metrics["dapo/groups_dropped"] = dropped
      if trajs:
        state = self._update(state, state_sh, trajs, metrics, step)
      t_train = time.perf_counter()
      self.sampler.update_weights(state.params)
      t_sync = time.perf_counter()
      if c.eval.every and step % c.eval.every == 0:
        metrics.update(self.evaluate(state.params, seed=c.seed))
      metrics.update({"time/rollout_s": t_rollout - t0, "time/train_s": t_train - t_rollout,
                      "time/sync_s": t_sync - t_train, "time/step_s": time.perf_counter() - t0})
      env_metrics = getattr(self.agent, "env_metrics", None)
      if callable(env_metrics):
        metrics.update({f"env/{k}": v for k, v in env_metrics().items()})
      writer.write(step, metrics)
      if step % c.checkpoint.every == 0 or step == c.train.steps:
        self.checkpointer.save(step, state, {"data_position": position})
      bar.set_postfix(reward=f"{metrics['rollout/reward_mean']:.2f}",
                      success=f"{metrics['rollout/success_rate']:.2f}")
      bar.update(1)
    bar.close()
    self.checkpointer.wait()
    writer.close()
    self.state = state
    records = read_jsonl(jsonl_path)
    plot_curves(records, ["rollout/reward_mean", "rollout/success_rate", "eval/success_rate"],
                os.path.join(self.workdir, "reward.png"), title=f"{c.name}: {c.algo} on {c.task}",
                labels={"rollout/reward_mean": "reward (sampled rollouts)",
                        "rollout/success_rate": f"success, sampled (T={c.rollout.temperature:g})",
                        "eval/success_rate": "success, greedy eval (held-out)"})
    return records

  def _update(self, state, state_sh, trajs, metrics: dict, step: int):
    c = self.config
    batch = self._prepare(state, trajs, metrics)
    B = batch["token_ids"].shape[0]
    full_b = c.rollout.rows_per_step * c.rollout.num_chains
    per_mini = -(-full_b // c.train.minibatches)
    num_micro = -(-per_mini // c.train.micro_batch_size)
    rng = np.random.default_rng([c.seed, step])
    step_metrics = []
    for _ in range(c.train.epochs):
      perm = rng.permutation(B)
      for rows in np.array_split(perm, c.train.minibatches):
        if len(rows) == 0:
          continue
        mb = self._put_batch(to_microbatches(batch, rows, c.train.micro_batch_size, num_micro))
        state, m = self._jitted("rl", state_sh, mb)(state, mb)
        step_metrics.append(m)
    for k in step_metrics[0]:
      metrics[k] = float(np.mean([float(m[k]) for m in step_metrics]))
    return state

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

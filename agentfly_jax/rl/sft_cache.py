"""A run's SFT warm start and its cache (`sft.cache_dir`): trained once per task / model / SFT
config, reused by every run that would train the same params.

    params, metrics = sft_params(run)             # cached, or trained (+ saved) with sft/* metrics
    path = sft_cache_path(run, steps=2)           # where a 2-step SFT of this run is (or would be) kept
    params, nll = train_sft(run, steps=2)         # train it (after_step=: a callback after each step)
    save_sft_cache(run, params, steps=2)
    program = sft_program(run, optimizer)         # the SFT step program alone (experiments/make_warmstart.py)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any

from agentfly_jax.checkpoint import Checkpointer
from agentfly_jax.rl import run as run_ops
from agentfly_jax.rl.run import Run


def sft_program(run: Run, optimizer):
  """An `sft.SftProgram` of the run's policy with `optimizer`."""
  from agentfly_jax.rl.sft import SftProgram

  policy = run.parts.policy
  return SftProgram(
    policy.graphdef,
    policy.rest,
    optimizer,
    states=run.states,
    loss_cfg=run.loss_cfg,
    mesh=run.parts.mesh,
    rules=run.spec.mesh.rules,
    pad_id=run.parts.tokenizer.pad_token_id,
    micro_batch_size=run.spec.train.micro_batch_size,
    vision=run_ops.vision_arrays_of(run),
  )


def sft_cache_path(run: Run, steps: int | None = None) -> str:
  """The `sft.cache_dir` folder of the run's SFT params (of an SFT of `steps` steps, default the
  config's): keyed by the task (name and content), seed, model and sft config and the rollout limits
  that shape the demos (so RL's chains, rows and temperature can change and reuse it)."""
  c = run.spec.to_dict()  # the run's values as plain dicts (the key's bytes: sort_keys below)
  sft = {k: v for k, v in c["sft"].items() if k != "cache_dir"}
  if steps is not None:
    sft["steps"] = int(steps)
  key = json.dumps(
    {
      "task": run.spec.task_name,
      "task_content": run.task_fingerprint,
      "seed": c["seed"],
      "model": c["model"],
      "rollout": {k: c["rollout"][k] for k in ("max_turns", "max_tokens_per_turn", "max_total_tokens")},
      "sft": sft,
    },
    sort_keys=True,
  )
  return os.path.join(os.path.abspath(run.spec.sft.cache_dir), hashlib.sha256(key.encode()).hexdigest()[:16])


def train_sft(run: Run, *, steps: int | None = None, after_step=None) -> tuple[Any, list[float]]:
  """The SFT warm start from the run's initial params (`steps` steps, default the config's;
  `after_step(steps_done, params)` as in rl/sft.train_on_demos). Returns (params, per-step NLL)."""
  from agentfly_jax.rl.programs import sft_optimizer
  from agentfly_jax.rl.sft import train_on_demos

  spec, p = run.spec, run.parts
  sft = spec.sft if steps is None else dataclasses.replace(spec.sft, steps=int(steps))
  return train_on_demos(
    sft_program(run, sft_optimizer(spec)),
    p.policy.params,
    task=p.task,
    tokenizer=p.tokenizer,
    end_of_turn_id=p.end_of_turn_id,
    sft=sft,
    seed=spec.seed,
    rollout=lambda rows, **kw: run_ops.rollout(run, rows, **kw),
    progress=spec.log.progress,
    after_step=after_step,
  )


def save_sft_cache(run: Run, params, steps: int | None = None) -> str:
  """Writes SFT params (of `steps` steps, default the config's) to `sft_cache_path(run, steps)`."""
  steps = run.spec.sft.steps if steps is None else int(steps)
  path = sft_cache_path(run, steps)
  cache = Checkpointer(path, max_to_keep=1, async_save=False)
  cache.save(0, {"params": params}, {"sft_steps": steps})
  cache.close()
  return path


def sft_params(run: Run) -> tuple[Any, dict]:
  """(SFT params, their sft/* metrics): from `sft.cache_dir` when a run with the same
  task/model/sft config saved them (then no metrics: nothing was trained), else trained here (and
  saved there when `sft.cache_dir` is set)."""
  cache_dir = run.spec.sft.cache_dir
  if cache_dir:
    cache = Checkpointer(sft_cache_path(run), max_to_keep=1, async_save=False)
    found = cache.latest_step() is not None
    restored = cache.restore(None, {"params": run.parts.policy.params})[0]["params"] if found else None
    cache.close()
    if found:
      return restored, {}
  params, nll = train_sft(run)
  if cache_dir:
    save_sft_cache(run, params)
  return params, {"sft/nll_first": nll[0], "sft/nll_last": nll[-1]}

"""Where a step's time goes and how many tokens it moved: the throughput metrics of every run.

    meter = StepMeter(num_devices=jax.device_count())    # once per run; marks the busy clocks
    ...                                                  # the step: rollout, prepare, update, sync, eval
    metrics.update(meter.step_metrics(trajs, arrays, metrics))

Read from the step's own metrics (rl/loop.rl_step writes them): time/rollout_s (the trainer's wait
for trajectories: the whole rollout in sync mode, the wait for the producer's batch in async mode),
time/step_arrays_s (trajectories -> arrays), time/prepare_s (the jitted prepare, inside
time/train_s), time/train_s, time/sync_s, time/eval_s, time/step_s; and from the rollout's busy
clocks (agents/busy_clock.py): the wall seconds since the last step's metrics during which some
chain was in the sampler / in a tool, an env acquire or reset, or the reward.

Written:
  throughput/sampled_tokens   tokens the sampler wrote for the step's trajectories (sum of their
                              action masks)
  throughput/trained_tokens   action tokens of the batch handed to the update (0 when DAPO dropped all)
  time/sampled_tok_per_s_per_device, time/trained_tok_per_s_per_device
                              those / time/step_s / num_devices (every device of the run, verl's
                              convention, so runs on different meshes compare)
  time/sampler_tok_per_s      sampled tokens / time/split/sampler_s (the sampler's rate while busy)
  time/split/{rollout_wait,prepare,train,sync,eval}_s
                              the trainer's wall, in parts that sum to <= time/step_s (prepare = host
                              arrays + the jitted prepare; train = the update without its prepare)
  time/split/{sampler,env}_s  busy wall of the sampler / the env side since the last step's metrics
                              (overlaps the trainer's parts in async mode; each <= that span's wall)
  time/trainer_idle_frac      time/split/rollout_wait_s / time/step_s: the share of the step the
                              trainer waited for trajectories
Counts are deterministic (a sync and an async max_staleness=0 run agree on them); every rate is
under time/, like the other wall-clock numbers.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from agentfly_jax.agents.busy_clock import ENV_CLOCK, SAMPLER_CLOCK

SPLIT_PARTS = ("rollout_wait", "prepare", "train", "sync", "eval")  # the trainer's wall, in order


def sampled_tokens(trajs: Sequence) -> int:
  """Tokens the sampler wrote for `trajs` (the sum of their action masks)."""
  return int(sum(int(np.asarray(t.action_mask).sum()) for t in trajs))


def trained_tokens(arrays: dict | None) -> int:
  """Action tokens of `rl.batching.train_arrays` output (0 for None)."""
  return 0 if arrays is None else int(np.asarray(arrays["action_mask"]).sum())


class StepMeter:
  """Differences of the rollout's busy clocks between consecutive `step_metrics` calls, and the
  step's throughput metrics (see the module docstring)."""

  def __init__(self, num_devices: int = 1):
    if num_devices < 1:
      raise ValueError(f"StepMeter: num_devices must be >= 1, got {num_devices}")
    self.num_devices = int(num_devices)
    self._mark = self._clocks()

  @staticmethod
  def _clocks() -> tuple[float, float, float]:
    return time.perf_counter(), SAMPLER_CLOCK.busy_s(), ENV_CLOCK.busy_s()

  def reset(self) -> None:
    """Starts the next span now (e.g. after an evaluation that should not count)."""
    self._mark = self._clocks()

  def step_metrics(self, trajs: Sequence, arrays: dict | None, step_metrics: dict) -> dict[str, float]:
    """The throughput metrics of one step from its trajectories, its training arrays and the time/*
    metrics the trainer wrote (`step_metrics`: time/step_s required, the other parts 0 if absent)."""
    now, sampler, env = self._clocks()
    t0, s0, e0 = self._mark
    self._mark = (now, sampler, env)
    g = lambda k: float(step_metrics.get(k, 0.0))  # noqa: E731 (a local accessor)
    wall = g("time/step_s")
    host_prep, jit_prep = g("time/step_arrays_s"), g("time/prepare_s")
    split = {
      "rollout_wait": g("time/rollout_s"),
      "prepare": host_prep + jit_prep,
      "train": max(0.0, g("time/train_s") - host_prep - jit_prep),
      "sync": g("time/sync_s"),
      "eval": g("time/eval_s"),
      "sampler": min(sampler - s0, now - t0),
      "env": min(env - e0, now - t0),
    }
    n_sampled, n_trained = sampled_tokens(trajs), trained_tokens(arrays)
    per = max(wall, 1e-9) * self.num_devices
    out = {f"time/split/{k}_s": v for k, v in split.items()}
    out.update(
      {
        "throughput/sampled_tokens": float(n_sampled),
        "throughput/trained_tokens": float(n_trained),
        "time/sampled_tok_per_s_per_device": n_sampled / per,
        "time/trained_tok_per_s_per_device": n_trained / per,
        "time/sampler_tok_per_s": n_sampled / split["sampler"] if split["sampler"] > 0 else 0.0,
        "time/trainer_idle_frac": min(1.0, split["rollout_wait"] / wall) if wall > 0 else 0.0,
      }
    )
    return out


def postfix(metrics: dict) -> dict[str, str]:
  """The progress bar's throughput fields: sampled and trained tokens/s per device, trainer idle %."""
  if "time/sampled_tok_per_s_per_device" not in metrics:
    return {}
  return {
    "tok/s/dev": f"{metrics['time/sampled_tok_per_s_per_device']:.0f}/{metrics['time/trained_tok_per_s_per_device']:.0f}",
    "idle": f"{100 * metrics['time/trainer_idle_frac']:.0f}%",
  }


def plot_throughput(records: Sequence[dict], path: str, *, title: str = "") -> str | None:
  """Two panels into a PNG at `path`: sampled / trained tokens/s per device against the step, and the
  trainer's time split (stacked) with the sampler's and env's busy time as lines. None (no file)
  when no record has throughput metrics."""
  rows = [r for r in records if "time/sampled_tok_per_s_per_device" in r]
  if not rows:
    return None
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  steps = [r["step"] for r in rows]
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
  for key, label in (
    ("time/sampled_tok_per_s_per_device", "sampled tok/s per device"),
    ("time/trained_tok_per_s_per_device", "trained tok/s per device"),
  ):
    ax1.plot(steps, [r[key] for r in rows], label=label)
  ax1.set_xlabel("step")
  ax1.set_ylabel("tokens / s / device")
  ax1.grid(alpha=0.3)
  ax1.legend()
  parts = [[r.get(f"time/split/{p}_s", 0.0) for r in rows] for p in SPLIT_PARTS]
  ax2.stackplot(steps, *parts, labels=[p.replace("_", " ") for p in SPLIT_PARTS], alpha=0.7)
  for key, style in (("sampler", "--"), ("env", ":")):
    ax2.plot(steps, [r.get(f"time/split/{key}_s", 0.0) for r in rows], style, color="k", label=f"{key} busy")
  ax2.set_xlabel("step")
  ax2.set_ylabel("seconds")
  ax2.grid(alpha=0.3)
  ax2.legend(fontsize=7, loc="upper right")
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path

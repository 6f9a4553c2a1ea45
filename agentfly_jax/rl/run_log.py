"""What a run writes besides checkpoints: its record (config.json, task.json), the metrics of each
step (JSONL, TensorBoard, W&B; process 0), the progress bar and the plots.

    write_run_record(run)                         # config.json = spec.to_dict(), task.json
    writer = open_writers(run.spec, run.workdir)  # .write(step, metrics), .close()
    bar = progress_bar(run.spec, enabled=True, initial=0); bar.set_postfix(**postfix(metrics))
    records = plot_run(run.spec, run.workdir, read_jsonl(metrics_path(run.workdir)))
"""

from __future__ import annotations

import json
import os

from agentfly_jax.metrics import JsonlWriter, MultiWriter, TensorBoardWriter, WandbWriter, plot_curves
from agentfly_jax.rl import throughput


def metrics_path(workdir: str) -> str:
  return os.path.join(workdir, "metrics.jsonl")


def write_run_record(run) -> None:
  """config.json (the run's values, `spec.to_dict()`: what evaluate.py reads back) and task.json
  (the task's name and content fingerprint). Written when training starts, never by evaluation."""
  with open(os.path.join(run.workdir, "config.json"), "w") as f:
    f.write(json.dumps(run.spec.to_dict(), indent=2))
  with open(os.path.join(run.workdir, "task.json"), "w") as f:
    json.dump({"name": run.spec.task_name, "fingerprint": run.task_fingerprint}, f)


def open_writers(spec, workdir: str) -> MultiWriter:
  """The run's metric writers: JSONL always, TensorBoard / W&B as `log` says."""
  writers = [JsonlWriter(metrics_path(workdir))]
  if spec.log.tensorboard:
    writers.append(TensorBoardWriter(os.path.join(workdir, "tb")))
  if spec.log.wandb:
    writers.append(WandbWriter(spec.log.wandb_project, spec.to_dict(), name=spec.name))
  return MultiWriter(writers)


def append_record(workdir: str, step: int, metrics: dict) -> None:
  """One record appended to the run's JSONL (step 0's evaluation, before the writers open)."""
  w = JsonlWriter(metrics_path(workdir))
  w.write(step, metrics)
  w.close()


def progress_bar(spec, *, enabled: bool, initial: int = 0):
  from tqdm.auto import tqdm

  return tqdm(total=spec.train.steps, desc=spec.algo, initial=initial, disable=not enabled, dynamic_ncols=True)


def postfix(metrics: dict) -> dict[str, str]:
  """The progress bar's fields of a step: reward, success, the error and timeout shares when non-zero, throughput."""
  out = {"reward": f"{metrics['rollout/reward_mean']:.2f}", "success": f"{metrics['rollout/success_rate']:.2f}"}
  for reason in ("error", "timeout"):
    if metrics.get(f"rollout/finish/{reason}"):
      out[reason] = f"{metrics[f'rollout/finish/{reason}']:.2f}"
  return {**out, **throughput.postfix(metrics)}


def plot_run(spec, workdir: str, records: list[dict]) -> list[dict]:
  """Plots the reward / success curves of `records` to workdir/reward.png and the throughput to
  workdir/throughput.png; returns the records."""
  plot_curves(
    records,
    ["rollout/reward_mean", "rollout/success_rate", "eval/success_rate"],
    os.path.join(workdir, "reward.png"),
    title=f"{spec.name}: {spec.algo} on {spec.task_name}",
    labels={
      "rollout/reward_mean": "reward (sampled rollouts)",
      "rollout/success_rate": f"success, sampled (T={spec.rollout.temperature:g})",
      "eval/success_rate": "success, greedy eval (held-out)",
    },
  )
  throughput.plot_throughput(records, os.path.join(workdir, "throughput.png"), title=f"{spec.name}: throughput")
  return records

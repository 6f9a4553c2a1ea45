"""Evaluate a trained policy: greedy (or sampled) rollouts on the task's dev or locked test rows.

  .venv/bin/python experiments/evaluate.py --workdir=runs/demo --num_rows=128 [--step=N] [--split=test]
      [--num_chains=4 --temperature=1.0] [--seed=4242]

Opens the run with `rl/checkpoints.open_for_evaluation` (it rebuilds the run's task, built-in or user
task, from config.json, and restores the checkpoint, latest or --step, a LoRA one only onto its own
base), prints the metrics and writes them to <workdir>/eval_<split>_step<N>.json (the dev split:
eval_step<N>.json), and the first --transcript_chains chains (model-written text in ⟦ ⟧) to
<workdir>/eval_<split>_step<N>_transcript.txt (dev: eval_step<N>_transcript.txt). --split=dev rows
are those the evals during training read; --split=test is the task's locked test split (disjoint
from train and dev), the split a final score is reported on. --seed picks the rows of every task
kind (built-in, a user module's generator, gym / openenv seeds) and the sampling seed.
"""

import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags  # noqa: E402

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory written by train.py.", required=True)
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: latest).")
_SPLIT = flags.DEFINE_enum("split", "dev", ["dev", "test"], "dev: the held-out rows; test: the locked test split.")
_NUM_ROWS = flags.DEFINE_integer("num_rows", 128, "Rows to evaluate on.")
_NUM_CHAINS = flags.DEFINE_integer("num_chains", 1, "Chains per row (pass@k style success with >1).")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "0 = greedy.")
_TRANSCRIPT_CHAINS = flags.DEFINE_integer("transcript_chains", 4, "Chains written to the transcript file.")
_SEED = flags.DEFINE_integer("seed", 4242, "Seed of the rows and of the sampling.")
_ALLOW_CHANGED_TASK = flags.DEFINE_bool(
  "allow_changed_task",
  False,
  "Evaluate even when the task's content (rows, tools, reward, demo policy) differs from the one the run was "
  "trained on (e.g. the library's task files changed since): a warning instead of an error.",
)


def main(argv):
  del argv
  from agentfly_jax.agents.display import format_trajectory
  from agentfly_jax.rl.batching import chain_success, rollout_metrics
  from agentfly_jax.rl.checkpoints import open_for_evaluation
  from agentfly_jax.rl.run import rollout

  try:
    opened = open_for_evaluation(_WORKDIR.value, _STEP.value, allow_changed_task=_ALLOW_CHANGED_TASK.value)
  except FileNotFoundError as e:
    sys.exit(f"evaluate: {e}")
  except ValueError as e:
    hint = ""
    if "differs from what its config.json rebuilds" in str(e):
      hint = (
        "; evaluate it in Python with Trainer(config, workdir, task=...).evaluate(...), define the task as a "
        "module (--config.task.module) to evaluate it from the command line, or pass --allow_changed_task to "
        "evaluate on today's task"
      )
    sys.exit(f"evaluate: {e}{hint}")
  if opened.task_changed:
    print(f"warning: {opened.task_changed}; evaluating on today's task (--allow_changed_task)", file=sys.stderr)
  run, step = opened.run, opened.step
  try:
    rows = run.parts.task.split_rows(_SPLIT.value, _NUM_ROWS.value, seed=_SEED.value)
  except ValueError as e:
    sys.exit(f"evaluate: --split={_SPLIT.value}: {e}")
  trajs = rollout(run, rows, num_chains=_NUM_CHAINS.value, temperature=_TEMPERATURE.value, seed=_SEED.value)
  metrics = rollout_metrics(trajs, prefix="eval")
  if _NUM_CHAINS.value > 1:
    by_group = {}
    for t in trajs:
      by_group.setdefault(t.group_id, []).append(chain_success(t))
    metrics[f"eval/pass@{_NUM_CHAINS.value}"] = sum(any(v) for v in by_group.values()) / len(by_group)
  metrics.update(step=step, split=_SPLIT.value, seed=_SEED.value)
  name = f"eval_step{step}" if _SPLIT.value == "dev" else f"eval_{_SPLIT.value}_step{step}"
  out = os.path.join(_WORKDIR.value, f"{name}.json")
  with open(out, "w") as f:
    json.dump(metrics, f, indent=2, sort_keys=True)
  transcript = os.path.join(_WORKDIR.value, f"{name}_transcript.txt")
  with open(transcript, "w") as f:
    for t in trajs[: _TRANSCRIPT_CHAINS.value]:
      f.write(format_trajectory(t, run.parts.tokenizer, color=False) + "\n\n")
  for k, v in sorted(metrics.items()):
    print(f"{k}: {v}")
  print(f"written: {out}, {transcript}")


if __name__ == "__main__":
  app.run(main)

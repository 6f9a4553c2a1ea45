"""Evaluate a trained policy: greedy (or sampled) rollouts on held-out rows of the task.

  .venv/bin/python experiments/evaluate.py --workdir=runs/demo --num_rows=128 [--step=N] [--num_chains=4 --temperature=1.0]

Reads the run's config.json (it rebuilds the run's task, built-in or user task) and checkpoint
(latest, or --step), prints the metrics and writes them to <workdir>/eval_step<N>.json, and the
first --transcript_chains chains (model-written text in ⟦ ⟧) to <workdir>/eval_step<N>_transcript.txt.
"""

import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags  # noqa: E402

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory written by train.py.", required=True)
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: latest).")
_NUM_ROWS = flags.DEFINE_integer("num_rows", 128, "Held-out rows to evaluate on.")
_NUM_CHAINS = flags.DEFINE_integer("num_chains", 1, "Chains per row (pass@k style success with >1).")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "0 = greedy.")
_TRANSCRIPT_CHAINS = flags.DEFINE_integer("transcript_chains", 4, "Chains written to the transcript file.")
_SEED = flags.DEFINE_integer("seed", 4242, "Seed of the held-out rows.")
_ALLOW_CHANGED_TASK = flags.DEFINE_bool(
  "allow_changed_task",
  False,
  "Evaluate even when the task's content (rows, tools, reward, demo policy) differs from the one the run was "
  "trained on (e.g. the library's task files changed since): a warning instead of an error.",
)


def main(argv):
  del argv
  import dataclasses

  from agentfly_jax.agents.display import format_trajectory
  from agentfly_jax.checkpoint import Checkpointer
  from agentfly_jax.rl import stages
  from agentfly_jax.rl.batching import chain_success, rollout_metrics
  from agentfly_jax.rl.programs import TrainStates, policy_optimizers
  from agentfly_jax.rl.scale.compile_cache import enable_compile_cache
  from agentfly_jax.rl.setup import build_run
  from agentfly_jax.rl.spec import RunSpec
  from agentfly_jax.tasks.from_config import task_fingerprint

  cfg_path = os.path.join(_WORKDIR.value, "config.json")
  if not os.path.exists(cfg_path):
    sys.exit(f"evaluate: {cfg_path} not found (is --workdir a train.py run directory?)")
  with open(cfg_path) as f:  # read only: the run's config.json is never written here
    saved = json.load(f)
  try:  # the run's compiled programs (sampler, log-probs) load instead of compiling again
    enable_compile_cache(saved.get("train", {}).get("compile_cache", "auto"))
  except ValueError as e:
    sys.exit(f"evaluate: {e}")
  trained_task = None
  if os.path.exists(os.path.join(_WORKDIR.value, "task.json")):
    with open(os.path.join(_WORKDIR.value, "task.json")) as f:
      trained_task = json.load(f)
  try:
    spec = RunSpec.from_config(saved)  # a run saved by any version (migrate inside): today's fields
    spec = dataclasses.replace(spec, log=dataclasses.replace(spec.log, progress=False))
    parts = build_run(spec, os.path.abspath(_WORKDIR.value))
  except (ValueError, FileNotFoundError) as e:
    sys.exit(f"evaluate: the run's task does not rebuild: {e}")
  if trained_task and trained_task["fingerprint"] != task_fingerprint(parts.task, parts.train_rows):
    why = (
      f"evaluate: {_WORKDIR.value} was trained on a task ({trained_task['name']!r}) whose "
      "content (rows, tools, reward, demo policy) differs from what its config.json rebuilds "
      "(a Task given in Python, or edited task files)"
    )
    if not _ALLOW_CHANGED_TASK.value:
      sys.exit(
        f"{why}; evaluate it in Python with Trainer(config, workdir, task=...).evaluate(...), define the "
        "task as a module (--config.task.module) to evaluate it from the command line, or pass "
        "--allow_changed_task to evaluate on today's task"
      )
    print(f"warning: {why}; evaluating on today's task (--allow_changed_task)", file=sys.stderr)
  checkpointer = Checkpointer(
    os.path.join(os.path.abspath(_WORKDIR.value), "checkpoints"), max_to_keep=spec.checkpoint.keep
  )
  step = _STEP.value if _STEP.value is not None else checkpointer.latest_step()
  if step is None:
    sys.exit(f"evaluate: no checkpoint in {_WORKDIR.value}/checkpoints")
  # the checkpoint's TrainState layout (params + optimizer state) to restore into; no training program built
  policy, critic = parts.policy, parts.critic
  critic_params, critic_specs = (critic.params, critic.specs) if critic is not None else (None, None)
  optimizer, critic_optimizer = policy_optimizers(spec)
  states = TrainStates(
    policy.params, critic_params, optimizer, critic_optimizer, parts.mesh, policy.specs, critic_specs, spec.seed
  )
  state, _ = checkpointer.restore(step, states.new(policy.params, critic_params=critic_params))
  parts.sampler.update_weights(state.params)
  rows = parts.task.make_eval_rows(_NUM_ROWS.value, seed=_SEED.value)
  trajs = stages.rollout(
    parts.agent,
    rows,
    sampler=parts.sampler,
    rollout_spec=spec.rollout,
    end_of_turn_id=parts.end_of_turn_id,
    env_provider=parts.env_provider,
    agent_fn=parts.task.agent_fn,
    num_chains=_NUM_CHAINS.value,
    temperature=_TEMPERATURE.value,
    seed=_SEED.value,
  )
  metrics = rollout_metrics(trajs, prefix="eval")
  if _NUM_CHAINS.value > 1:
    by_group = {}
    for t in trajs:
      by_group.setdefault(t.group_id, []).append(chain_success(t))
    metrics[f"eval/pass@{_NUM_CHAINS.value}"] = sum(any(v) for v in by_group.values()) / len(by_group)
  metrics["step"] = step
  out = os.path.join(_WORKDIR.value, f"eval_step{step}.json")
  with open(out, "w") as f:
    json.dump(metrics, f, indent=2, sort_keys=True)
  transcript = os.path.join(_WORKDIR.value, f"eval_step{step}_transcript.txt")
  with open(transcript, "w") as f:
    for t in trajs[: _TRANSCRIPT_CHAINS.value]:
      f.write(format_trajectory(t, parts.tokenizer, color=False) + "\n\n")
  for k, v in sorted(metrics.items()):
    print(f"{k}: {v}")
  print(f"written: {out}, {transcript}")


if __name__ == "__main__":
  app.run(main)

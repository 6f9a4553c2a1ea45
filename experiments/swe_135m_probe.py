"""Can RL move SmolLM2-135M-Instruct on the SWE task? Sampled chains of the base model on the shipped train tasks.

  .venv/bin/python experiments/swe_135m_probe.py --tasks=16 --chains=4

`--config` (default configs/swe_grpo.py: its tool prompt, 8 turns of up to 96 tokens, 3,072 tokens a chain;
`--config.x=...` overrides) with the model SmolLM2-135M-Instruct unless `model.pretrained` names another, no SFT,
T=1: each of the first `--tasks` train tasks (train repositories only; dev and test are not read) gets `--chains` chains, as a GRPO group would. What it
measures is whether RL has anything to learn from: a group whose chains all score the same reward gives every
chain advantage 0 (GRPO, RLOO), so no gradient. Writes `--out`/probe.json (metrics, each group's rewards, the
chains' finish reasons and tool calls) and transcript.txt (the first `--transcript_chains` chains).
"""

import json
import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags
from ml_collections import config_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CONFIG = config_flags.DEFINE_config_file(
  "config", "configs/swe_grpo.py", "The SWE config (its tool prompt and limits)."
)
_TASKS = flags.DEFINE_integer("tasks", 16, "Train tasks (the first N of the shipped train split), one group each.")
_CHAINS = flags.DEFINE_integer("chains", 4, "Chains per task (a GRPO group).")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "Sampling temperature (the training rollout's).")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_TRANSCRIPT_CHAINS = flags.DEFINE_integer("transcript_chains", 6, "Chains written to transcript.txt.")
_OUT = flags.DEFINE_string("out", os.path.join(ROOT, "experiments", "results", "swe_135m_probe"), "Output folder.")


def group_signal(rewards_by_group: dict[int, list[float]]) -> dict:
  """How many groups give GRPO a gradient (rewards not all equal), and the spread of the rewards."""
  spread = [max(v) - min(v) for v in rewards_by_group.values()]
  return {
    "groups": len(spread),
    "groups_with_reward_spread": sum(s > 0 for s in spread),
    "max_spread": max(spread, default=0.0),
  }


def main(argv):
  del argv
  import time

  from agentfly_jax.agents.display import format_trajectory
  from agentfly_jax.models.gguf_convert import smollm2_folder
  from agentfly_jax.rl import stages
  from agentfly_jax.rl.batching import rollout_metrics
  from agentfly_jax.rl.setup import build_run
  from agentfly_jax.rl.spec import RunSpec
  from agentfly_jax.tasks.swe import QUESTION
  from envservers.api import swe_tasks

  config = _CONFIG.value
  config.model.pretrained = config.model.pretrained or smollm2_folder()  # SmolLM2-135M-Instruct unless given
  config.rollout.rows_per_step = _TASKS.value  # all groups at once (the bound on chains in flight)
  config.rollout.num_chains = _CHAINS.value
  config.log.progress = False
  spec = RunSpec.from_config(config.to_dict())
  ids = swe_tasks.shipped_task_ids("train")[: _TASKS.value]
  rows = [{"question": QUESTION, "task_id": t, "split": "train"} for t in ids]
  started = time.monotonic()
  with tempfile.TemporaryDirectory() as workdir:
    parts = build_run(spec, workdir)
    trajs = stages.rollout(
      parts.agent,
      rows,
      sampler=parts.sampler,
      rollout_spec=spec.rollout,
      end_of_turn_id=parts.end_of_turn_id,
      env_provider=parts.env_provider,
      num_chains=_CHAINS.value,
      temperature=_TEMPERATURE.value,
      seed=_SEED.value,
    )
    transcripts = [format_trajectory(t, parts.tokenizer, color=False) for t in trajs[: _TRANSCRIPT_CHAINS.value]]
  wall = time.monotonic() - started
  by_group: dict[int, list[float]] = {}
  for t in trajs:
    by_group.setdefault(t.group_id, []).append(float(t.reward))
  result = {
    "model": "SmolLM2-135M-Instruct (base, no SFT)",
    "config": config.name,
    "tasks": ids,
    "chains": _CHAINS.value,
    "temperature": _TEMPERATURE.value,
    "wall_s": wall,
    "metrics": rollout_metrics(trajs, prefix="probe"),
    "signal": group_signal(by_group),
    "rewards_by_task": {ids[g]: v for g, v in sorted(by_group.items())},
    "chains_detail": [
      {
        "task": ids[t.group_id],
        "reward": float(t.reward),
        "finish_reason": t.finish_reason,
        "tool_calls": [(c.get("name"), bool(c.get("ok"))) for c in (t.tool_calls or [])],
        "turns": t.num_turns,
        "reward_metrics": t.reward_metrics,
      }
      for t in trajs
    ],
  }
  os.makedirs(_OUT.value, exist_ok=True)
  with open(os.path.join(_OUT.value, "probe.json"), "w") as f:
    json.dump(result, f, indent=2, default=str)
  with open(os.path.join(_OUT.value, "transcript.txt"), "w") as f:
    f.write("\n\n".join(transcripts) + "\n")
  print(json.dumps({k: result[k] for k in ("signal", "wall_s")}, indent=2))
  for k, v in sorted(result["metrics"].items()):
    print(f"{k}: {v}")


if __name__ == "__main__":
  app.run(main)

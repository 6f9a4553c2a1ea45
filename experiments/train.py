"""Train an agent with RL.

  .venv/bin/python experiments/train.py --config=configs/lookup_grpo.py --workdir=runs/demo \
      --config.train.steps=30 --config.rollout.num_chains=8

A user task (tools, a reward, rows) from the command line, see configs/custom_grpo.py:

  .venv/bin/python experiments/train.py --config=configs/custom_grpo.py --workdir=runs/mine \
      --config.task.module=my_task                       # @tool / @reward functions (+ ROWS)
  .venv/bin/python experiments/train.py --config=configs/custom_grpo.py --workdir=runs/mine \
      --config.task.train_path=rows.jsonl --config.task.tools=calculator \
      --config.task.reward=exact_match                   # or my_task:my_reward

Modules import from the current directory too (as with `python -m`). Resumes from the latest checkpoint in --workdir when one exists (--noresume starts over: the
workdir must then be empty of checkpoints). Writes metrics.jsonl, TensorBoard events (tb/),
checkpoints/, reward.png into --workdir.
"""

import os
import shutil
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/lookup_grpo.py", "ml_collections config file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default runs/<config.name>).")
_RESUME = flags.DEFINE_bool("resume", True, "Continue from the latest checkpoint in --workdir.")
_WANDB = flags.DEFINE_bool("wandb", False, "Also log to Weights & Biases.")
_COORDINATOR = flags.DEFINE_string(
  "coordinator_address",
  None,
  "Multi-host: host:port of process 0's JAX coordinator "
  "(default: env AGENTFLY_COORDINATOR_ADDRESS; unset = one process; 'auto' = from the TPU "
  "pod slice's environment, jax.distributed.initialize()).",
)
_NUM_PROCESSES = flags.DEFINE_integer(
  "num_processes", None, "Multi-host: number of processes (env AGENTFLY_NUM_PROCESSES)."
)
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "Multi-host: this process's index (env AGENTFLY_PROCESS_ID).")


def main(argv):
  del argv
  from absl import logging

  logging.set_verbosity(logging.WARNING)
  from agentfly_jax.rl.spec import RunSpec
  from agentfly_jax.tasks.from_config import absolutize_paths, build_task

  config = _CONFIG.value
  if _WANDB.value:
    config.log.wandb = True
  try:  # config and task (rows, tools, reward, demo policy) checked before anything is built
    absolutize_paths(config)  # the task's files as absolute paths: the saved config works from anywhere
    spec = RunSpec.from_config(config)  # the config parsed once: nothing below reads the ConfigDict
    task = build_task(spec)
  except (ValueError, FileNotFoundError) as e:
    sys.exit(f"bad config: {e}")
  from agentfly_jax.rl.scale.memory_plan import MemorySplitError, apply_memory_split

  try:  # JAX + vLLM on one GPU: JAX's share is set before its backend starts, both sides checked
    plan = apply_memory_split(spec)
  except (MemorySplitError, FileNotFoundError) as e:
    sys.exit(f"bad config: {e}")
  if plan is not None:
    print(f"memory split: {plan.describe()}")
  from agentfly_jax.rl.scale.compile_cache import enable_compile_cache

  try:  # before the first jit: a compiled program another run wrote is loaded, not compiled
    enable_compile_cache(spec.train.compile_cache)
  except ValueError as e:
    sys.exit(f"bad config: {e}")
  from agentfly_jax.rl import distributed  # JAX loads only once the config is good

  try:  # before anything touches a device
    distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  except ValueError as e:
    sys.exit(f"bad multi-host flags: {e}")
  from agentfly_jax.rl.loop import train
  from agentfly_jax.rl.setup import build_run

  workdir = _WORKDIR.value or os.path.join("runs", config.name)
  if not _RESUME.value and os.path.exists(workdir) and distributed.is_primary():
    shutil.rmtree(workdir)
  distributed.barrier("workdir")
  records = train(spec, build_run(spec, workdir, task=task), workdir)  # [] on processes other than 0
  final = [r for r in records if "rollout/success_rate" in r]
  if final:
    print(
      f"final step {final[-1]['step']}: reward {final[-1]['rollout/reward_mean']:.3f}, "
      f"success {final[-1]['rollout/success_rate']:.3f}"
    )
  print(f"metrics: {os.path.join(workdir, 'metrics.jsonl')}  plot: {os.path.join(workdir, 'reward.png')}")


if __name__ == "__main__":
  app.run(main)

"""Running experiments/train.py from tests: the command line and the metrics it writes."""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import os
import subprocess
import sys

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))  # helpers, child-process scripts, data
ROOT = os.path.dirname(TESTS_DIR)
# No periodic eval and no progress bar: tests read metrics.jsonl, not the terminal.
QUIET = ("--config.eval.every=0", "--config.eval.num_rows=0", "--config.log.progress=False")
# The smoke size of the random-init task configs run through the env servers (world, SWE, search and math
# configs): one model, batch and sequence shape, learning rate and vocabulary (task_config's 1024), so every
# such run of a test run reads the programs the first one put in the compile cache. 1024 tokens hold the
# longest opening observation (an SWE issue).
ENV_TASK_SMOKE = (
  "--config.rollout.rows_per_step=1",
  "--config.rollout.num_chains=2",
  "--config.rollout.max_turns=2",
  "--config.rollout.max_tokens_per_turn=16",
  "--config.rollout.max_total_tokens=1024",
  "--config.model.hidden_size=64",
  "--config.model.intermediate_size=128",
  "--config.model.num_layers=1",
  "--config.train.lr=3e-4",
  "--config.checkpoint.every=100",
)


def train_command(workdir, *overrides: str, config: str = "configs/lookup_grpo.py") -> list[str]:
  """argv for one train.py run; `overrides` ("--config.train.steps=2", ...) come last and win."""
  return [
    sys.executable,
    os.path.join(ROOT, "experiments", "train.py"),
    f"--config={config}",
    f"--workdir={workdir}",
    *QUIET,
    *overrides,
  ]


def read_metrics(workdir) -> list[dict]:
  """The records of workdir/metrics.jsonl, in order."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


def run_train(workdir, *overrides: str, timeout: float = 600) -> list[dict]:
  """Runs train.py to completion (asserting exit 0, with its stderr tail on failure); returns
  the metrics records."""
  out = subprocess.run(train_command(workdir, *overrides), cwd=ROOT, capture_output=True, text=True, timeout=timeout)
  assert out.returncode == 0, out.stderr[-4000:]
  return read_metrics(workdir)


@functools.lru_cache(maxsize=None)  # loaded once: a script's absl flags may be defined only once
def load_script(relative_path: str):
  """A script of the repository (e.g. "experiments/sweep.py") as a module, not run. Flags it defines
  that another loaded script defined already (both define --config: absl's flags are global) are
  taken out of absl's FLAGS first: tests call the scripts' functions, not their mains."""
  from absl import flags

  name = os.path.splitext(os.path.basename(relative_path))[0]
  path = os.path.join(ROOT, relative_path)
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  for node in ast.walk(tree):
    callee = getattr(node, "func", None) if isinstance(node, ast.Call) else None
    defines = getattr(callee, "attr", getattr(callee, "id", "")).startswith("DEFINE")
    if defines and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in flags.FLAGS:
      delattr(flags.FLAGS, node.args[0].value)
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


# experiments/aot_compile.py flags of a tiny run (scanned, remat) that compiles in seconds
AOT_TINY_FLAGS = [
  "--config.model.scan_layers=True",
  "--config.train.remat=full",
  "--seq_len=64",
  "--config.rollout.rows_per_step=2",
  "--config.rollout.num_chains=4",
  "--config.rollout.max_batch_size=8",
  "--config.rollout.max_total_tokens=64",
  "--config.rollout.max_tokens_per_turn=16",
  "--config.train.micro_batch_size=4",
  "--config.sft.rows_per_step=4",
]

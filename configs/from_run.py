"""A saved run's config (its config.json), e.g. to continue, re-train or sweep around that run
with exactly its task:

  .venv/bin/python experiments/train.py --config=configs/from_run.py:runs/mine --workdir=runs/mine2 \
      --config.train.lr=3e-4
  .venv/bin/python experiments/sweep.py --config=configs/from_run.py:runs/mine --grid="train.lr=1e-4,3e-4"
"""

import json
import os

from agentfly_jax.rl.config import migrate


def get_config(run_dir: str):
  path = os.path.join(run_dir, "config.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"configs/from_run.py: {path} not found (is {run_dir!r} a train.py run directory?)")
  with open(path) as f:
    return migrate(json.load(f))  # saved by an older version: today's fields, its values kept

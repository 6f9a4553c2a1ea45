"""Shared by the benchmarks that run whole train.py jobs (bench_async, bench_chains, bench_memory):
the machine line of their results (CPU model from bench_common.cpu_name, cores), a quiet train.py
command, writing JSON + markdown."""

import os

from bench_common import cpu_name  # noqa: F401 (bench_memory imports it from here)


def machine() -> str:
  """'<CPU model>, <n> cores, CPU only'."""
  return f"{cpu_name()}, {os.cpu_count()} cores, CPU only"


def train_command(root: str, config: str, workdir: str, steps: int, *overrides: str) -> list[str]:
  """argv of one quiet experiments/train.py run (no progress bar / TensorBoard, starts over,
  a checkpoint only at the end); `overrides` ("--config.x=y") come last and win."""
  import sys

  return [
    sys.executable,
    os.path.join(root, "experiments", "train.py"),
    f"--config={config}",
    f"--workdir={workdir}",
    "--noresume",
    f"--config.train.steps={steps}",
    f"--config.checkpoint.every={steps}",
    "--config.log.progress=False",
    "--config.log.tensorboard=False",
    *overrides,
  ]


def write_results(out: str, result: dict, markdown: str) -> None:
  """`out`.json (result) and `out`.md (the table), creating the folder; prints the table."""
  import json

  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out + ".json", "w") as f:
    json.dump(result, f, indent=1)
  with open(out + ".md", "w") as f:
    f.write(markdown)
  print(markdown)

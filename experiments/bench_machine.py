"""Shared by the benchmarks: the machine line of their results (CPU model, cores), a quiet
train.py command, writing JSON + markdown."""
import os
import platform


def cpu_name() -> str:
  """The CPU model from /proc/cpuinfo (else platform's processor / machine name)."""
  try:
    with open("/proc/cpuinfo") as f:
      return next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
  except (OSError, StopIteration):
    return platform.processor() or platform.machine()


def machine() -> str:
  """'<CPU model>, <n> cores, CPU only'."""
  return f"{cpu_name()}, {os.cpu_count()} cores, CPU only"


def train_command(root: str, config: str, workdir: str, steps: int, *overrides: str) -> list[str]:
  """argv of one quiet experiments/train.py run (no progress bar / TensorBoard, starts over,
  a checkpoint only at the end); `overrides` ("--config.x=y") come last and win."""
  import sys
  return [sys.executable, os.path.join(root, "experiments", "train.py"), f"--config={config}",
          f"--workdir={workdir}", "--noresume", f"--config.train.steps={steps}",
          f"--config.checkpoint.every={steps}", "--config.log.progress=False",
          "--config.log.tensorboard=False", *overrides]


def write_results(out: str, result: dict, markdown: str) -> None:
  """`out`.json (result) and `out`.md (the table), creating the folder; prints the table."""
  import json
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out + ".json", "w") as f:
    json.dump(result, f, indent=1)
  with open(out + ".md", "w") as f:
    f.write(markdown)
  print(markdown)

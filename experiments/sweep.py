"""Sweep launcher: a grid or random search over config overrides.

  .venv/bin/python experiments/sweep.py --config=configs/lookup_grpo.py --sweep_dir=runs/sweep \
      --grid="train.lr=1e-4,3e-4;rollout.num_chains=4,8" --parallel=2 \
      --base="train.steps=10"

Runs every point as its own `experiments/train.py` process (N at a time, locally), writes a
SLURM job-array script (`slurm_array.sh`, one array task per point) for clusters, and, when the
runs finish, a summary table (`summary.md`, `summary.json`) of each run's final metrics and a plot
(`summary.png`). `--dry_run` only writes the points and the SLURM script.

Every point's config and task (rows, tools, reward; agentfly_jax/tasks/from_config.py) is
checked before any run starts. `--config=configs/from_run.py:runs/x` sweeps around a saved run
(its config.json, hence exactly its task). Paths are taken relative to the current directory.
"""

import importlib.util
import itertools
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time

from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CONFIG = flags.DEFINE_string("config", "configs/lookup_grpo.py", "Base config file.")
_SWEEP_DIR = flags.DEFINE_string("sweep_dir", "runs/sweep", "Where runs and the summary go.")
_GRID = flags.DEFINE_string("grid", "", "'key=v1,v2;key2=v3,v4': the values of each swept config key.")
_BASE = flags.DEFINE_string("base", "", "'key=v;key2=v2': overrides applied to every run.")
_MODE = flags.DEFINE_enum("mode", "grid", ["grid", "random"], "Full grid, or random points of it.")
_NUM_RANDOM = flags.DEFINE_integer("num_random", 4, "Points to draw in random mode.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed for random mode.")
_PARALLEL = flags.DEFINE_integer("parallel", 2, "Runs at once, locally.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Write the plan and the SLURM script; run nothing.")
_METRICS = flags.DEFINE_list(
  "metrics", ["rollout/reward_mean", "rollout/success_rate", "eval/success_rate"], "Final metrics to tabulate."
)


def parse_assignments(text: str, *, multi: bool) -> dict:
  out = {}
  for part in filter(None, (p.strip() for p in text.split(";"))):
    if "=" not in part:
      raise ValueError(f"sweep: {part!r} is not key=value")
    key, values = part.split("=", 1)
    vals = [v.strip() for v in values.split(",")] if multi else [values.strip()]
    if not key.strip() or not all(vals):
      raise ValueError(f"sweep: empty key or value in {part!r}")
    out[key.strip()] = vals if multi else vals[0]
  return out


def sweep_points(grid: dict, mode: str, num_random: int, seed: int) -> list[dict]:
  keys = sorted(grid)
  points = [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))] or [{}]
  if mode == "random":
    rng = random.Random(seed)
    points = rng.sample(points, min(num_random, len(points)))
  return points


def load_config(spec: str):
  """The ConfigDict of a config file spec 'path.py' or 'path.py:arg' (as --config takes it)."""
  path, _, arg = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location("sweep_base_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def with_overrides(config, overrides: dict):
  """A copy of `config` with 'section.key' -> string values, each cast to the field's type."""
  config = config.copy_and_resolve_references()
  for key, text in overrides.items():
    *sections, field = key.split(".")
    node = config
    for s in sections:
      node = node[s]
    old = node[field]
    if isinstance(old, bool):
      value = text.lower() in ("1", "true", "yes")
    elif isinstance(old, (int, float)):
      value = type(old)(float(text)) if isinstance(old, int) and "." in text else type(old)(text)
    else:
      value = text
    node[field] = value
  return config


def check_point(base_config, overrides: dict) -> None:
  """Raises ValueError naming the bad field, row or file of one sweep point (nothing is built)."""
  from agentfly_jax.rl.config import validate_config
  from agentfly_jax.tasks.from_config import build_task

  config = with_overrides(base_config, overrides)
  validate_config(config)
  build_task(config)


def absolute_spec(spec: str) -> str:
  """A config spec with its file (and an existing-path argument) made absolute."""
  path, sep, arg = spec.partition(":")
  if arg and os.path.exists(arg):
    arg = os.path.abspath(arg)
  return os.path.abspath(path) + sep + arg


def absolute_overrides(overrides: dict) -> dict:
  """Task file paths made absolute, so train.py (run from the repository) finds them."""
  out = dict(overrides)
  for key in ("task.train_path", "task.eval_path", "task.module"):
    value = out.get(key)
    if value and (key != "task.module" or value.endswith(".py")):
      out[key] = os.path.abspath(value)
  return out


def run_command(config: str, workdir: str, overrides: dict) -> list[str]:
  cmd = [
    sys.executable,
    os.path.join(ROOT, "experiments", "train.py"),
    f"--config={config}",
    f"--workdir={workdir}",
    "--config.log.progress=False",
  ]
  cmd += [f"--config.{k}={v}" for k, v in overrides.items()]
  return cmd


def write_slurm(path: str, commands: list[list[str]]) -> None:
  lines = [
    "#!/bin/bash",
    f"#SBATCH --array=0-{len(commands) - 1}",
    "#SBATCH --job-name=agentfly-sweep",
    "#SBATCH --output=%x-%A_%a.out",
    "",
    "case $SLURM_ARRAY_TASK_ID in",
  ]
  for i, cmd in enumerate(commands):
    lines.append(f"  {i}) {' '.join(shlex.quote(c) for c in cmd)} ;;")
  lines += ["esac", ""]
  with open(path, "w") as f:
    f.write("\n".join(lines))
  os.chmod(path, 0o755)


def final_metrics(workdir: str, keys: list[str]) -> dict:
  path = os.path.join(workdir, "metrics.jsonl")
  out = {k: None for k in keys}
  if not os.path.exists(path):
    return out
  with open(path) as f:
    records = [json.loads(line) for line in f if line.strip()]
  for k in keys:
    vals = [r[k] for r in records if isinstance(r.get(k), (int, float))]
    out[k] = vals[-1] if vals else None
  return out


def write_summary(sweep_dir: str, rows: list[dict], keys: list[str]) -> None:
  with open(os.path.join(sweep_dir, "summary.json"), "w") as f:
    json.dump(rows, f, indent=2)
  swept = sorted({k for r in rows for k in r["overrides"]})
  header = ["run", *swept, "exit", *keys]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for r in rows:
    vals = [r["run"], *[str(r["overrides"].get(k, "")) for k in swept], str(r["returncode"])]
    vals += ["" if r["final"][k] is None else f"{r['final'][k]:.3f}" for k in keys]
    lines.append("| " + " | ".join(vals) + " |")
  with open(os.path.join(sweep_dir, "summary.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(max(5, len(rows) * 1.2), 4))
  width = 0.8 / max(1, len(keys))
  for j, k in enumerate(keys):
    ax.bar([i + j * width for i in range(len(rows))], [r["final"][k] or 0 for r in rows], width, label=k)
  ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))])
  ax.set_xticklabels(
    [",".join(f"{k.split('.')[-1]}={v}" for k, v in r["overrides"].items()) or r["run"] for r in rows],
    rotation=30,
    ha="right",
    fontsize=7,
  )
  ax.legend(fontsize=7)
  ax.set_title("sweep: final metrics")
  fig.tight_layout()
  fig.savefig(os.path.join(sweep_dir, "summary.png"), dpi=100)


def main(argv):
  del argv
  grid = parse_assignments(_GRID.value, multi=True)
  base = parse_assignments(_BASE.value, multi=False)
  points = sweep_points(grid, _MODE.value, _NUM_RANDOM.value, _SEED.value)
  config_spec = absolute_spec(_CONFIG.value)
  base_config = load_config(config_spec)
  for point in points:
    try:
      check_point(base_config, {**base, **point})
    except (ValueError, FileNotFoundError, KeyError, AttributeError) as e:
      sys.exit(f"sweep: point {point or base} is not a valid run: {e}")
  sweep_dir = os.path.abspath(_SWEEP_DIR.value)
  os.makedirs(sweep_dir, exist_ok=True)
  runs = []
  for i, point in enumerate(points):
    overrides = absolute_overrides({**base, **point})
    workdir = os.path.join(sweep_dir, f"run_{i:03d}")
    runs.append(
      {
        "run": f"run_{i:03d}",
        "overrides": point,
        "all_overrides": overrides,
        "workdir": workdir,
        "cmd": run_command(config_spec, workdir, overrides),
      }
    )
  write_slurm(os.path.join(sweep_dir, "slurm_array.sh"), [r["cmd"] for r in runs])
  with open(os.path.join(sweep_dir, "plan.json"), "w") as f:
    json.dump([{k: r[k] for k in ("run", "overrides", "cmd")} for r in runs], f, indent=2)
  print(f"{len(runs)} runs planned in {sweep_dir} (slurm_array.sh written)")
  if _DRY_RUN.value:
    return
  # SIGTERM / SIGHUP (a job scheduler's cancel, a closed terminal) end the sweep like Ctrl-C: through
  # the `finally` below, which stops the runs it started instead of leaving them running unparented
  for sig in (signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, _exit_on_signal)
  pending, active = list(runs), []
  try:
    while pending or active:
      while pending and len(active) < _PARALLEL.value:
        r = pending.pop(0)
        os.makedirs(r["workdir"], exist_ok=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
        with open(os.path.join(r["workdir"], "train.log"), "w") as log:
          r["proc"] = subprocess.Popen(r["cmd"], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        active.append(r)
      time.sleep(0.5)
      for r in list(active):
        if r["proc"].poll() is not None:
          r["returncode"] = r["proc"].returncode
          active.remove(r)
          print(f"{r['run']} finished (exit {r['returncode']})")
  finally:
    _stop([r["proc"] for r in active])
  rows = [
    {
      "run": r["run"],
      "overrides": r["overrides"],
      "returncode": r["returncode"],
      "final": final_metrics(r["workdir"], _METRICS.value),
    }
    for r in runs
  ]
  write_summary(sweep_dir, rows, _METRICS.value)
  print(open(os.path.join(sweep_dir, "summary.md")).read())
  if any(r["returncode"] != 0 for r in rows):
    sys.exit("some runs failed: see their train.log")


def _exit_on_signal(signum, frame):
  del frame
  raise SystemExit(
    f"sweep: stopped by signal {signal.Signals(signum).name}; its running train.py processes are stopped"
  )


def _stop(procs: list, grace_s: float = 10.0) -> None:
  """SIGTERM to each still-running process, SIGKILL to any alive `grace_s` later."""
  for p in procs:
    if p.poll() is None:
      p.terminate()
  deadline = time.monotonic() + grace_s
  for p in procs:
    try:
      p.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      p.kill()
      p.wait()


if __name__ == "__main__":
  app.run(main)

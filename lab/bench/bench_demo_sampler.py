"""The README demo's training (configs/lookup_grpo.py) on the static JAX sampler and on the paged engine:
steps/s and the share of each step the trainer waits for the rollout.

    .venv/bin/python lab/bench/bench_demo_sampler.py [--steps=12 --repeats=2]
    -> lab/results/bench_demo_sampler.{json,md}

Each run is `experiments/train.py --config=configs/lookup_grpo.py` in its own process with
`rollout.sampler` = jax_static | jax, the runs interleaved (static, engine, static, ...), evaluation off.
Read from each run's metrics.jsonl (rl/throughput.py): time/step_s and time/trainer_idle_frac (rollout wait /
step) over the steps after the first (the first compiles the programs; its wall is reported apart), and
the sampled success rate at the last step (both learn alike: the samplers draw the same distribution).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import bench_common  # noqa: F401  (this folder is on sys.path: the script's own)
from absl import app, flags
from bench_common import REPO_ROOT, RESULTS_DIR, cpu_name, load_note
from bench_machine import write_results

FLAGS = flags.FLAGS
flags.DEFINE_integer("steps", 12, "training steps per run")
flags.DEFINE_integer("repeats", 2, "runs per sampler (interleaved)")
flags.DEFINE_list("samplers", ["jax_static", "jax"], "rollout.sampler values to compare")
flags.DEFINE_string("out", os.path.join(RESULTS_DIR, "bench_demo_sampler"), "output stem (.json / .md)")


def run_once(sampler: str, steps: int, workdir: str) -> dict:
  cmd = [
    sys.executable,
    os.path.join(REPO_ROOT, "experiments", "train.py"),
    "--config=" + os.path.join(REPO_ROOT, "configs", "lookup_grpo.py"),
    f"--workdir={workdir}",
    f"--config.train.steps={steps}",
    f"--config.rollout.sampler={sampler}",
    "--config.eval.every=0",
  ]
  start = time.perf_counter()
  subprocess.run(cmd, check=True, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  wall = time.perf_counter() - start
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  steps_rows = [r for r in rows if "time/step_s" in r]
  later = steps_rows[1:]
  return {
    "sampler": sampler,
    "process_wall_s": wall,
    "first_step_s": steps_rows[0]["time/step_s"],
    "step_s_median": statistics.median(r["time/step_s"] for r in later),
    "steps_per_s": len(later) / sum(r["time/step_s"] for r in later),
    "rollout_wait_share": statistics.mean(r.get("time/trainer_idle_frac", float("nan")) for r in later),
    "success_last": steps_rows[-1].get("rollout/success_rate", steps_rows[-1].get("reward/success_rate")),
  }


def table(results: dict) -> str:
  lines = [
    f"# The demo's training on the static sampler and on the paged engine ({results['date']}, commit {results['commit']})",
    "",
    f"Machine: {results['machine']}; {results['load']}. configs/lookup_grpo.py, {results['steps']} steps a run, "
    "evaluation off; steps after the first (which compiles) are timed.",
    "",
    "| sampler | runs | steps/s (median run) | vs jax_static | rollout-wait share | first step s | sampled success, last step |",
    "|---|---|---|---|---|---|---|",
  ]
  by = {}
  for r in results["runs"]:
    by.setdefault(r["sampler"], []).append(r)
  base = statistics.median(r["steps_per_s"] for r in by.get("jax_static", by[next(iter(by))]))
  for name, runs in by.items():
    sps = statistics.median(r["steps_per_s"] for r in runs)
    lines.append(
      f"| {name} | {len(runs)} | {sps:.3f} | {sps / base:.2f}x | "
      f"{statistics.median(r['rollout_wait_share'] for r in runs):.2f} | "
      f"{statistics.median(r['first_step_s'] for r in runs):.1f} | "
      + ", ".join(f"{r['success_last']:.2f}" if isinstance(r["success_last"], float) else "-" for r in runs)
      + " |"
    )
  return "\n".join(lines) + "\n"


def main(argv):
  del argv
  load0 = os.getloadavg()[0]
  results = {
    "date": time.strftime("%Y-%m-%d"),
    "commit": subprocess.run(
      ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO_ROOT
    ).stdout.strip(),
    "machine": cpu_name(),
    "steps": FLAGS.steps,
    "runs": [],
  }
  with tempfile.TemporaryDirectory() as tmp:
    for rep in range(FLAGS.repeats):
      for sampler in FLAGS.samplers:
        r = run_once(sampler, FLAGS.steps, os.path.join(tmp, f"{sampler}_{rep}"))
        print(json.dumps(r), flush=True)
        results["runs"].append(r)
  results["load"] = load_note(load0)
  write_results(FLAGS.out, results, table(results))


if __name__ == "__main__":
  app.run(main)

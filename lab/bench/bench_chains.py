"""Steps/s and memory as the chains per RL step grow (64 -> 1,024): the README demo (lookup GRPO,
tiny warm-started policy, JAX sampler), a few steps per size, each size in its own train.py
process.

  .venv/bin/python lab/bench/bench_chains.py --chains=64,128,256,512,1024 --steps=3
  -> lab/results/bench_chains.{json,md}

Chains per step = rollout.rows_per_step x rollout.num_chains (num_chains fixed at the demo's 8,
rows grow). The first step compiles for its shapes and is left out of the per-step times (a
later step meeting a new padded length may still compile: the table shows the mean and the
fastest measured step). Memory: the process's peak resident set (ru_maxrss of the child,
os.wait4), which holds the model, optimizer, sampler KV cache and the step's batch arrays.
"""

import json
import os
import subprocess
import sys
import time

from absl import app, flags
from bench_common import REPO_ROOT as ROOT  # (this folder is on sys.path: the script's own)
from bench_machine import machine, train_command, write_results

_CHAINS = flags.DEFINE_list("chains", ["64", "128", "256", "512", "1024"], "Chains per step.")
_NUM_CHAINS = flags.DEFINE_integer("num_chains", 8, "Chains per row (group size).")
_STEPS = flags.DEFINE_integer("steps", 3, "RL steps per size (the first is left out of the times).")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/bench_chains", "Where the runs write.")
_OUT = flags.DEFINE_string("out", "lab/results/bench_chains", "Output path (no extension).")
_CONFIG = flags.DEFINE_string("config", "configs/lookup_grpo.py", "The demo config.")
_NOTE = flags.DEFINE_string("note", "", "Machine note for the results.")


def run(chains: int) -> dict:
  """One train.py run with `chains` chains per step; its step records, wall time, peak RSS."""
  if chains % _NUM_CHAINS.value:
    raise app.UsageError(f"--chains: {chains} is not a multiple of --num_chains={_NUM_CHAINS.value}")
  workdir = os.path.join(_WORKDIR.value, f"chains{chains}")
  cmd = train_command(
    ROOT,
    _CONFIG.value,
    workdir,
    _STEPS.value,
    f"--config.rollout.rows_per_step={chains // _NUM_CHAINS.value}",
    f"--config.rollout.num_chains={_NUM_CHAINS.value}",
    "--config.eval.every=0",
    "--config.eval.num_rows=0",
  )
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  t0 = time.perf_counter()
  with open(os.path.join(_WORKDIR.value, f"chains{chains}.stderr"), "w") as err:
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
  wall = time.perf_counter() - t0
  if os.waitstatus_to_exitcode(status) != 0:
    raise RuntimeError(f"chains {chains} failed, see {err.name}")
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f if line.strip() and "time/step_s" in line]
  return {"records": records, "wall_s": wall, "peak_rss_mib": usage.ru_maxrss / 1024}


def summarize(chains: int, out: dict) -> dict:
  measured = [r for r in out["records"] if r["step"] >= 2]
  if not measured:
    raise ValueError(f"chains {chains}: no steps after the first (use --steps >= 2)")
  mean = lambda key: sum(r[key] for r in measured) / len(measured)
  step_s = mean("time/step_s")
  return {
    "chains": chains,
    "rows_per_step": chains // _NUM_CHAINS.value,
    "steps_measured": len(measured),
    "step_s": step_s,
    "steps_per_s": 1 / step_s,
    "fastest_step_s": min(r["time/step_s"] for r in measured),
    "chains_per_s": chains / step_s,
    "rollout_s": mean("time/rollout_s"),
    "train_s": mean("time/train_s"),
    "prepare_s": mean("time/prepare_s"),
    "tokens_total_mean": mean("rollout/tokens_total_mean"),
    "peak_rss_mib": out["peak_rss_mib"],
    "wall_s": out["wall_s"],
  }


def table(result: dict) -> str:
  lines = [
    "# Steps/s and memory as chains per step grow (demo: lookup GRPO, tiny policy)",
    "",
    f"Machine: {result['machine']}. {result['note']}".strip(),
    "",
    f"{result['steps']} RL steps per size (step 1 compiles and is left out), {result['num_chains']} chains per row.",
    "",
    "| chains/step | steps/s | step s (mean) | fastest step s | chains/s | rollout s | train s "
    "| peak RSS MiB | chains/s vs 64 |",
    "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
  ]
  base = result["rows"][0]["chains_per_s"]
  for r in result["rows"]:
    lines.append(
      f"| {r['chains']} | {r['steps_per_s']:.4f} | {r['step_s']:.1f} | {r['fastest_step_s']:.1f} "
      f"| {r['chains_per_s']:.1f} | {r['rollout_s']:.1f} | {r['train_s']:.1f} "
      f"| {r['peak_rss_mib']:,.0f} | {r['chains_per_s'] / base:.2f}x |"
    )
  if result["not_measured"]:
    lines += ["", f"Not measured (the run was stopped first): {result['not_measured']} chains per step."]
  return "\n".join(lines + [""])


def main(argv):
  del argv
  os.makedirs(_WORKDIR.value, exist_ok=True)
  rows, sizes = [], sorted(int(c) for c in _CHAINS.value)
  for chains in sizes:
    rows.append(summarize(chains, run(chains)))
    print(json.dumps(rows[-1]), flush=True)
    # after every size: a run stopped early keeps what it measured (and says what it did not)
    result = {
      "machine": machine(),
      "note": _NOTE.value,
      "config": _CONFIG.value,
      "steps": _STEPS.value,
      "num_chains": _NUM_CHAINS.value,
      "rows": rows,
      "not_measured": sizes[len(rows) :],
    }
    write_results(_OUT.value, result, table(result))


if __name__ == "__main__":
  app.run(main)

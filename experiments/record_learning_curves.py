"""Record learning curves of several algorithms on the lookup task (shared warm start).

  .venv/bin/python experiments/record_learning_curves.py --algos=grpo,ppo,rloo,reinforce_pp \
      --steps=40 --out=runs/learning_curves

Each algorithm trains from the same shipped warm-started policy (experiments/make_warmstart.py,
`model.pretrained` in configs/lookup_*.py); writes <out>/<algo>/metrics.jsonl + reward.png, a combined plot
<out>/learning_curves.png and <out>/summary.json (initial vs final success, wall-clock). Algorithms
already recorded in <out> and not in --algos keep their results (summary entry, folder, curve).
"""

import json
import os
import shutil
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags, logging  # noqa: E402

_ALGOS = flags.DEFINE_list("algos", ["grpo", "ppo", "rloo", "reinforce_pp"], "Algorithms to run.")
_STEPS = flags.DEFINE_integer("steps", 40, "RL steps per algorithm.")
_OUT = flags.DEFINE_string("out", "runs/learning_curves", "Output folder.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed.")


def success_of(records, key):
  return [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  import importlib.util
  from agentfly_jax.rl.trainer import Trainer

  out = os.path.abspath(_OUT.value)
  os.makedirs(out, exist_ok=True)
  summary = {"machine": f"{os.cpu_count()} CPU cores (no GPU)", "algos": {}}
  all_records = {}
  for algo in _ALGOS.value:
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", f"lookup_{algo}.py")
    spec = importlib.util.spec_from_file_location("cfg", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    config = mod.get_config()
    config.seed = _SEED.value
    config.train.steps = _STEPS.value
    config.eval.every = 10
    config.checkpoint.every = 1000
    workdir = os.path.join(out, algo)
    shutil.rmtree(workdir, ignore_errors=True)
    t0 = time.time()
    records = Trainer(config, workdir).train()
    wall = time.time() - t0
    shutil.rmtree(os.path.join(workdir, "checkpoints"), ignore_errors=True)
    shutil.rmtree(os.path.join(workdir, "tokenizer"), ignore_errors=True)
    all_records[algo] = records
    roll = success_of(records, "rollout/success_rate")
    ev = success_of(records, "eval/success_rate")
    first = sum(v for _, v in roll[:3]) / max(1, len(roll[:3]))
    last = sum(v for _, v in roll[-3:]) / max(1, len(roll[-3:]))
    rl_time = sum(r.get("time/step_s", 0) for r in records)
    summary["algos"][algo] = {
      "rollout_success_first3": first,
      "rollout_success_last3": last,
      "eval_success": ev,
      "rl_wall_s": rl_time,
      "total_wall_s": wall,
    }
    print(f"{algo}: rollout success {first:.2f} -> {last:.2f}; eval {ev}; RL time {rl_time:.0f}s", flush=True)
  # algorithms not run now keep their recorded results (their folders and summary entries)
  old_path = os.path.join(out, "summary.json")
  if os.path.exists(old_path):
    with open(old_path) as f:
      old = json.load(f).get("algos", {})
    for algo in sorted(set(old) - set(summary["algos"])):
      jsonl = os.path.join(out, algo, "metrics.jsonl")
      if os.path.exists(jsonl):
        summary["algos"][algo] = old[algo]
        with open(jsonl) as f:
          all_records[algo] = [json.loads(line) for line in f if line.strip()]
  with open(old_path, "w") as f:
    json.dump(summary, f, indent=2)
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(7, 4))
  for i, (algo, records) in enumerate(sorted(all_records.items())):
    color = f"C{i}"
    pts = success_of(records, "rollout/success_rate")
    if pts:
      xs, ys = zip(*pts)
      ax.plot(xs, ys, color=color, label=f"{algo}, sampled (T=1)")
    pts = success_of(records, "eval/success_rate")
    if pts:
      xs, ys = zip(*pts)
      ax.plot(xs, ys, color=color, linestyle="--", marker="o", label=f"{algo}, greedy eval (held-out)")
  ax.set_xlabel("RL step")
  ax.set_ylabel("success rate")
  ax.set_ylim(0, 1)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  ax.set_title("lookup task: success vs RL step (tiny policy, CPU)")
  fig.tight_layout()
  fig.savefig(os.path.join(out, "learning_curves.png"), dpi=100)


if __name__ == "__main__":
  app.run(main)

"""A committed record of one SFT-then-RL run (experiments/train.py with `sft.steps > 0`): its
greedy held-out success before SFT, after SFT and through RL, as a curve and a table.

  .venv/bin/python lab/report_sft_rl_run.py --workdir=runs/smol_sft_grpo \
      --out=lab/results/smollm2_arithmetic --command="nice -n 5 .venv/bin/python ..." \
      --wall_s=3600 --machine="2-core CPU shared with other jobs"

Writes <out>/metrics.jsonl and config.json (copied), <out>/curve.png and <out>/README.md.
"""

import json
import os
import shutil
import sys


from absl import app, flags  # noqa: E402

_WORKDIR = flags.DEFINE_string("workdir", None, "The run's folder (metrics.jsonl, config.json).", required=True)
_OUT = flags.DEFINE_string("out", None, "Output folder.", required=True)
_COMMAND = flags.DEFINE_string("command", "", "The command that made the run.")
_WALL = flags.DEFINE_float("wall_s", 0.0, "The run's wall time, seconds (start to end of train.py).")
_MACHINE = flags.DEFINE_string("machine", "", "The machine, in words.")
_NOTES = flags.DEFINE_string("notes", "", "A paragraph of observations for the README.")
_METRIC = flags.DEFINE_string(
  "metric",
  "success_rate",
  "The headline eval metric (a key after eval/ and rollout/ in metrics.jsonl), "
  "e.g. reward_mean (retrieval F1) or reward_metric/success (webshop reward 1.0).",
)
_METRIC_NAME = flags.DEFINE_string("metric_name", "success", "The headline metric's name in the README and curve.")

CURVES = {
  "eval/success_rate": "success, greedy eval (held-out)",
  "rollout/success_rate": "success, sampled (T=1)",
  "rollout/tool_calls_per_chain": "tool calls per chain, sampled",
  "eval/tool_calls_per_chain": "tool calls per chain, greedy eval",
}


def series(records, key):
  return [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]


def budget_table(records) -> list[str]:
  """Markdown lines: each RL step's wall time by phase (the trainer's time/* metrics) and the
  median; update = train - prepare (old/ref log-probs)."""
  steps = [r for r in records if "time/step_s" in r]
  if not steps:
    return []
  cols = ("rollout", "prepare (old/ref log-probs)", "update", "sync", "eval", "step")

  def phases(r):
    prep, train = r.get("time/prepare_s", 0.0), r.get("time/train_s", 0.0)
    return [
      r.get("time/rollout_s"),
      r.get("time/prepare_s"),
      train - prep,
      r.get("time/sync_s"),
      r.get("time/eval_s"),
      r["time/step_s"],
    ]

  rows = [phases(r) for r in steps]
  median = [
    sorted(v for v in col if v is not None)[len([v for v in col if v is not None]) // 2]
    if any(v is not None for v in col)
    else None
    for col in zip(*rows)
  ]
  cell = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
  out = [
    "",
    "Step-time budget of the RL steps (seconds, from the trainer's time/* metrics):",
    "",
    "| step | " + " | ".join(cols) + " |",
    "|---|" + "---|" * len(cols),
  ]
  out += [f"| {r['step']} | " + " | ".join(cell(v) for v in row) + " |" for r, row in zip(steps, rows)]
  out.append("| median | " + " | ".join(cell(v) for v in median) + " |")
  return out


def main(argv):
  del argv
  import agentfly_jax.metrics.plots  # noqa: F401  (headless matplotlib backend)

  os.makedirs(_OUT.value, exist_ok=True)
  for name in ("metrics.jsonl", "config.json"):
    shutil.copy(os.path.join(_WORKDIR.value, name), os.path.join(_OUT.value, name))
  with open(os.path.join(_WORKDIR.value, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f if line.strip()]
  with open(os.path.join(_WORKDIR.value, "config.json")) as f:
    config = json.load(f)
  step0 = next((r for r in records if r["step"] == 0), {})
  metric, name = _METRIC.value, _METRIC_NAME.value
  pre = step0.get(f"eval_pre_sft/{metric}")
  curve_records = list(records)
  if pre is not None:  # before SFT drawn at step -1 (the SFT phase sits between -1 and 0)
    curve_records.insert(
      0,
      {"step": -1, f"eval/{metric}": pre, "eval/tool_calls_per_chain": step0.get("eval_pre_sft/tool_calls_per_chain")},
    )
  curves = {
    f"eval/{metric}": f"{name}, greedy eval (held-out)",
    f"rollout/{metric}": f"{name}, sampled (T=1)",
    **{k: v for k, v in CURVES.items() if "success" not in k},
  }
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(7, 4))
  for key, label in curves.items():
    pts = series(curve_records, key)
    if pts:
      greedy = key.startswith("eval/")
      ax.plot(*zip(*pts), label=label, marker="o" if greedy else None, linestyle="--" if "tool" in key else "-")
  ax.axvspan(-1, 0, color="0.9", label="SFT")
  ax.set_xlabel("RL step (-1: before SFT)")
  ax.set_title(f"{config.get('name', '')}: SFT, then {config.get('algo', '')}")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(os.path.join(_OUT.value, "curve.png"), dpi=100)
  plt.close(fig)
  ev = series(records, f"eval/{metric}")
  roll = series(records, f"rollout/{metric}")
  rl_s = sum(r.get("time/step_s", 0) for r in records)
  after_sft = ev[0][1] if ev and ev[0][0] == 0 else None
  best = max(v for _, v in ev) if ev else None
  rows = [
    (f"greedy held-out {name} before SFT", pre),
    ("after SFT (RL step 0)", after_sft),
    (f"after RL (step {ev[-1][0]})" if ev else "after RL", ev[-1][1] if ev else None),
    ("best greedy eval during RL", best),
    ("RL rise (last - step 0)", ev[-1][1] - after_sft if ev and after_sft is not None else None),
    (f"sampled {name}, first 3 RL steps", sum(v for _, v in roll[:3]) / max(1, len(roll[:3]))),
    (f"sampled {name}, last 3 RL steps", sum(v for _, v in roll[-3:]) / max(1, len(roll[-3:]))),
    (
      "SFT NLL first -> last",
      f"{step0.get('sft/nll_first', float('nan')):.3f} -> {step0.get('sft/nll_last', float('nan')):.3f}",
    ),
    ("SFT wall s", step0.get("time/sft_s")),
    ("RL steps wall s (sum of time/step_s)", rl_s),
    ("run wall s (train.py start to end)", _WALL.value or None),
  ]

  def fmt(v):
    return "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))

  lines = [
    f"# {config.get('name', 'run')}: greedy held-out {name} before SFT, after SFT, through RL",
    "",
    f"Machine: {_MACHINE.value}." if _MACHINE.value else "",
    "",
    f"Command: `{_COMMAND.value}`" if _COMMAND.value else "",
    "",
    "| measure | value |",
    "|---|---|",
  ] + [f"| {k} | {fmt(v)} |" for k, v in rows]
  lines += [
    "",
    f"Greedy eval through RL (step: {name}, tool calls per chain):",
    "",
    f"| step | greedy {name} | greedy tool calls / chain |",
    "|---|---|---|",
  ]
  tools = dict(series(records, "eval/tool_calls_per_chain"))
  if pre is not None:
    lines.append(f"| before SFT | {pre:.3f} | {fmt(step0.get('eval_pre_sft/tool_calls_per_chain'))} |")
  lines += [f"| {s} | {v:.3f} | {fmt(tools.get(s))} |" for s, v in ev]
  lines += budget_table(records)
  if _NOTES.value:
    lines += ["", _NOTES.value]
  lines += [
    "",
    "Files: `metrics.jsonl` (every logged metric per step; step 0 holds `eval_pre_sft/*`, "
    "`sft/*` and the eval after SFT), `config.json` (the run's full config), `curve.png`.",
  ]
  with open(os.path.join(_OUT.value, "README.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print(open(os.path.join(_OUT.value, "README.md")).read())


if __name__ == "__main__":
  app.run(main)

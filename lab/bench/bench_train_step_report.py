"""Writes bench_train_step's results: `lab/results/<stem>.json` and a markdown table."""

from __future__ import annotations

import json
import os
from bench_common import RESULTS_DIR  # this folder is on sys.path: the script's own

RESULTS = RESULTS_DIR


def _x(v):
  return "-" if v is None else f"{v:.2f}x"


def write_results(stem: str, machine: dict, rows: list, demo: dict | None, settings: dict) -> None:
  os.makedirs(RESULTS, exist_ok=True)
  with open(os.path.join(RESULTS, f"{stem}.json"), "w") as f:
    json.dump({"machine": machine, "settings": settings, "rows": rows, "demo": demo}, f, indent=2)
  md = [
    f"# Train-step benchmark: JAX vs PyTorch + transformers\n",
    f"Machine: {machine['note']} ({machine['cpu']}); `jnp.matmul` {machine.get('matmul_n', 2048)}^2 float32 "
    f"{machine['matmul_flop_per_s_start'] / 1e9:.0f} GFLOP/s at the start, "
    f"{(machine['matmul_flop_per_s_end'] or 0) / 1e9:.0f} at the end; load average "
    f"{machine['load_avg_start'][0]:.1f} -> {machine['load_avg_end'][0]:.1f}. Wall times on a machine shared "
    "with other jobs move by 2x between minutes: compare the per-repeat ratios (frameworks interleaved) "
    "and the CPU seconds (all threads of the worker), not absolute numbers across runs.\n",
    *([machine["merged"] + "\n"] if machine.get("merged") else []),
    (
      "**Workers ran one at a time** (not interleaved: the machine had no memory for both at once), so "
      "wall ratios compare different minutes; the CPU-seconds ratio is the steadier one.\n"
      if settings.get("one_worker_at_a_time")
      else ""
    ),
    "Step: PPO-clip (0.2, dual-clip 3), token-mean, AdamW, grad-norm clip 1.0, float32, one micro-batch; "
    "`ppo` adds the critic's clipped value step. `jax` = library defaults; `jax+plain` = [B, T, V] logits "
    "and one masked attention square (the formulation before #18). FLOP/s = model FLOPs (6 x matmul params "
    "x tokens + full-square attention) / median wall. Batch: a quarter of each row is prompt; shape "
    "`BxT` = every later token trained on, `BxT agent` = 24-token actions between 40-token tool "
    "observations (~30 % of the row trained on). `torch` computes logits only from the first "
    "completion position on (TRL's `logits_to_keep`), `jax` only at the trained-on tokens "
    "(`train.logits_capacity`; `jax+cap0`: at every position).\n",
  ]
  if rows:
    md += [
      "| model | shape | step | framework | wall median s | wall min s | cpu s | vs torch (median) | "
      "vs torch per repeat | cpu vs torch | compile s | peak RSS GiB | RSS vs torch | GFLOP/s | % matmul | "
      "first loss | loss rel diff |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
      per = r.get("speedup_vs_torch_per_repeat")
      diff = r.get("loss_rel_diff_vs_torch")
      md.append(
        f"| {r['model']} | {r['shape']} | {r['step']} | {r['framework']} | {r['wall_median_s']:.2f} | "
        f"{r['wall_min_s']:.2f} | {r['cpu_median_s']:.1f} | {_x(r.get('speedup_vs_torch_median'))} | "
        f"{' '.join(f'{x:.2f}' for x in per) if per else '-'} | {_x(r.get('cpu_speedup_vs_torch'))} | "
        f"{r['compile_s']:.1f} | {r['peak_rss_bytes'] / 2**30:.2f} | {_x(r.get('peak_rss_vs_torch'))} | "
        f"{r['flop_per_s'] / 1e9:.1f} | {100 * r['fraction_of_matmul']:.0f}% | {r['first_loss']:.6f} | "
        f"{'-' if diff is None else f'{diff:.1e}'} |"
      )
  if demo:
    p = demo["packing"]
    md += [
      "",
      f"## Demo batches: packing ({p['trajectories']} trajectories, {p['useful_tokens']} real tokens)",
      "",
      "| layout | rows x T | padding | train step s (median) | useful tok/s |",
      "|---|---|---|---|---|",
    ]
    for label in ("unpacked", "packed"):
      d = p[label]
      md.append(
        f"| {label} | {d['rows']} x {d['row_len']} | {100 * d['padding_fraction']:.0f}% | "
        f"{d['wall_median_s']:.3f} | {d['useful_tok_s']:.0f} |"
      )
    cols = ["rollout", "prepare (old/ref log-probs)", "update", "sync", "eval", "step"]
    md += [
      "",
      "## Demo step-time budget (Trainer metrics, seconds, median over the steps after the first)",
      "",
      "| layout | " + " | ".join(cols) + " |",
      "|---|" + "---|" * len(cols),
    ]
    for label, b in demo["budget"].items():
      vals = [
        b.get("time/rollout_s"),
        b.get("time/prepare_s"),
        None if "time/train_s" not in b else b["time/train_s"] - b.get("time/prepare_s", 0.0),
        b.get("time/sync_s"),
        b.get("time/eval_s"),
        b.get("time/step_s"),
      ]
      md.append(f"| {label} | " + " | ".join("-" if v is None else f"{v:.2f}" for v in vals) + " |")
  with open(os.path.join(RESULTS, f"{stem}.md"), "w") as f:
    f.write("\n".join(md) + "\n")
  if machine["matmul_flop_per_s_end"]:
    print("\n".join(md))


def merge(stems: list[str], out_stem: str, note: str) -> None:
  """One results file from several runs' JSON (rows in the given order; the machine block of the
  first, its matmul rates and loads spanning all; `note` says which runs and why merged)."""
  runs = []
  for stem in stems:
    with open(os.path.join(RESULTS, f"{stem}.json")) as f:
      runs.append(json.load(f))
  machine = dict(runs[0]["machine"])
  machine["matmul_flop_per_s_end"] = runs[-1]["machine"]["matmul_flop_per_s_end"]
  machine["load_avg_end"] = runs[-1]["machine"]["load_avg_end"]
  machine["merged"] = note + " Runs: " + ", ".join(f"`{s}.json`" for s in stems) + "."
  rows = [r for run in runs for r in run["rows"]]
  settings = {"merged_from": stems, "settings": [run["settings"] for run in runs]}
  write_results(out_stem, machine, rows, None, settings)


if __name__ == "__main__":
  import argparse

  parser = argparse.ArgumentParser(description="Merge bench_train_step result files into one.")
  parser.add_argument("--merge", required=True, help="comma-separated result stems, in row order")
  parser.add_argument("--out", required=True, help="stem of the merged file")
  parser.add_argument("--note", required=True, help="why and how the runs go together")
  args = parser.parse_args()
  merge(args.merge.split(","), args.out, args.note)

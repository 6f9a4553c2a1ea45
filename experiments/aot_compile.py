"""Every program of a run, compiled ahead of time for a TPU topology on this CPU (no TPU, no weights),
or for NVIDIA GPUs (`--topology=h100:8`: no GPU either; rl/scale/aot_gpu.py, `pip install -e .[aot-gpu]`).

    python experiments/aot_compile.py --config=configs/tpu/qwen25_7b_grpo.py --topology=v5p:2x2x2
    JAX_PLATFORMS=cpu python experiments/aot_compile.py --config=configs/tpu/qwen25_7b_grpo.py --topology=h100:8
    python experiments/aot_compile.py --config=configs/lookup_ppo.py --topology=v5e:2x2 --config.mesh.fsdp=4 \
        --model=qwen2.5-0.5b --out=/tmp/aot

Builds the run's abstract policy (and critic for PPO), train state and batches with
`nnx.eval_shape` / `jax.eval_shape` on the meshes of the topology's devices
(`jax.experimental.topologies.get_topology_desc`, needs `jax[tpu]`: libtpu compiles, nothing
runs), then lowers and compiles the programs the trainer builds, with the trainer's own builders
(rl/programs.py, rl/update.py `PolicyUpdate`, sampling/decode.py):
  prepare      old (+ reference) log-probs, values, advantages over the rollout batch
  train_step   the policy step (+ the critic's for PPO) on one minibatch of micro-batches
  sft_step     the SFT warm-start step
  sampler      the JAX sampler's prefill + decode loop (KV cache) at the rollout batch
  engine_prefill / engine_decode   the paged engine's prefill chunk and block of decode steps (the jax
               sampler at the rollout's sizes; its KV cache's bytes a chip in the row: rl/scale/aot_engine.py)
  weight_sync  the copy of the params from the trainer's shardings to the sampler's
Per program and per chip: argument / output / alias / temporary bytes, the peak (args + outputs -
aliased + temps) against the chip's HBM, FLOPs, compile time -> `<out>.json` + `<out>.md`. The train
step row also has a hand-computed floor and rl/scale/memory_plan.py's estimate. A program that does not
fit exits 2 naming it, the GiB over and what would fit; bad input (topology, mesh, model) exits 1
before anything is compiled. Model shapes: `--model` = a preset (models/presets.py) or an HF
config.json (or its folder); default: the config's `model.aot_preset`, else its own model. The
work is done by agentfly_jax/rl/scale/aot.py.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys

from absl import app, flags
from ml_collections import config_flags


config_flags.DEFINE_config_file("config", None, "A run config (configs/*.py); every field is a flag.")
flags.DEFINE_string(
  "topology",
  None,
  "TPU topology <gen>:<shape>, e.g. v5e:2x2, v5p:2x2x2, v6e:2x4; "
  "or GPUs <gpu>:<count>, e.g. h100:8, h200:16 (hosts of 8).",
)
flags.DEFINE_string(
  "model", "", "A preset name (models/presets.py) or an HF config.json / folder; '' = the config's model."
)
flags.DEFINE_list(
  "programs",
  ["prepare", "train_step", "sft_step", "sampler", "engine_prefill", "engine_decode", "weight_sync"],
  "Which programs to compile.",
)
flags.DEFINE_integer("seq_len", 0, "Tokens per training row; 0 = rollout.max_total_tokens.")
flags.DEFINE_string("out", "", "Output prefix for .json / .md; '' = lab/results/aot_<config name>_<topology>.")
flags.DEFINE_float("hbm_gib", 0.0, "HBM per chip in GiB; 0 = the generation's (HBM_GIB).")
flags.DEFINE_string(
  "table", "", "Also add this report to a collected table <table>.{json,md} (e.g. lab/results/aot_tpu)."
)
flags.DEFINE_string(
  "replan",
  "",
  "Only re-estimate the memory_plan column of a collected table <replan>.{json,md} with today's "
  "rl/scale/memory_plan.py (no compile; e.g. lab/results/aot_tpu).",
)
flags.DEFINE_string(
  "images",
  "",
  "A vision-language policy's images a training row, COUNTxWIDTHxHEIGHT (e.g. 3x160x210); '' = one GUI "
  "screenshot (MiniWoB++'s 160x210 task area) a turn, rollout.max_turns of them.",
)
flags.DEFINE_string("label", "", "The report's name in --table (default: the --model preset, else the model type).")
FLAGS = flags.FLAGS

from agentfly_jax.rl.scale.aot import (  # noqa: E402
  PROGRAMS,
  BadInput,
  append_to_table,
  fit_advice,
  replan_table,
  compile_run,
  write_report,
)

GIB = 1024**3


def _commit() -> str:
  """The compiling tree's commit (short), "+dirty" with uncommitted changes to tracked files outside
  lab/results (where the tables themselves are written); "" outside a git checkout."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  status = ["git", "-C", root, "status", "--porcelain", "-uno", "--", ".", ":!lab/results"]
  try:
    head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(status, capture_output=True, text=True)
  except OSError:
    return ""
  return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def main(argv):
  del argv
  if FLAGS.replan:
    print(f"aot_compile: re-estimated {replan_table(FLAGS.replan)} rows of {FLAGS.replan}.md", flush=True)
    return
  config = FLAGS.config
  if config is None:
    raise app.UsageError("--config is required")
  from agentfly_jax.rl.spec import RunSpec

  try:
    spec = RunSpec.from_config(config)  # the config parsed once, here: the library takes the RunSpec
  except ValueError as e:
    print(f"aot_compile: {e}", file=sys.stderr, flush=True)
    sys.exit(1)
  if not FLAGS.topology:
    raise app.UsageError("--topology is required (e.g. v5e:2x2)")
  out = FLAGS.out or os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    "lab",
    "results",
    f"aot_{spec.name}_{FLAGS.topology.replace(':', '_')}",
  )
  try:
    report = compile_run(spec, FLAGS.topology, FLAGS.model, FLAGS.programs, FLAGS.seq_len, FLAGS.hbm_gib, FLAGS.images)
  except BadInput as e:
    print(f"aot_compile: {e}", file=sys.stderr, flush=True)
    sys.exit(1)
  report.update(date=datetime.date.today().isoformat(), commit=_commit())
  write_report(report, out)
  print(f"aot_compile: wrote {out}.json and {out}.md", flush=True)
  if FLAGS.table:
    append_to_table(report, FLAGS.table, FLAGS.label or FLAGS.model or spec.model.aot_preset)
    print(f"aot_compile: added to {FLAGS.table}.md", flush=True)
  over = [row for row in report["rows"] if not row["fits"]]
  if over:
    msgs = [
      f"program {row['program']} needs {row['peak_bytes'] / GIB:.2f} GiB a chip, "
      f"{(row['peak_bytes'] - row['hbm_bytes']) / GIB:.2f} GiB over the {row['hbm_bytes'] / GIB:.0f} GiB of "
      f"HBM on {report['topology']}; would fit: {fit_advice(report, row)}"
      for row in over
    ]
    print("aot_compile: DOES NOT FIT: " + " | ".join(msgs), file=sys.stderr, flush=True)
    sys.exit(2)


if __name__ == "__main__":
  app.run(main)

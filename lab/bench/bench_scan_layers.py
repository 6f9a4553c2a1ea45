"""Scanned vs unrolled decoder layers on this CPU: compile time of the GRPO train step by depth, and
the step time at one depth, both layouts in the same run (interleaved timed rounds).

    .venv/bin/python lab/bench/bench_scan_layers.py --depths=2,8,24 --step_depth=8
    -> lab/results/bench_scan_layers.{json,md}

Model: SmolLM2-135M widths (d=576, 9 heads / 3 KV heads, MLP 1536, vocab 49,152), random init,
float32, remat full, the trainer's own step (rl/core/train_step.py) on one micro-batch of B x T.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

from absl import app, flags
from bench_common import RESULTS_DIR  # this folder is on sys.path: the script's own


flags.DEFINE_list("depths", ["2", "8", "24"], "Decoder layers for the compile-time rows.")
flags.DEFINE_integer("step_depth", 8, "Decoder layers for the step-time rows.")
flags.DEFINE_string("shape", "4x256", "Micro-batch rows x tokens.")
flags.DEFINE_integer("repeats", 5, "Timed steps per layout (interleaved).")
flags.DEFINE_string("out", "", "Output prefix; '' = lab/results/bench_scan_layers.")
flags.DEFINE_integer("vocab_size", 0, "Vocabulary (0 = SmolLM2's 49,152).")
FLAGS = flags.FLAGS

SMOLLM2_WIDTHS = dict(
  vocab_size=49152,
  hidden_size=576,
  intermediate_size=1536,
  num_attention_heads=9,
  num_key_value_heads=3,
  head_dim=64,
  tie_word_embeddings=True,
)


def build(depth: int, scan: bool, b: int, t: int):
  """(jitted step, state, micro-batches) of a random-init model of `depth` layers."""
  import jax
  import numpy as np
  from flax import nnx

  from agentfly_jax.models import CausalLM, tiny_config
  from agentfly_jax.rl.core.train_state import create_train_state, make_optimizer
  from agentfly_jax.rl.core.train_step import make_train_step
  from agentfly_jax.rl.programs import default_loss_config

  widths = {**SMOLLM2_WIDTHS, **({"vocab_size": FLAGS.vocab_size} if FLAGS.vocab_size else {})}
  cfg = tiny_config("llama", num_hidden_layers=depth, scan_layers=scan, remat="full", **widths)
  graphdef, params, rest = nnx.split(CausalLM(cfg, rngs=nnx.Rngs(0)), nnx.Param, ...)
  opt = make_optimizer(lr=1e-5)
  rng = np.random.default_rng(0)
  ids = rng.integers(0, cfg.vocab_size, (1, b, t)).astype(np.int32)
  mask = np.ones((1, b, t), bool)
  batch = dict(
    input_ids=ids,
    target_ids=np.roll(ids, -1, -1),
    attention_mask=mask,
    action_mask=mask & (np.arange(t) >= t // 4),
    old_logprobs=np.full((1, b, t), -2.0, np.float32),
    advantages=rng.standard_normal((1, b, t)).astype(np.float32),
  )
  step = jax.jit(make_train_step(graphdef, rest, opt, default_loss_config(agg="token-mean")), donate_argnums=(0,))
  return step, create_train_state(params, opt), {k: jax.numpy.asarray(v) for k, v in batch.items()}


def main(argv):
  del argv
  import jax

  from bench_machine import machine as machine_line

  b, t = (int(x) for x in FLAGS.shape.split("x"))
  compile_rows = []
  for depth in [int(d) for d in FLAGS.depths]:
    for scan in (False, True):
      step, state, batch = build(depth, scan, b, t)
      t0 = time.perf_counter()
      step.lower(state, batch).compile()
      seconds = time.perf_counter() - t0
      compile_rows.append({"depth": depth, "scan_layers": scan, "compile_s": round(seconds, 2)})
      print(compile_rows[-1], flush=True)
      del step, state, batch
  runs = {scan: build(FLAGS.step_depth, scan, b, t) for scan in (False, True)}
  states = {scan: runs[scan][1] for scan in runs}
  times = {False: [], True: []}
  for scan in (False, True):  # compile + warm up
    states[scan], m = runs[scan][0](states[scan], runs[scan][2])
    jax.block_until_ready(m)
  for _ in range(FLAGS.repeats):
    for scan in (False, True):
      t0 = time.perf_counter()
      states[scan], m = runs[scan][0](states[scan], runs[scan][2])
      jax.block_until_ready((states[scan], m))
      times[scan].append(time.perf_counter() - t0)
  step_rows = [
    {
      "depth": FLAGS.step_depth,
      "scan_layers": scan,
      "shape": FLAGS.shape,
      "median_s": statistics.median(times[scan]),
      "all_s": times[scan],
    }
    for scan in (False, True)
  ]
  ratio = step_rows[1]["median_s"] / step_rows[0]["median_s"]
  report = {
    "machine": machine_line(),
    "model": f"SmolLM2-135M widths (vocabulary {FLAGS.vocab_size or 49152}), random init, float32, remat full",
    "compile": compile_rows,
    "step": step_rows,
    "scanned_over_unrolled_step_time": ratio,
  }
  out = FLAGS.out or os.path.join(RESULTS_DIR, "bench_scan_layers")
  with open(out + ".json", "w") as f:
    json.dump(report, f, indent=2)
  lines = [
    "# Scanned vs unrolled decoder layers (CPU)",
    "",
    f"Machine: {report['machine']}",
    "",
    f"{report['model']}; the GRPO train step on one {FLAGS.shape} micro-batch.",
    "",
    "| layers | unrolled compile s | scanned compile s |",
    "|---|---|---|",
  ]
  by = {(r["depth"], r["scan_layers"]): r["compile_s"] for r in compile_rows}
  for depth in [int(d) for d in FLAGS.depths]:
    lines.append(f"| {depth} | {by[depth, False]:.1f} | {by[depth, True]:.1f} |")
  lines += [
    "",
    f"Step time at {FLAGS.step_depth} layers ({FLAGS.repeats} interleaved rounds, median): unrolled "
    f"{step_rows[0]['median_s']:.3f} s, scanned {step_rows[1]['median_s']:.3f} s "
    f"(scanned / unrolled = {ratio:.2f}).",
  ]
  with open(out + ".md", "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  app.run(main)

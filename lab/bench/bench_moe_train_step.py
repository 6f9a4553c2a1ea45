"""Mixture-of-experts train step against dense models: the trainer's jitted policy step on a tiny Qwen3-MoE
and on dense Qwen3 models of the same shape, the same batches, in one process.

    PYTHONPATH=$PWD .venv/bin/python lab/bench/bench_moe_train_step.py --shapes=8x256,4x512 --repeats=5
    -> lab/results/bench_moe_train_step.{json,md}

Models (random init, float32, the same hidden size, heads, layers and vocabulary):
  moe           Qwen3-MoE: every layer sparse, `num_experts` SwiGLU experts of width `moe_intermediate_size`,
                top `top_k` (renormalised), dropless (models/moe.py: tokens sorted by expert, ragged_dot)
  dense_active  Qwen3 with intermediate_size = top_k x moe_intermediate_size: the MoE's active parameters
                per token (less its router, D x E a layer)
  dense_total   Qwen3 with intermediate_size = num_experts x moe_intermediate_size: the MoE's total
                parameters (for reference: what the experts would cost computed densely)
  moe_ragged_dot  the same MoE with every grouped matmul `jax.lax.ragged_dot` on CPU too (the A/B of
                moe.grouped_matmul's CPU branch; JAX lowers ragged_dot there to a masked dot against every expert)

The step is the trainer's (rl/core/train_step.py `make_train_step`, jitted, the state donated): the default
run's loss (`default_loss_config`: GRPO's policy loss and aggregation, log-probs at the action tokens) with
`--router_aux_coef` (the MoE's load-balancing term; the run's default is 0, router metrics computed either
way), AdamW (lr 1e-6, weight decay 0.01, global-norm clip 1.0), one micro-batch of B x T: a quarter of each
row prompt, the rest action tokens, ~1/8 of the rows end early.

Method: per shape every model's step is built and run once (the first step: compile + run), then `repeats`
rounds in which the models take turns. Reported: median / min wall ms per step, median process CPU s
(user + system, all threads), the first step's seconds and loss, and each model's median wall over
dense_active's (the MoE's row is the ratio the MoE's speed target reads: within 1.5x).
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time

from absl import app, flags
from bench_common import REPO_ROOT, RESULTS_DIR, cpu_name, load_note  # this folder is on sys.path
from bench_machine import write_results

flags.DEFINE_list("shapes", ["8x256", "4x512"], "BxT micro-batch shapes")
flags.DEFINE_list("models", ["moe", "dense_active", "dense_total"], "moe | dense_active | dense_total | moe_ragged_dot")
flags.DEFINE_integer("hidden_size", 256, "model width")
flags.DEFINE_integer("num_layers", 2, "decoder layers (every one sparse in the MoE)")
flags.DEFINE_integer("num_heads", 4, "attention heads")
flags.DEFINE_integer("num_kv_heads", 2, "key / value heads")
flags.DEFINE_integer("head_dim", 64, "per-head width")
flags.DEFINE_integer("vocab_size", 4096, "vocabulary (tied embeddings)")
flags.DEFINE_integer("num_experts", 8, "experts per sparse layer")
flags.DEFINE_integer("top_k", 2, "experts per token")
flags.DEFINE_integer("moe_intermediate_size", 256, "each expert's SwiGLU width")
flags.DEFINE_float("router_aux_coef", 0.0, "loss.router_aux_coef of the MoE step (0: the run's default)")
flags.DEFINE_integer("repeats", 5, "timed rounds, the models taking turns")
flags.DEFINE_string("out", os.path.join(RESULTS_DIR, "bench_moe_train_step"), "output prefix (.json, .md)")
FLAGS = flags.FLAGS
LR, WEIGHT_DECAY, MAX_GRAD_NORM = 1e-6, 0.01, 1.0


def model_config(name: str):
  from agentfly_jax.models import tiny_config

  shared = {
    "vocab_size": FLAGS.vocab_size,
    "hidden_size": FLAGS.hidden_size,
    "num_hidden_layers": FLAGS.num_layers,
    "num_attention_heads": FLAGS.num_heads,
    "num_key_value_heads": FLAGS.num_kv_heads,
    "head_dim": FLAGS.head_dim,
    "max_position_embeddings": 4096,
  }
  m, k, e = FLAGS.moe_intermediate_size, FLAGS.top_k, FLAGS.num_experts
  if name in ("moe", "moe_ragged_dot"):
    return tiny_config(
      "qwen3_moe", num_experts=e, num_experts_per_tok=k, moe_intermediate_size=m, intermediate_size=k * m, **shared
    )
  if name == "dense_active":
    return tiny_config("qwen3", intermediate_size=k * m, **shared)
  if name == "dense_total":
    return tiny_config("qwen3", intermediate_size=e * m, **shared)
  raise ValueError(f"--models: unknown model {name!r} (moe, dense_active, dense_total, moe_ragged_dot)")


def param_counts(params, cfg) -> tuple[int, int]:
  """(total parameters, parameters a token uses: the experts' counted at top_k / num_experts)."""
  import jax

  total = experts = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    total += leaf.size
    if "experts" in jax.tree_util.keystr(path):
      experts += leaf.size
  active = total - experts + experts * cfg.num_experts_per_tok // max(cfg.num_experts, 1)
  return total, active


def make_batch(vocab: int, b: int, t: int, seed: int = 0) -> dict:
  """The target-aligned [B, T] arrays the step reads: the first quarter of a row is prompt, the rest
  action tokens; ~1/8 of the rows end early (padding)."""
  import numpy as np

  rng = np.random.default_rng(seed)
  ids = rng.integers(1, vocab, (b, t + 1)).astype(np.int32)
  lengths = np.where(rng.random(b) < 0.125, rng.integers(t // 2, t + 1, b), t)
  attn = np.arange(t)[None] < lengths[:, None]
  action = attn & (np.arange(t)[None] >= t // 4)
  return {
    "input_ids": ids[:, :-1],
    "target_ids": ids[:, 1:],
    "attention_mask": attn,
    "action_mask": action,
    "old_logprobs": np.where(action, -rng.random((b, t)) * 2 - 7.5, 0).astype(np.float32),
    "advantages": np.where(action, rng.normal(size=(b, t)), 0).astype(np.float32),
  }


class Step:
  """One model's jitted policy step, its donated train state and its micro-batch."""

  def __init__(self, name: str, b: int, t: int):
    import jax
    import numpy as np
    from flax import nnx

    from agentfly_jax.models import CausalLM
    from agentfly_jax.rl.batching import to_microbatches
    from agentfly_jax.rl.core.train_state import create_train_state, make_optimizer
    from agentfly_jax.rl.core.train_step import make_train_step
    from agentfly_jax.rl.programs import default_loss_config

    cfg = model_config(name)
    graphdef, params, rest = nnx.split(CausalLM(cfg, rngs=nnx.Rngs(0)), nnx.Param, ...)
    self.params_total, self.params_active = param_counts(params, cfg)
    opt = make_optimizer(lr=LR, weight_decay=WEIGHT_DECAY, max_grad_norm=MAX_GRAD_NORM)
    loss = default_loss_config(router_aux_coef=FLAGS.router_aux_coef if name.startswith("moe") else 0.0)
    self.fn = jax.jit(make_train_step(graphdef, rest, opt, loss), donate_argnums=(0,))
    self.state = create_train_state(params, opt)
    self.ragged_dot, self.traced = name == "moe_ragged_dot", False
    batch = make_batch(cfg.vocab_size, b, t)
    self.mb = {k: jax.numpy.asarray(v) for k, v in to_microbatches(batch, np.arange(b), b).items()}

  def run(self) -> tuple[float, float, float]:
    """One step: (wall s, process CPU s, the step's policy loss)."""
    import jax

    from agentfly_jax.models import moe

    c0, t0 = os.times(), time.perf_counter()
    if self.ragged_dot and not self.traced:  # the first call traces the step: ragged_dot in every expert projection
      own, moe.grouped_matmul = (
        moe.grouped_matmul,
        lambda x, w, sizes, precision=None: jax.lax.ragged_dot(x, w, sizes, precision=precision),
      )
      try:
        self.state, metrics = self.fn(self.state, self.mb)
      finally:
        moe.grouped_matmul = own
    else:
      self.state, metrics = self.fn(self.state, self.mb)
    self.traced = True
    loss = float(jax.block_until_ready(metrics["actor/pg_loss"]))
    c1 = os.times()
    return time.perf_counter() - t0, (c1.user - c0.user) + (c1.system - c0.system), loss


def time_shape(shape: str) -> list[dict]:
  """Every model's rows at one B x T shape: built, first step, then interleaved timed rounds."""
  b, t = (int(x) for x in shape.split("x"))
  steps = {name: Step(name, b, t) for name in FLAGS.models}
  first = {name: step.run() for name, step in steps.items()}
  runs = {name: [] for name in steps}
  for _ in range(FLAGS.repeats):
    for name, step in steps.items():
      runs[name].append(step.run())
  rows = []
  for name, rs in runs.items():
    walls = [r[0] for r in rs]
    rows.append(
      {
        "shape": shape,
        "model": name,
        "params_total": steps[name].params_total,
        "params_active": steps[name].params_active,
        "wall_median_ms": 1e3 * statistics.median(walls),
        "wall_min_ms": 1e3 * min(walls),
        "wall_all_ms": [1e3 * w for w in walls],
        "cpu_median_s": statistics.median(r[1] for r in rs),
        "first_step_s": first[name][0],
        "first_loss": first[name][2],
      }
    )
  ref = next((r for r in rows if r["model"] == "dense_active"), None)
  for r in rows:
    if ref is not None:
      r["over_dense_active"] = r["wall_median_ms"] / ref["wall_median_ms"]
      r["over_dense_active_per_round"] = [a / b for a, b in zip(r["wall_all_ms"], ref["wall_all_ms"])]
  print("\n".join(f"{shape} {r['model']}: {r['wall_median_ms']:.1f} ms" for r in rows), flush=True)
  return rows


SETTINGS = [
  "shapes",
  "models",
  "hidden_size",
  "num_layers",
  "num_heads",
  "num_kv_heads",
  "head_dim",
  "vocab_size",
  "num_experts",
  "top_k",
  "moe_intermediate_size",
  "router_aux_coef",
  "repeats",
]


def markdown(result: dict) -> str:
  s, m = result["settings"], result["machine"]
  models = (
    f"Models: hidden {s['hidden_size']}, {s['num_layers']} layers, {s['num_heads']} heads / {s['num_kv_heads']} KV "
    f"of {s['head_dim']}, vocab {s['vocab_size']}; MoE {s['num_experts']} experts of width "
    f"{s['moe_intermediate_size']}, top {s['top_k']}, router_aux_coef {s['router_aux_coef']}; dense_active MLP "
    f"{s['top_k'] * s['moe_intermediate_size']}, dense_total MLP {s['num_experts'] * s['moe_intermediate_size']}. "
    f"The trainer's policy step (GRPO's loss, AdamW), float32, {s['repeats']} interleaved rounds after a first step."
  )
  header = "| shape | model | params | active / token | median ms | min ms | CPU s | first step s | first loss | / dense_active |"
  lines = [
    f"# MoE train step vs dense ({result['date']}, commit {result['commit']})",
    "",
    f"Machine: {m['cpu']}; {m['note']}.",
    models,
    "",
    header,
    "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in result["rows"]:
    ratio = f"{r['over_dense_active']:.2f}x" if "over_dense_active" in r else ""
    lines.append(
      f"| {r['shape']} | {r['model']} | {r['params_total'] / 1e6:.2f} M | {r['params_active'] / 1e6:.2f} M | "
      f"{r['wall_median_ms']:.1f} | {r['wall_min_ms']:.1f} | {r['cpu_median_s']:.3f} | {r['first_step_s']:.1f} | "
      f"{r['first_loss']:.5f} | {ratio} |"
    )
  moe = [r for r in result["rows"] if r["model"] == "moe" and "over_dense_active" in r]
  if moe:
    ratios = ", ".join(f"{r['shape']} {r['over_dense_active']:.2f}x" for r in moe)
    lines += ["", f"MoE / dense_active (median wall): {ratios}"]
  return "\n".join(lines) + "\n"


def main(argv):
  del argv
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  load_start = os.getloadavg()
  rows = [row for shape in FLAGS.shapes for row in time_shape(shape)]
  git = ["git", "rev-parse", "--short", "HEAD"]
  commit = subprocess.run(git, cwd=REPO_ROOT, capture_output=True, text=True, check=False).stdout.strip()
  machine = {
    "platform": platform.platform(),
    "cpu": cpu_name(),
    "cpus": os.cpu_count(),
    "load_avg_start": load_start,
    "load_avg_end": os.getloadavg(),
    "note": load_note(load_start[0]),
  }
  result = {
    "date": time.strftime("%Y-%m-%d", time.gmtime()),
    "commit": commit or "unknown",
    "machine": machine,
    "settings": {name: FLAGS[name].value for name in SETTINGS},
    "rows": rows,
  }
  write_results(FLAGS.out, result, markdown(result))


if __name__ == "__main__":
  app.run(main)

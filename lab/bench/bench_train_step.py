"""Train-step benchmark: our jitted PPO-clip step vs the same maths in PyTorch + transformers.

    .venv/bin/python lab/bench/bench_train_step.py --models=tiny,smollm2 \
        --shapes=8x256,4x512,16x128,1x2048 --frameworks=jax,jax+plain,torch --steps=policy,ppo

One policy step: forward on tokens[:, :-1], log-prob of each next token (temperature 1), PPO-clip
(clip 0.2/0.2, dual-clip 3) over the action tokens, token-mean, entropy as a metric, backward,
global-norm clipping to 1.0, AdamW (lr 1e-6, weight decay 0.01), float32. `ppo` adds the critic's
clipped value-loss step on a value-head model with the same trunk (what the trainer runs for
PPO). Same weights (an HF folder both load), same batch (numpy, seeded), one micro-batch.

Frameworks: `jax` (the library's defaults), `jax+plain` (the same step with the earlier
formulation: [B, T, V] logits and one masked [B, H, T, T] attention square, for the A/B),
`jax+KNOBS` (A/B variants, see `parse_variant`: e.g. `jax+ac256`, `jax+lc1024`, `jax+remat1`),
`torch` (transformers' model, eager, its default attention; logits only from the first completion
position on, TRL's `logits_to_keep`; torch_reference_step.py, with the worker loop both run in).
`--layout=agent`: actions between tool observations, so ~30 % of each row is trained on (the JAX
step's log-probs then run at those tokens only).

Method: each (model, shape, framework) runs in its own worker process (so peak RSS is that
shape's), built and compiled once; the parent then times `repeats` rounds in which the
frameworks take turns. Reported: median and minimum wall seconds, the process CPU seconds of the
step (user + system over all threads: less sensitive to other jobs on a shared machine than the
wall), compile (first-step) time, peak RSS, model FLOPs (6 x matmul params x tokens + attention,
full square) per second and as a fraction of `jnp.matmul`'s rate (`--matmul_n`^2 float32, measured in
the same run), and the first step's loss in each framework.

`--demo`: on real batches of the README demo (the lookup task's warm start, one rollout), the
train step unpacked vs packed (`rl/packing.py`): padding fraction and useful (non-padding)
tokens/s; and the demo's end-to-end step-time budget (rollout / old + ref log-probs / train /
sync / eval) from `Trainer.train` metrics.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time

from absl import app, flags

from bench_common import (
  REPO_ROOT,
  SMOLLM2_135M_SHAPES,
  XLA_CPU_VARIANTS,
  cpu_name,
  load_note,
  measure_matmul_rate,
  xla_flags_env,
)
from torch_reference_step import (  # the PyTorch reference step, the worker loop and its handle
  CLIP,
  DUAL_CLIP,
  LR,
  MAX_GRAD_NORM,
  VALUE_CLIP,
  WEIGHT_DECAY,
  TorchStep,
  Worker,
  serve_steps,
  value_head,
)

FLAGS = flags.FLAGS
flags.DEFINE_list(
  "models",
  ["tiny", "smollm2"],
  "tiny | smollm2 (shipped weights) | smollm2_random "
  "(same shapes, random init; with --num_layers for scaled-down A/Bs)",
)
flags.DEFINE_integer("num_layers", 0, "smollm2_random: decoder layers (0 = SmolLM2's 30)")
flags.DEFINE_list("shapes", ["8x256", "4x512", "16x128", "1x2048"], "BxT batch shapes")
flags.DEFINE_list("frameworks", ["jax", "jax+plain", "torch"], "jax | jax+plain | torch")
flags.DEFINE_list("steps", ["policy", "ppo"], "policy (PPO-clip actor step) | ppo (actor + critic step)")
flags.DEFINE_integer("repeats", 3, "interleaved timed repetitions")
flags.DEFINE_integer("matmul_n", 2048, "the machine's matmul rate (start and end of the run): n x n float32")
flags.DEFINE_enum(
  "layout",
  "prompt",
  ["prompt", "agent"],
  "which tokens are trained on: prompt = the first "
  "quarter of each row is prompt, the rest action tokens; agent = a quarter prompt, then "
  "24-token actions between 40-token tool observations (~30 %% of the row trained on)",
)
flags.DEFINE_bool(
  "one_worker_at_a_time",
  False,
  "each framework's worker runs all its repeats alone, then exits "
  "(for machines without memory for all workers at once; ratios are then not interleaved)",
)
flags.DEFINE_bool("demo", False, "also: packing on the demo's real batches + the demo's step-time budget")
flags.DEFINE_integer("demo_steps", 3, "trainer steps timed for the demo budget")
flags.DEFINE_bool("bench", True, "run the framework comparison (off: only --demo)")
flags.DEFINE_string("out", "bench_train_step", "result file stem in lab/results/")
flags.DEFINE_string("work_dir", "/dev/shm/bench_train_step", "scratch folder for random models' HF files")
flags.DEFINE_string("serve", "", "internal: run as the MODEL:SHAPE:FRAMEWORK worker")


# ---------------------------------------------------------------- shared inputs
def model_config(name: str):
  from agentfly_jax.models import ModelConfig, smollm2_folder, tiny_config

  if name == "tiny":
    return tiny_config("qwen2", vocab_size=2048, tie_word_embeddings=False, max_position_embeddings=4096)
  if name == "smollm2_random":
    return ModelConfig(**{**SMOLLM2_135M_SHAPES, "num_hidden_layers": FLAGS.num_layers or 30})
  if name == "smollm2":
    with open(os.path.join(smollm2_folder(), "config.json")) as f:
      return ModelConfig.from_hf_dict(json.load(f))
  raise ValueError(f"--models: unknown model {name!r} (tiny, smollm2, smollm2_random)")


def model_folder(name: str) -> str:
  """The HF folder both frameworks load (random models are saved once)."""
  from flax import nnx

  from agentfly_jax.models import CausalLM, save_pretrained, smollm2_folder

  if name == "smollm2":
    return smollm2_folder()
  folder = os.path.join(FLAGS.work_dir, f"{name}_{FLAGS.num_layers}")
  if not os.path.exists(os.path.join(folder, "config.json")):
    save_pretrained(CausalLM(model_config(name), rngs=nnx.Rngs(0)), folder)
  return folder


ACTION_TOKENS, OBSERVATION_TOKENS = 24, 40  # the agent layout's turns


def make_batch(vocab: int, b: int, t: int, seed: int = 0, layout: str = "prompt") -> dict:
  """Numpy batch [B, T]: ~1/8 of rows end early (padding), the first quarter is prompt; layout
  "prompt": every later token is an action token; "agent": ACTION_TOKENS-long actions alternate
  with OBSERVATION_TOKENS-long tool observations (not trained on) after the prompt."""
  import numpy as np

  rng = np.random.default_rng(seed)
  ids = rng.integers(1, vocab, (b, t)).astype(np.int32)
  lengths = np.where(rng.random(b) < 0.125, rng.integers(t // 2, t + 1, b), t)
  attn = np.arange(t)[None] < lengths[:, None]
  pos = np.arange(t)[None]
  action = attn & (pos >= t // 4)
  if layout == "agent":
    action &= (pos - t // 4) % (ACTION_TOKENS + OBSERVATION_TOKENS) < ACTION_TOKENS
  f = lambda x: np.where(action, x, 0).astype(np.float32)  # noqa: E731
  return {
    "token_ids": ids,
    "attention_mask": attn,
    "action_mask": action,
    "old_logprobs": f(-rng.random((b, t)) * 2 - 9.5),
    "advantages": f(rng.normal(size=(b, t))),
    "returns": f(rng.normal(size=(b, t))),
    "old_values": f(rng.normal(size=(b, t)) * 0.1),
  }


def target_aligned(batch: dict) -> dict:
  """The [B, T] token-aligned batch as the JAX step reads it ([B, T-1], rl.batching.train_arrays'
  layout): input_ids[t] = token t predicts target_ids[t] = token t+1; masks and per-token values
  of the targets."""
  out = {
    "input_ids": batch["token_ids"][:, :-1],
    "target_ids": batch["token_ids"][:, 1:],
    "attention_mask": batch["attention_mask"][:, :-1],
  }
  for k in ("action_mask", "old_logprobs", "advantages", "returns", "old_values"):
    out[k] = batch[k][:, 1:]
  return out


def step_flops(cfg, b: int, t: int, step: str) -> float:
  """Model FLOPs of one step: 6 x matmul params x tokens + attention (full square, fwd + bwd)."""
  d, layers = cfg.hidden_size, cfg.num_hidden_layers
  q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
  per_layer = d * (q + 2 * kv) + q * d + 3 * d * cfg.intermediate_size
  tokens = b * (t - 1)
  attn = 12 * layers * q * (t - 1) * tokens
  policy = 6 * tokens * (layers * per_layer + cfg.vocab_size * d) + attn
  critic = 6 * tokens * (layers * per_layer + d) + attn
  return policy + (critic if step == "ppo" else 0)


# ---------------------------------------------------------------- workers
VARIANT_KNOBS = {
  "lc": ("loss", "logits_chunk"),
  "ac": ("model", "attention_chunk"),
  "remat": ("model", "remat"),
  "prec": ("model", "matmul_precision"),
  "xla": ("env", "xla"),
  "fuse": ("model", "fuse_projections"),
  "attn": ("model", "attention_impl"),
  "cap": ("loss", "logits_capacity"),
  "wgrad": ("env", "wgrad"),
  "scan": ("model", "scan_layers"),
}


def parse_variant(variant: str) -> tuple[dict, dict, str]:
  """'' (defaults) | 'plain' (= lc0_ac0) | '_'-joined knobs, e.g. 'lc0_ac256', 'remat1', 'precdefault':
  lcN LossConfig.logits_chunk, acN ModelConfig.attention_chunk, remat0/1, prec<name> matmul_precision,
  fuse0/1 ModelConfig.fuse_projections, scan0/1 ModelConfig.scan_layers, attn<flash|checkpoint> ModelConfig.attention_impl,
  capN LossConfig.logits_capacity = N / 100 (cap0: log-probs at every position),
  wgradautodiff (bench only: `cpu_kernels.dense` replaced by a plain dot_general differentiated by
  JAX, the formulation before its written-out backward),
  xla<name> the worker's XLA_FLAGS (bench_common.XLA_CPU_VARIANTS: xlanoynn, xlaonednn, ...).
  Returns (model overrides, loss overrides, XLA variant name or '', 'autodiff' or '')."""
  out = {"model": {}, "loss": {}, "env": {}}
  for knob in ("lc0_ac0" if variant == "plain" else variant).split("_") if variant else []:
    key = next((k for k in VARIANT_KNOBS if knob.startswith(k)), None)
    if key is None:
      raise ValueError(
        f"--frameworks: unknown jax variant knob {knob!r} (plain, lcN, acN, remat0|1, prec<name>, "
        f"fuse0|1, scan0|1, attn<flash|checkpoint>, capN, wgradautodiff, "
        f"xla<{'|'.join(XLA_CPU_VARIANTS)}>)"
      )
    where, field = VARIANT_KNOBS[key]
    value = knob[len(key) :]
    if key == "xla" and value not in XLA_CPU_VARIANTS:
      raise ValueError(f"--frameworks: unknown XLA variant {knob!r} (xla<{'|'.join(XLA_CPU_VARIANTS)}>)")
    if key == "wgrad" and value != "autodiff":
      raise ValueError(f"--frameworks: unknown knob {knob!r} (wgradautodiff)")
    out[where][field] = (
      value
      if key in ("prec", "xla", "attn", "wgrad")
      else int(value) / 100
      if key == "cap"
      else (bool(int(value)) if key in ("remat", "fuse", "scan") else int(value))
    )
  return out["model"], out["loss"], out["env"].get("xla", ""), out["env"].get("wgrad", "")


def worker_env(framework: str) -> dict | None:
  """The worker's environment: framework 'jax+...xla<name>...' adds that XLA variant's flags."""
  if not framework.startswith("jax+"):
    return None
  xla = parse_variant(framework.split("+", 1)[1])[2]
  return xla_flags_env(xla) if xla else None


class JaxStep:
  """Holds what the steps need and no more, as TorchStep does: the policy's params (the model
  object is dropped after the split), a critic only when a `ppo` step is timed, and one train
  state per step (the first takes the loaded params, later ones a copy)."""

  def __init__(self, name: str, b: int, t: int, variant: str):
    import jax
    import numpy as np
    from flax import nnx

    from agentfly_jax.models import Critic, from_pretrained
    from agentfly_jax.rl.batching import to_microbatches
    from agentfly_jax.rl.core.train_state import create_train_state, make_optimizer
    from agentfly_jax.rl.core.train_step import make_train_step
    from agentfly_jax.rl.programs import default_loss_config

    model_overrides, loss_overrides, _, wgrad = parse_variant(variant)
    if wgrad == "autodiff":  # the A/B of cpu_kernels.dense's written-out backward
      from agentfly_jax.models import cpu_kernels

      cpu_kernels.dense = cpu_kernels.plain_dense
    model = from_pretrained(model_folder(name), **model_overrides)
    critic = None
    if "ppo" in FLAGS.steps:
      critic = Critic.from_causal_lm(model)
      critic.score.kernel.set_value(jax.numpy.asarray(value_head(model.config.hidden_size))[:, None])
    fixed = dict(agg="token-mean", clip_low=CLIP, clip_high=CLIP, dual_clip=DUAL_CLIP, value_clip=VALUE_CLIP)
    loss_cfg = default_loss_config(**{**fixed, **loss_overrides})  # token-mean: the PyTorch reference's
    opt = make_optimizer(lr=LR, weight_decay=WEIGHT_DECAY, max_grad_norm=MAX_GRAD_NORM)
    g, p, r = nnx.split(model, nnx.Param, ...)
    cg, cp, cr = nnx.split(critic, nnx.Param, ...) if critic is not None else (None, None, None)
    vocab = model.config.vocab_size
    del model, critic  # the states below own the weights (donated to each step)
    batch = target_aligned(make_batch(vocab, b, t, layout=FLAGS.layout))
    self.mb = {k: jax.numpy.asarray(v) for k, v in to_microbatches(batch, np.arange(b), b).items()}
    self.fns, self.states = {}, {}
    copy = lambda tree: jax.tree.map(lambda x: x.copy() if hasattr(x, "copy") else x, tree)  # noqa: E731
    for i, step in enumerate(FLAGS.steps):
      with_critic = step == "ppo"
      fn = make_train_step(
        g, r, opt, loss_cfg, **(dict(critic_graphdef=cg, critic_rest=cr, critic_optimizer=opt) if with_critic else {})
      )
      self.fns[step] = jax.jit(fn, donate_argnums=(0,))
      self.states[step] = create_train_state(
        p if i == 0 else copy(p),
        opt,
        critic_params=(cp if with_critic else None),
        critic_optimizer=opt if with_critic else None,
      )

  def run(self, step: str) -> dict:
    import jax

    self.states[step], m = self.fns[step](self.states[step], self.mb)
    jax.block_until_ready((self.states[step], m))
    out = {"loss": float(m["actor/pg_loss"])}
    if "critic/vf_loss" in m:
      out["vf_loss"] = float(m["critic/vf_loss"])
    return out


def serve(spec: str) -> None:
  """Worker process for MODEL:SHAPE:FRAMEWORK: builds that framework's step, then serves it
  (torch_reference_step.serve_steps)."""
  name, shape, framework = spec.split(":")
  b, t = (int(x) for x in shape.split("x"))
  if framework == "torch":
    import torch

    torch.set_num_threads(os.cpu_count())
    runner = TorchStep(
      model_folder(name), b, t, make_batch=make_batch, critic="ppo" in FLAGS.steps, layout=FLAGS.layout
    )
  else:
    runner = JaxStep(name, b, t, framework.split("+", 1)[1] if "+" in framework else "")
  serve_steps(runner, FLAGS.steps)


def start_worker(spec: str, steps: list[str]) -> Worker:
  """A worker process of this script for MODEL:SHAPE:FRAMEWORK timing `steps` (this run's
  layout, layers and work folder; a `jax+...xla<name>` framework's XLA flags)."""
  flags_ = [f"--layout={FLAGS.layout}", f"--num_layers={FLAGS.num_layers}", f"--work_dir={FLAGS.work_dir}"]
  return Worker(os.path.abspath(__file__), spec, steps, flags_, env=worker_env(spec.rsplit(":", 1)[1]))


# ---------------------------------------------------------------- the comparison
def compare(matmul_rate: float, on_shape=None) -> list[dict]:
  """Every (model, shape): workers per framework, interleaved repeats -> result rows (with the
  ratios against torch). `on_shape(rows)` is called after each shape (partial results)."""
  rows = []
  for name in FLAGS.models:
    cfg = model_config(name)
    model_folder(name)
    for shape in FLAGS.shapes:
      b, t = (int(x) for x in shape.split("x"))
      workers, times, mem = {}, {(fw, s): [] for fw in FLAGS.frameworks for s in FLAGS.steps}, {}
      # One worker per (framework, step), so each holds only that step's models and state (a
      # `ppo` worker: policy + critic; a `policy` worker: the policy alone) and peak RSS is the
      # step's. Interleaved: the frameworks' workers of a step are alive together and take turns
      # each repeat; --one_worker_at_a_time (memory-tight machines): each worker runs all its
      # repeats alone, then exits.
      for s in FLAGS.steps:
        groups = [[fw] for fw in FLAGS.frameworks] if FLAGS.one_worker_at_a_time else [list(FLAGS.frameworks)]
        for group in groups:
          live = {}
          try:
            for fw in group:
              t0 = time.perf_counter()
              live[fw] = workers[fw, s] = start_worker(f"{name}:{shape}:{fw}", [s])
              print(
                f"{name} {shape} {s} {fw}: ready in {time.perf_counter() - t0:.0f} s "
                f"(first step {json.dumps(live[fw].ready['first'])})",
                flush=True,
              )
            for rep in range(FLAGS.repeats):
              for fw, w in live.items():
                times[fw, s].append(w.ask(f"run {s}"))
              print(
                f"{name} {shape} {s} repeat {rep + 1}: "
                + "; ".join(
                  f"{fw} {times[fw, s][-1]['wall']:.2f}s wall {times[fw, s][-1]['cpu']:.2f}s cpu" for fw in live
                ),
                flush=True,
              )
            mem.update({(fw, s): w.ask("mem")["peak_rss"] for fw, w in live.items()})
          finally:
            for w in live.values():
              w.close()
      for (fw, s), runs in times.items():
        wall = [r["wall"] for r in runs]
        cpu = [r["cpu"] for r in runs]
        flops = step_flops(cfg, b, t, s)
        first = workers[fw, s].ready["first"][s]
        label = shape if FLAGS.layout == "prompt" else f"{shape} {FLAGS.layout}"
        rows.append(
          {
            "model": name,
            "shape": label,
            "layout": FLAGS.layout,
            "step": s,
            "framework": fw,
            "wall_median_s": statistics.median(wall),
            "wall_min_s": min(wall),
            "wall_all_s": wall,
            "cpu_median_s": statistics.median(cpu),
            "cpu_all_s": cpu,
            "compile_s": first["compile_s"],
            "first_loss": first["loss"],
            "first_vf_loss": first.get("vf_loss"),
            "peak_rss_bytes": mem[fw, s],
            "rss_after_load_bytes": workers[fw, s].ready["rss_loaded"],
            "model_flops": flops,
            "flop_per_s": flops / statistics.median(wall),
            "fraction_of_matmul": flops / statistics.median(wall) / matmul_rate,
            "flop_per_s_best": flops / min(wall),
          }
        )
      if on_shape is not None:
        on_shape(with_ratios(rows))
  return with_ratios(rows)


def with_ratios(rows: list[dict]) -> list[dict]:
  """Adds each row's ratios against the torch row of the same model, shape and step."""
  for r in rows:
    ref = [
      o
      for o in rows
      if (o["model"], o["shape"], o["step"], o["framework"]) == (r["model"], r["shape"], r["step"], "torch")
    ]
    if ref:
      o = ref[0]
      r["speedup_vs_torch_median"] = o["wall_median_s"] / r["wall_median_s"]
      r["speedup_vs_torch_min"] = o["wall_min_s"] / r["wall_min_s"]
      r["speedup_vs_torch_per_repeat"] = [a / b for a, b in zip(o["wall_all_s"], r["wall_all_s"])]
      r["cpu_speedup_vs_torch"] = o["cpu_median_s"] / r["cpu_median_s"]
      r["loss_rel_diff_vs_torch"] = abs(r["first_loss"] - o["first_loss"]) / max(abs(o["first_loss"]), 1e-12)
      r["peak_rss_vs_torch"] = r["peak_rss_bytes"] / o["peak_rss_bytes"]
  return rows


# ---------------------------------------------------------------- the demo: packing + budget
def demo() -> dict:
  """Real demo batches: train step unpacked vs packed, and the trainer's step-time budget."""
  import tempfile

  import jax
  import numpy as np

  from agentfly_jax.rl.batching import micro_batch_layout, to_microbatches
  from agentfly_jax.rl.config import lookup_config
  from agentfly_jax.rl.packing import pack_batch, padding_fraction
  from agentfly_jax.rl.run import rows_at
  from agentfly_jax.rl.trainer import Trainer

  root = REPO_ROOT
  c = lookup_config("grpo", os.path.join(root, "experiments", "results", "lookup_warmstart"))
  c.train.steps, c.eval.every, c.eval.num_rows, c.log.progress, c.log.tensorboard = FLAGS.demo_steps, 0, 0, False, False
  c.checkpoint.every = 10**6
  out = {}
  with tempfile.TemporaryDirectory() as wd:
    tr = Trainer(c, wd)
    params = tr.run.parts.policy.params
    tr.run.weights.load(params)
    trajs = tr.rollout(rows_at(tr.run, 0, c.rollout.rows_per_step), seed=1)
    from agentfly_jax.rl.batching import train_arrays
    from agentfly_jax.rl.core.train_state import create_train_state

    arrays = train_arrays(trajs, pad_id=tr.run.parts.tokenizer.pad_token_id)
    batch, _ = tr.run.update.prepare(params, None, None, tr.run.update.put_arrays(arrays))
    batch = {k: np.asarray(v) for k, v in jax.device_get(batch).items()}
    size, num = micro_batch_layout(len(trajs), c.train.micro_batch_size)
    plain = to_microbatches(batch, np.arange(len(trajs)), size, num)
    packed_rows, _ = pack_batch(batch)
    packed = to_microbatches(packed_rows, np.arange(len(packed_rows["input_ids"])), size, 1)
    from agentfly_jax.rl.core.train_step import make_train_step

    useful = int(batch["attention_mask"].sum())
    timing = {}
    for label, mb in (("unpacked", plain), ("packed", packed)):
      fn = jax.jit(
        make_train_step(tr.run.parts.policy.graphdef, tr.run.parts.policy.rest, tr.run.optimizer, tr.run.loss_cfg)
      )
      st = create_train_state(jax.tree.map(jax.numpy.copy, params), tr.run.optimizer)
      st, m = fn(st, mb)
      jax.block_until_ready(m)
      timing[label] = {"fn": fn, "state": st, "mb": mb, "wall": [], "loss": float(m["actor/pg_loss"])}
    for _ in range(max(3, FLAGS.repeats)):
      for label, d in timing.items():
        t0 = time.perf_counter()
        d["state"], m = d["fn"](d["state"], d["mb"])
        jax.block_until_ready(m)
        d["wall"].append(time.perf_counter() - t0)
    out["packing"] = {
      label: {
        "rows": int(np.prod(d["mb"]["input_ids"].shape[:2])),
        "row_len": int(d["mb"]["input_ids"].shape[2]),
        "padding_fraction": padding_fraction(d["mb"]["attention_mask"]),
        "wall_median_s": statistics.median(d["wall"]),
        "wall_all_s": d["wall"],
        "useful_tok_s": useful / statistics.median(d["wall"]),
        "first_loss": d["loss"],
      }
      for label, d in timing.items()
    }
    out["packing"]["trajectories"] = len(trajs)
    out["packing"]["useful_tokens"] = useful
    budget = {}
    for packed_flag in (False, True):
      c2 = c.copy_and_resolve_references()
      c2.train.pack_sequences = packed_flag
      c2.eval.every, c2.eval.num_rows = FLAGS.demo_steps, 16
      with tempfile.TemporaryDirectory() as wd2:
        records = Trainer(c2, wd2).train()
      steps = [r for r in records if r.get("step", 0) > 1 and "time/step_s" in r]  # step 1 compiles
      keys = sorted({k for r in steps for k in r if k.startswith("time/")})
      budget["packed" if packed_flag else "unpacked"] = {
        k: statistics.median([r[k] for r in steps if k in r]) for k in keys
      }
    out["budget"] = budget
  return out


def main(argv):
  del argv
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  if FLAGS.serve:
    serve(FLAGS.serve)
    return
  from bench_train_step_report import write_results  # this folder is on sys.path

  load_start = os.getloadavg()
  rate = measure_matmul_rate(FLAGS.matmul_n)
  print(f"jnp.matmul {FLAGS.matmul_n}^2 float32: {rate / 1e9:.1f} GFLOP/s", flush=True)
  settings = {
    "models": FLAGS.models,
    "shapes": FLAGS.shapes,
    "frameworks": FLAGS.frameworks,
    "steps": FLAGS.steps,
    "repeats": FLAGS.repeats,
    "num_layers": FLAGS.num_layers,
    "one_worker_at_a_time": FLAGS.one_worker_at_a_time,
    "hyper": {
      "lr": LR,
      "weight_decay": WEIGHT_DECAY,
      "clip": CLIP,
      "dual_clip": DUAL_CLIP,
      "max_grad_norm": MAX_GRAD_NORM,
      "value_clip": VALUE_CLIP,
      "dtype": "float32",
    },
  }

  def save(rows, demo_out, rate_end):
    machine = {
      "platform": platform.platform(),
      "cpus": os.cpu_count(),
      "cpu": cpu_name(),
      "matmul_n": FLAGS.matmul_n,
      "matmul_flop_per_s_start": rate,
      "matmul_flop_per_s_end": rate_end,
      "load_avg_start": load_start,
      "load_avg_end": os.getloadavg(),
      "note": load_note(load_start[0]) + ("" if rate_end else " (partial results: the run was still going)"),
    }
    write_results(FLAGS.out, machine, rows, demo_out, settings)

  rows = compare(rate, on_shape=lambda r: save(r, None, None)) if FLAGS.bench else []
  demo_out = demo() if FLAGS.demo else None
  save(rows, demo_out, measure_matmul_rate(FLAGS.matmul_n))


if __name__ == "__main__":
  app.run(main)

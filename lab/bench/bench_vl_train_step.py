"""Vision-language train-step benchmark: our jitted policy step on a Qwen2.5-VL vs the same maths in PyTorch +
transformers (Qwen2_5_VLForConditionalGeneration), the same tiny config, weights, images and batch.

    .venv/bin/python lab/bench/bench_vl_train_step.py --rows=4 --image_px=64 --text_tokens=96 --repeats=5

One step, vision tower trained (--train_vision, default) or frozen: the vision tower on every row's image,
the LM forward, log-prob of each next token, PPO-clip (clip 0.2, dual-clip 3) over the answer tokens,
token-mean, backward, global-norm clipping to 1.0, AdamW (lr 1e-6, weight decay 0.01), float32. JAX: the
library's prepare arrays (rl/vision_batch.py: per-row padded patches) and `make_train_step` jitted; torch:
eager, its default attention, the batch's images concatenated as HF's processor gives them. Both run in this
process, built and warmed first, then timed in turns (`repeats` rounds, the frameworks alternating).
Reported: median / min wall and process CPU seconds per step, the first step (compile) time, both losses,
and the ratio JAX / torch of the median wall (< 1: JAX faster).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
import time

from absl import app, flags

from bench_common import REPO_ROOT, cpu_name

flags.DEFINE_integer("rows", 4, "rows in the batch (one image each)")
flags.DEFINE_integer("image_px", 64, "each image's side in pixels (a tiny tower's 4x4 patches: (px / 4)^2 patches)")
flags.DEFINE_integer("text_tokens", 96, "text tokens per row besides the image (a quarter of them the answer)")
flags.DEFINE_integer("num_layers", 2, "LM decoder layers of the tiny config")
flags.DEFINE_bool("train_vision", True, "train the vision tower too (False: frozen in both frameworks)")
flags.DEFINE_integer("repeats", 5, "timed rounds, the frameworks taking turns")
flags.DEFINE_string("out", os.path.join(REPO_ROOT, "lab", "results", "bench_vl_train_step"), "output prefix")
FLAGS = flags.FLAGS
LR, WEIGHT_DECAY, CLIP, DUAL_CLIP, MAX_GRAD_NORM = 1e-6, 0.01, 0.2, 3.0, 1.0


def _batch(cfg, rng):
  """Trajectories with one random image each, their processor, and the numpy arrays both frameworks use."""
  import numpy as np
  from PIL import Image

  from agentfly_jax.agents.trajectory import Trajectory
  from agentfly_jax.vision.processor import VisionProcessor

  px = FLAGS.image_px
  proc = VisionProcessor.for_model(cfg.vision, min_pixels=px * px, max_pixels=px * px)
  trajs = []
  for b in range(FLAGS.rows):
    image = Image.fromarray(rng.integers(0, 256, (px, px, 3), np.uint8))
    _, grid = proc.process([image])
    n = proc.num_image_tokens(grid)[0]
    prompt = rng.integers(0, cfg.vocab_size - 8, FLAGS.text_tokens - FLAGS.text_tokens // 4).tolist()
    ids = prompt[:8] + [cfg.vision_start_token_id] + [cfg.image_token_id] * n + [cfg.vision_end_token_id] + prompt[8:]
    start = len(ids)
    ids += rng.integers(0, cfg.vocab_size - 8, FLAGS.text_tokens // 4).tolist()
    action = np.arange(len(ids)) >= start
    trajs.append(
      Trajectory(
        token_ids=np.array(ids, np.int32),
        action_mask=action,
        sampler_logprobs=np.where(action, -rng.random(len(ids)) * 3, 0).astype(np.float32),
        reward=float(b % 2),
        group_id=b // 2,
        chain_id=b % 2,
        images=[image],
        image_grid_thw=grid.reshape(-1, 3),
      )
    )
  return trajs, proc


class JaxStep:
  def __init__(self, folder, trajs, proc, rng):
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx

    from agentfly_jax.models import from_pretrained
    from agentfly_jax.rl.batching import to_microbatches, train_arrays
    from agentfly_jax.rl.core.train_state import create_train_state
    from agentfly_jax.rl.core.train_step import make_train_step
    from agentfly_jax.rl.programs import default_loss_config
    from agentfly_jax.rl.vision_batch import image_arrays

    model = from_pretrained(folder)
    keep = nnx.Param if FLAGS.train_vision else nnx.All(nnx.Param, nnx.Not(nnx.PathContains("visual")))
    graphdef, params, rest = nnx.split(model, keep, ...)
    arrays = train_arrays(trajs, pad_id=0, multiple=16)
    t = arrays["input_ids"].shape[1]
    batch = {k: arrays[k] for k in ("input_ids", "target_ids", "attention_mask", "action_mask")}
    batch["old_logprobs"] = arrays["sampler_logprobs"]
    batch["advantages"] = np.repeat(rng.standard_normal((len(trajs), 1)).astype(np.float32), t, axis=1)
    batch.update(image_arrays(trajs, proc, model.config, length=t))
    self.batch_np = batch
    opt = optax.chain(optax.clip_by_global_norm(MAX_GRAD_NORM), optax.adamw(LR, eps=1e-8, weight_decay=WEIGHT_DECAY))
    self.state = create_train_state(params, opt)
    loss = default_loss_config(agg="token-mean")
    self.step = jax.jit(make_train_step(graphdef, rest, opt, loss), donate_argnums=(0,))
    self.mb = jax.tree.map(jnp.asarray, to_microbatches(batch, np.arange(len(trajs)), len(trajs)))

  def run(self) -> float:
    import jax

    self.state, metrics = self.step(self.state, self.mb)
    return float(jax.block_until_ready(metrics["actor/pg_loss"]))


class TorchStep:
  def __init__(self, folder, jax_step: JaxStep, trajs, proc):
    import numpy as np
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(0)
    self.model = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    if not FLAGS.train_vision:
      for p in self.model.model.visual.parameters():
        p.requires_grad_(False)
    trained = [p for p in self.model.parameters() if p.requires_grad]
    self.opt = torch.optim.AdamW(trained, lr=LR, weight_decay=WEIGHT_DECAY, eps=1e-8)
    self.trained = trained
    b = jax_step.batch_np
    pixels, grids = proc.process([im for t in trajs for im in t.images])
    ids = torch.as_tensor(np.asarray(b["input_ids"]), dtype=torch.long)
    self.inputs = dict(
      input_ids=ids,
      attention_mask=torch.as_tensor(np.asarray(b["attention_mask"]), dtype=torch.long),
      pixel_values=torch.as_tensor(pixels),
      image_grid_thw=torch.as_tensor(grids),
      mm_token_type_ids=(ids == self.model.config.image_token_id).int(),
    )
    self.target = torch.as_tensor(np.asarray(b["target_ids"]), dtype=torch.long)
    self.mask = torch.as_tensor(np.asarray(b["action_mask"]), dtype=torch.float32)
    self.old = torch.as_tensor(np.asarray(b["old_logprobs"]))
    self.adv = torch.as_tensor(np.asarray(b["advantages"]))

  def run(self) -> float:
    import torch

    logits = self.model(**self.inputs).logits.float()
    lp = torch.gather(logits, -1, self.target[..., None])[..., 0] - torch.logsumexp(logits, -1)
    ratio = torch.exp(torch.clamp(lp - self.old, -20.0, 20.0))
    adv = self.adv
    loss = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - CLIP, 1 + CLIP))
    loss = torch.where(adv < 0, torch.minimum(loss, -adv * DUAL_CLIP), loss)
    loss = (loss * self.mask).sum() / self.mask.sum().clamp(min=1e-8)
    self.opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(self.trained, MAX_GRAD_NORM)
    self.opt.step()
    return float(loss.detach())


def _timed(fn):
  c0, t0 = os.times(), time.perf_counter()
  loss = fn()
  c1 = os.times()
  return time.perf_counter() - t0, (c1.user - c0.user) + (c1.system - c0.system), loss


def main(argv):
  del argv
  import numpy as np
  from flax import nnx

  from agentfly_jax.models import Qwen25VL, save_pretrained, tiny_config

  cfg = tiny_config("qwen2_5_vl", vocab_size=512, num_hidden_layers=FLAGS.num_layers)
  rng = np.random.default_rng(0)
  with tempfile.TemporaryDirectory() as folder:
    save_pretrained(Qwen25VL(cfg, rngs=nnx.Rngs(0)), folder)
    trajs, proc = _batch(cfg, rng)
    steps = {}
    steps["jax"] = JaxStep(folder, trajs, proc, rng)
    steps["torch"] = TorchStep(folder, steps["jax"], trajs, proc)
    first = {name: _timed(step.run) for name, step in steps.items()}
    times = {name: [] for name in steps}
    for _ in range(FLAGS.repeats):
      for name, step in steps.items():
        times[name].append(_timed(step.run))
  rows = {}
  for name, runs in times.items():
    walls, cpus = [w for w, _, _ in runs], [c for _, c, _ in runs]
    rows[name] = dict(
      median_s=statistics.median(walls),
      min_s=min(walls),
      cpu_s=statistics.median(cpus),
      first_s=first[name][0],
      first_loss=first[name][2],
    )
  ratio = rows["jax"]["median_s"] / rows["torch"]["median_s"]
  patches = int(sum(np.prod(t.image_grid_thw, axis=1).sum() for t in trajs))
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True)
  result = dict(
    date=time.strftime("%Y-%m-%d"),
    commit=commit.stdout.strip() or "unknown",
    machine=dict(cpu=cpu_name(), cores=os.cpu_count(), load=os.getloadavg()[0]),
    config=dict(
      rows=FLAGS.rows,
      image_px=FLAGS.image_px,
      patches=patches,
      tokens=int(sum(len(t.token_ids) for t in trajs)),
      num_layers=FLAGS.num_layers,
      train_vision=FLAGS.train_vision,
      repeats=FLAGS.repeats,
    ),
    frameworks=rows,
    jax_over_torch=ratio,
  )
  os.makedirs(os.path.dirname(FLAGS.out), exist_ok=True)
  with open(FLAGS.out + ".json", "w") as f:
    json.dump(result, f, indent=2)
  lines = [
    f"VL train step, {FLAGS.rows} rows x ({FLAGS.text_tokens} text + 1 image of {FLAGS.image_px}^2 px), "
    f"{patches} patches, vision {'trained' if FLAGS.train_vision else 'frozen'}; {result['date']}, commit "
    f"{result['commit']}; {result['machine']}",
    "",
    "| framework | median s | min s | cpu s | first step s | first loss |",
    "|---|---|---|---|---|---|",
  ]
  for name, r in rows.items():
    lines.append(
      f"| {name} | {r['median_s']:.4f} | {r['min_s']:.4f} | {r['cpu_s']:.3f} | {r['first_s']:.2f} | "
      f"{r['first_loss']:.5f} |"
    )
  lines += ["", f"JAX / torch (median wall): {ratio:.2f}x"]
  with open(FLAGS.out + ".md", "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  app.run(main)

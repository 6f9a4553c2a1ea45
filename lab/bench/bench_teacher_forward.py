"""On-policy distillation's teacher forward against the student's own log-prob pass, on one batch.

    PYTHONPATH=$PWD .venv/bin/python lab/bench/bench_teacher_forward.py --num_layers=4 --shape=4x128

What a distillation step adds to prepare is one program: the teacher's log-probs of the sampled tokens
(rl/core/prepare.make_teacher_logprobs, run by rl/update.PolicyUpdate before prepare). Its cost is set
beside the student's own log-prob pass, the prepare program the trainer runs for the old log-probs. Both
come from a real run (`Trainer(config).run.update`: the lookup task's GRPO config with
`model.pretrained` = the student folder, `teacher.pretrained` = the teacher, `loss.distill_weight=1`), on
one batch of `train_arrays` (B rows x T tokens, ~1/8 of rows shorter, the first quarter of a row prompt,
then 24-token actions between 40-token observations: the action mask).

Timed, interleaved (the order rotates each repetition) after `--warmup` untimed calls of each:
  student          prepare(params, None, None, arrays): the student's log-probs (+ GRPO's advantages)
  prepare_distill  the same prepare with arrays["teacher_logprobs"]: what a distillation run calls
  teacher          the teacher program, teacher of equal size (the student's config, other weights)
  teacher_big      the same program for a teacher of `--big_layers` x the layers (for information)
Reported: median and min wall ms, median process CPU ms, the first call's seconds (compile), and
the ratios teacher / student (of the medians, and the median of the per-repetition ratios) and the
teacher's share of a distillation step's prepare: teacher / (teacher + prepare_distill).

Models: `smollm2_random` (SmolLM2-135M's shapes and tokenizer, random weights, `--num_layers`
decoder layers) or `tiny` (a small qwen2 over the lookup warm start's tokenizer, for the smoke row).
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

from absl import app, flags

from bench_common import REPO_ROOT, RESULTS_DIR, SMOLLM2_135M_SHAPES, cpu_name, load_note

FLAGS = flags.FLAGS
flags.DEFINE_enum("model", "smollm2_random", ["smollm2_random", "tiny"], "the student's (and teachers') shapes")
flags.DEFINE_integer("num_layers", 4, "the student's (and the equal teacher's) decoder layers")
flags.DEFINE_integer("big_layers", 2, "the larger teacher has this many times the student's layers (0: no row)")
flags.DEFINE_string("shape", "4x128", "B x T: trajectories x tokens")
flags.DEFINE_integer("warmup", 2, "untimed calls of each program after the first (compiling) one")
flags.DEFINE_integer("repeats", 15, "interleaved timed repetitions")
flags.DEFINE_string("out", os.path.join(RESULTS_DIR, "bench_teacher_forward"), "output stem (.json / .md)")
flags.DEFINE_string("work_dir", "", "scratch folder for the models' HF files (default: a temporary one)")

WARMSTART = os.path.join(REPO_ROOT, "experiments", "results", "lookup_warmstart")
ACTION_TOKENS, OBSERVATION_TOKENS = 24, 40  # the agent layout's turns (as bench_train_step's)


def model_config(layers: int):
  """(ModelConfig, the folder whose tokenizer it uses) of `--model` with `layers` decoder layers."""
  from agentfly_jax.models import ModelConfig, smollm2_folder, tiny_config

  if FLAGS.model == "smollm2_random":
    return ModelConfig(**{**SMOLLM2_135M_SHAPES, "num_hidden_layers": layers}), smollm2_folder()
  with open(os.path.join(WARMSTART, "config.json")) as f:
    vocab = json.load(f)["vocab_size"]
  cfg = tiny_config("qwen2", vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers)
  return cfg, WARMSTART


def save_model(folder: str, layers: int, seed: int) -> str:
  """A random-init HF folder (`seed`'s weights) with the tokenizer of `--model`."""
  from flax import nnx

  from agentfly_jax.models import CausalLM, save_pretrained

  cfg, tok_from = model_config(layers)
  save_pretrained(CausalLM(cfg, rngs=nnx.Rngs(seed)), folder)
  for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
    if os.path.exists(os.path.join(tok_from, name)):
      shutil.copy(os.path.join(tok_from, name), folder)
  return folder


def make_arrays(vocab: int, b: int, t: int, pad_id: int, seed: int = 0) -> dict:
  """`train_arrays` of B synthetic trajectories of up to T + 1 tokens (the agent layout's action mask)."""
  import numpy as np

  from agentfly_jax.agents.trajectory import Trajectory
  from agentfly_jax.rl.batching import train_arrays

  rng = np.random.default_rng(seed)
  trajs = []
  for i in range(b):
    n = int(rng.integers((t + 1) // 2, t + 2)) if rng.random() < 0.125 else t + 1
    pos = np.arange(n)
    mask = (pos >= n // 4) & ((pos - n // 4) % (ACTION_TOKENS + OBSERVATION_TOKENS) < ACTION_TOKENS)
    lp = np.where(mask, -rng.random(n) * 2, 0).astype(np.float32)
    ids = rng.integers(1, vocab, n).astype(np.int32)
    trajs.append(Trajectory(ids, mask, lp, reward=float(rng.random()), group_id=i // 2, chain_id=i % 2))
  return train_arrays(trajs, pad_id=pad_id)


def open_distill_run(student: str, teacher: str, b: int, workdir: str):
  """The run a distillation config opens (lookup GRPO, the student and teacher folders, B rows a step)."""
  from agentfly_jax.rl.config import lookup_config
  from agentfly_jax.rl.trainer import Trainer

  c = lookup_config("grpo", student)
  c.rollout.rows_per_step, c.rollout.num_chains = b // 2, 2
  c.eval.every, c.eval.num_rows = 0, 0
  c.log.tensorboard = c.log.progress = False
  c.teacher.pretrained = teacher
  c.loss.distill_weight = 1.0
  return c, Trainer(c, workdir).run


def programs(run, config, big_teacher: str | None, device: dict) -> dict:
  """name -> a no-argument call of that program on `device` (the batch on the run's mesh)."""
  from agentfly_jax.rl import setup
  from agentfly_jax.rl.core.prepare import make_teacher_logprobs
  from agentfly_jax.rl.spec import RunSpec
  from agentfly_jax.rl.update import prepare_config

  up, params = run.update, run.parts.policy.params
  teacher = up.teacher
  last = {}  # the teacher's latest log-probs, which the distillation prepare reads

  def run_teacher():
    last["lp"] = up._teacher(teacher.params, teacher.rest, device)
    return last["lp"]

  out = {
    "student": lambda: up.prepare(params, None, None, device, up.frozen),
    "teacher": run_teacher,  # called before prepare_distill's first call (dict order)
    "prepare_distill": lambda: up.prepare(params, None, None, {**device, "teacher_logprobs": last["lp"]}, up.frozen),
  }
  if big_teacher:  # loaded and compiled as PolicyUpdate does for config.teacher
    config.teacher.pretrained = big_teacher
    spec = RunSpec.from_config(config)
    big = setup._teacher_halves(spec, run.parts.tokenizer, run.parts.mesh)
    prep_cfg = prepare_config(spec, run.loss_cfg, spec.algorithm.estimator, up.prepare_chunk)
    fn = make_teacher_logprobs(big.graphdef, prep_cfg, mesh=run.parts.mesh, rules=spec.mesh.rules)
    out["teacher_big"] = lambda: fn(big.params, big.rest, device)
  return out


def time_programs(calls: dict) -> dict:
  """name -> {first_s, wall_ms, cpu_ms}: the first call, `--warmup` untimed ones, then `--repeats`
  interleaved timed ones (the order rotated each repetition)."""
  import jax

  res = {name: {"wall_ms": [], "cpu_ms": []} for name in calls}
  for name, fn in calls.items():
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    res[name]["first_s"] = time.perf_counter() - t0
  for _ in range(FLAGS.warmup):
    for fn in calls.values():
      jax.block_until_ready(fn())
  names = list(calls)
  for rep in range(FLAGS.repeats):
    for name in names[rep % len(names) :] + names[: rep % len(names)]:
      w0, c0 = time.perf_counter(), time.process_time()
      jax.block_until_ready(calls[name]())
      res[name]["wall_ms"].append((time.perf_counter() - w0) * 1e3)
      res[name]["cpu_ms"].append((time.process_time() - c0) * 1e3)
    print(f"repeat {rep + 1}: " + "; ".join(f"{n} {res[n]['wall_ms'][-1]:.1f} ms" for n in names), flush=True)
  return res


def summarise(res: dict) -> dict:
  """Medians, minima and the ratios against the student's pass."""
  med = statistics.median
  rows = {
    n: {
      "wall_ms_median": med(r["wall_ms"]),
      "wall_ms_min": min(r["wall_ms"]),
      "cpu_ms_median": med(r["cpu_ms"]),
      "first_s": r["first_s"],
      **r,
    }
    for n, r in res.items()
  }
  student = rows["student"]
  for r in rows.values():
    r["ratio_vs_student"] = r["wall_ms_median"] / student["wall_ms_median"]
    r["ratio_vs_student_per_repeat_median"] = med([a / b for a, b in zip(r["wall_ms"], student["wall_ms"])])
    r["cpu_ratio_vs_student"] = r["cpu_ms_median"] / student["cpu_ms_median"]
  share = rows["teacher"]["wall_ms_median"] / (
    rows["teacher"]["wall_ms_median"] + rows["prepare_distill"]["wall_ms_median"]
  )
  return {"rows": rows, "teacher_share_of_distill_prepare": share}


def markdown(result: dict) -> str:
  s = result["settings"]
  lines = [
    "# The teacher's forward vs the student's log-prob pass (on-policy distillation)",
    "",
    f"{result['date']}, commit {result['commit']}; {result['machine']}. lab/bench/bench_teacher_forward.py "
    f"`{s['command']}`: {s['model']}, student {s['num_layers']} layers, batch {s['shape']} (B x T, agent layout: "
    f"{result['action_tokens']} action tokens of {result['real_tokens']} real), prepare chunk {s['prepare_chunk']} "
    f"rows; {s['warmup']} warm-up calls, {s['repeats']} interleaved repetitions (medians).",
    "",
    "| program | wall ms (median) | wall ms (min) | CPU ms (median) | x student (wall medians) | x student (wall, "
    "median per rep.) | x student (CPU medians) | first call s (compile or cache hit) |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for n, r in result["rows"].items():
    lines.append(
      f"| {n} | {r['wall_ms_median']:.1f} | {r['wall_ms_min']:.1f} | {r['cpu_ms_median']:.1f} | "
      f"{r['ratio_vs_student']:.3f} | {r['ratio_vs_student_per_repeat_median']:.3f} | {r['cpu_ratio_vs_student']:.3f} | "
      f"{r['first_s']:.1f} |"
    )
  lines += [
    "",
    f"student: the prepare program without a teacher (old log-probs + GRPO advantages); prepare_distill: it with "
    f"the teacher's log-probs (the distillation run's prepare); teacher: the equal-size teacher's program "
    f"(the student's config, other weights); teacher_big: {s['big_layers']}x the layers. The teacher's share of a "
    f"distillation step's prepare: {result['teacher_share_of_distill_prepare']:.1%}.",
  ]
  return "\n".join(lines) + "\n"


def main(argv):
  del argv
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax

  from agentfly_jax.rl.scale.compile_cache import enable_compile_cache

  enable_compile_cache("auto")
  load0 = os.getloadavg()
  b, t = (int(x) for x in FLAGS.shape.split("x"))
  with tempfile.TemporaryDirectory() as tmp:
    work = FLAGS.work_dir or tmp
    os.makedirs(work, exist_ok=True)
    n = FLAGS.num_layers
    student = save_model(os.path.join(work, "student"), n, seed=0)
    teacher = save_model(os.path.join(work, "teacher"), n, seed=1)
    big = save_model(os.path.join(work, "teacher_big"), n * FLAGS.big_layers, seed=2) if FLAGS.big_layers else None
    config, run = open_distill_run(student, teacher, b, os.path.join(work, "run"))
    arrays = make_arrays(run.parts.tokenizer.vocab_size, b, t, run.parts.tokenizer.pad_token_id)
    device = run.update.put_arrays(arrays)
    res = time_programs(programs(run, config, big, device))
    chunk = run.update.prepare_chunk
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True)
  result = {
    "date": datetime.date.today().isoformat(),
    "commit": commit.stdout.strip(),
    "machine": f"{cpu_name()}, {jax.devices()[0].platform}; {load_note(load0[0])}",
    "load_avg_start": load0,
    "load_avg_end": os.getloadavg(),
    "settings": {
      "command": " ".join(f"--{k}={getattr(FLAGS, k)}" for k in ("model", "num_layers", "big_layers", "shape")),
      "model": FLAGS.model,
      "num_layers": FLAGS.num_layers,
      "big_layers": FLAGS.big_layers,
      "shape": FLAGS.shape,
      "warmup": FLAGS.warmup,
      "repeats": FLAGS.repeats,
      "prepare_chunk": chunk,
    },
    "real_tokens": int(arrays["attention_mask"].sum()),
    "action_tokens": int(arrays["action_mask"].sum()),
    **summarise(res),
  }
  os.makedirs(os.path.dirname(os.path.abspath(FLAGS.out)), exist_ok=True)
  with open(FLAGS.out + ".json", "w") as f:
    json.dump(result, f, indent=1)
  with open(FLAGS.out + ".md", "w") as f:
    f.write(markdown(result))
  print(markdown(result))


if __name__ == "__main__":
  app.run(main)

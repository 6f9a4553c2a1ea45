"""Memory report of the sharded train step: per model size x mesh x remat policy, the per-device bytes
XLA plans for the compiled step (`compiled.memory_analysis()`: arguments, outputs, temporaries),
without allocating the model (abstract params from `nnx.eval_shape`).

  XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \\
    .venv/bin/python lab/bench/bench_memory.py --sizes=d256_L4_v8k,smollm2_135m \\
      --remat=none,full,dots_saveable --meshes=1x1,8x1,2x4
  -> lab/results/bench_memory.{json,md}

Compile-only: numbers are XLA's plan for this backend (CPU here), not a measured peak; on GPU/TPU
rerun on that backend. Ratios (temp vs 1 device, remat vs none) are the point.
"""

import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags  # noqa: E402
from bench_machine import cpu_name, write_results  # noqa: E402

_OUT = flags.DEFINE_string("out", "lab/results/bench_memory", "Output path (no extension).")
_BATCH = flags.DEFINE_integer("micro_batch", 8, "Rows per micro-batch.")
_LEN = flags.DEFINE_integer("seq_len", 512, "Sequence length L.")
_SIZES = flags.DEFINE_list("sizes", None, "Model sizes to report (default: all of SIZES).")
_REMAT = flags.DEFINE_list(
  "remat", ["none", "full", "dots_saveable"], "Remat policies per decoder layer (models/remat.py names)."
)
_MESHES = flags.DEFINE_list("meshes", ["1x1", "8x1", "2x4", "1x8"], "Meshes, fsdp x tp.")

SIZES = {  # name -> tiny_config overrides
  "d256_L4_v8k": dict(
    vocab_size=8192,
    hidden_size=256,
    intermediate_size=1024,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=32,
  ),
  "smollm2_135m": dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
  ),
}


def measure(size: str, fsdp: int, tp: int, remat: str, micro: int, seq: int) -> dict:
  import jax
  import jax.numpy as jnp
  from flax import nnx
  from agentfly_jax.models import CausalLM, make_mesh, partition_specs, tiny_config
  from agentfly_jax.rl.core.train_state import create_train_state, make_optimizer
  from agentfly_jax.rl.core.train_step import batch_sharding, jit_step, make_train_step, state_shardings
  from agentfly_jax.rl.programs import default_loss_config

  mesh = make_mesh(fsdp, tp)
  cfg = tiny_config("llama", tie_word_embeddings=True, remat=remat, **SIZES[size])
  model = nnx.eval_shape(lambda: CausalLM(cfg, rngs=nnx.Rngs(0)))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  opt = make_optimizer(lr=1e-5)
  state = jax.eval_shape(lambda p: create_train_state(p, opt), params)
  state_sh = state_shardings(state, mesh, partition_specs(model, mesh), optimizer=opt)
  keys = {
    "input_ids": jnp.int32,
    "target_ids": jnp.int32,
    "attention_mask": jnp.bool_,
    "action_mask": jnp.bool_,
    "old_logprobs": jnp.float32,
    "advantages": jnp.float32,
  }
  batch_sh = batch_sharding(mesh, keys)
  batch = {k: jax.ShapeDtypeStruct((1, micro, seq), dt) for k, dt in keys.items()}  # jit_step has in_shardings
  step = jit_step(make_train_step(graphdef, rest, opt, default_loss_config(agg="token-mean")), state_sh, batch_sh)
  mem = step.lower(state, batch).compile().memory_analysis()
  n_params = sum(int(x.size) for x in jax.tree.leaves(params))
  return {
    "size": size,
    "params": n_params,
    "fsdp": fsdp,
    "tp": tp,
    "remat": remat,
    "argument_bytes": int(mem.argument_size_in_bytes),
    "output_bytes": int(mem.output_size_in_bytes),
    "temp_bytes": int(mem.temp_size_in_bytes),
    "alias_bytes": int(mem.alias_size_in_bytes),
  }


def main(argv):
  del argv
  import jax
  from agentfly_jax.models.remat import remat_name

  try:
    meshes = [tuple(int(x) for x in m.split("x")) for m in _MESHES.value]
    remats = [remat_name(r) for r in _REMAT.value]
  except ValueError as e:
    raise app.UsageError(f"--meshes (e.g. 2x4) or --remat: {e}")
  machine = f"{cpu_name()}, {os.cpu_count()} cores, backend {jax.default_backend()}, {len(jax.devices())} devices"
  rows = []
  for size in _SIZES.value or list(SIZES):
    if size not in SIZES:
      raise app.UsageError(f"--sizes: unknown size {size!r}; known: {sorted(SIZES)}")
    for fsdp, tp in meshes:
      if fsdp * tp > len(jax.devices()):
        continue
      for remat in remats:
        rows.append(measure(size, fsdp, tp, remat, _BATCH.value, _LEN.value))
        print(json.dumps(rows[-1]), flush=True)
        write(machine, rows)  # after every row: a long report stopped early keeps what it measured


def write(machine: str, rows: list[dict]) -> None:
  out = {
    "machine": machine,
    "micro_batch": _BATCH.value,
    "seq_len": _LEN.value,
    "rows": rows,
    "note": "compile-time plan per device from XLA memory_analysis (no allocation); CPU backend "
    "with forced host devices; the machine was shared with other jobs (does not affect "
    "these compile-time numbers)",
  }
  mib = lambda b: f"{b / 2**20:,.1f}"
  lines = [
    f"# Train-step memory per device (XLA memory_analysis)",
    "",
    f"Machine: {machine}. Micro-batch {_BATCH.value} x {_LEN.value} tokens, AdamW, float32. "
    "Compile-time plan, not a measured peak.",
    "",
    "| model | params | mesh (fsdp x tp) | remat | arguments MiB | temporaries MiB | temp vs 1x1 | temp vs no remat |",
    "|---|---:|---|---|---:|---:|---:|---:|",
  ]
  base = {(r["size"], r["remat"]): r["temp_bytes"] for r in rows if r["fsdp"] * r["tp"] == 1}
  no_remat = {(r["size"], r["fsdp"], r["tp"]): r["temp_bytes"] for r in rows if r["remat"] == "none"}
  for r in rows:
    vs_1 = base.get((r["size"], r["remat"]))
    vs_1 = f"{r['temp_bytes'] / vs_1:.2f}" if vs_1 else "-"
    vs = no_remat.get((r["size"], r["fsdp"], r["tp"]))
    vs = f"{r['temp_bytes'] / vs:.2f}" if vs else "-"
    lines.append(
      f"| {r['size']} | {r['params'] / 1e6:.1f}M | {r['fsdp']} x {r['tp']} | {r['remat']} | "
      f"{mib(r['argument_bytes'])} | {mib(r['temp_bytes'])} | {vs_1} | {vs} |"
    )
  write_results(_OUT.value, out, "\n".join(lines) + "\n")


if __name__ == "__main__":
  app.run(main)

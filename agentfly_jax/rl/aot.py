"""Compile-only study of a run's programs for a TPU topology, or a GPU one (`h100:8`, rl/aot_gpu.py)
(the library half of experiments/aot_compile.py, which documents the flags and the report).

    report = run(config, "v5e:2x2", model="qwen2.5-0.5b")   # rows: one per program, bytes a chip
    write_report(report, "experiments/results/aot_x")        # .json + .md
    fit_advice(report, row)                                   # what would fit, for a row that does not

Bad input raises `BadInput` (before anything is compiled); the programs are built with the
trainer's own builders (rl/programs.py, rl/update.py, sampling/jax_sampler.py).
"""

from __future__ import annotations

import json
import os
import re
import time

from agentfly_jax.rl import aot_gpu

# Compile-only needs no exclusive hold on a TPU: without this a second libtpu process (another
# compile, a test) fails on libtpu's multi-process lockfile.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

GIB = 1024**3
HBM_GIB = {"v4": 32.0, "v5e": 16.0, "v5p": 95.0, "v6e": 32.0}  # per chip
HBM_GIB.update({gpu: aot_gpu.hbm_gib(gpu) for gpu in aot_gpu.GPUS})  # the device memory a GPU reports
_TOPOLOGY = re.compile(r"^(v4|v5e|v5p|v6e):(\d+)x(\d+)(?:x(\d+))?$")
_GPU_TOPOLOGY = re.compile(r"^(%s):(\d+)$" % "|".join(aot_gpu.GPUS))
PROGRAMS = ("prepare", "train_step", "sft_step", "sampler", "weight_sync")


class BadInput(ValueError):
  """Bad flags or config: reported before anything is compiled (exit 1)."""


class DoesNotFit(RuntimeError):
  """A compiled program's peak exceeds the chip's HBM (exit 2)."""


# ---------------------------------------------------------------- inputs
def parse_topology(name: str) -> tuple[str, int]:
  """(generation, number of chips) of '<gen>:<AxB[xC]>' (TPU) or '<gpu>:<N>' (GPU); BadInput naming it
  otherwise."""
  g = _GPU_TOPOLOGY.match(name or "")
  if g:
    generation, chips = g.group(1), int(g.group(2))
    try:
      aot_gpu.topology_string(chips, aot_gpu.GPUS[generation].gpus_per_host)
    except ValueError as e:
      raise BadInput(f"--topology={name!r}: {e}") from None
    return generation, chips
  m = _TOPOLOGY.match(name or "")
  if not m:
    raise BadInput(
      f"--topology={name!r} is unknown or malformed: expected <gen>:<shape> with gen one of "
      f"{sorted(set(HBM_GIB) - set(aot_gpu.GPUS))} and shape like 2x2 or 2x2x2 (e.g. v5e:2x2, "
      f"v5p:2x2x2), or <gpu>:<count> with gpu one of {sorted(aot_gpu.GPUS)} (e.g. h100:8)"
    )
  chips = 1
  for d in m.groups()[1:]:
    if d is not None:
      chips *= int(d)
  return m.group(1), chips


def topology_devices(name: str):
  generation, chips = parse_topology(name)
  if aot_gpu.is_gpu(generation):
    try:
      return aot_gpu.gpu_devices(generation, chips)
    except aot_gpu.GpuCompileUnavailable as e:
      raise BadInput(f"--topology={name!r}: {e}") from None
  from jax.experimental import topologies

  try:
    return list(topologies.get_topology_desc(platform="tpu", topology_name=name).devices)
  except Exception as e:  # libtpu refuses shapes it does not know
    raise BadInput(
      f"--topology={name!r}: libtpu does not know this topology ({str(e).splitlines()[0][:200]})"
    ) from None


def check_mesh(config, chips: int, topology: str) -> None:
  m = config.mesh
  tp = m.tp
  fsdp = chips // tp if m.fsdp == -1 else m.fsdp
  used = fsdp * tp + m.get("sampler_devices", 0)
  if fsdp < 1 or tp < 1 or used != chips:
    raise BadInput(
      f"mesh fsdp={m.fsdp} x tp={m.tp}"
      + (f" + sampler_devices={m.sampler_devices}" if m.get("sampler_devices", 0) else "")
      + f" = {used} chips does not divide the {chips} chips "
      f"of {topology} (set --config.mesh.fsdp / --config.mesh.tp so that they use all {chips})"
    )


def load_hf_config(model: str, config) -> tuple[dict | None, str]:
  """(HF config dict, its source) from --model; (None, 'config') for the config's own model."""
  from agentfly_jax.models.presets import PRESETS, preset_hf_config

  model = model or config.model.get("aot_preset", "")
  if not model:
    if config.model.pretrained:
      model = config.model.pretrained
    else:
      return None, "config.model (random init)"
  if model.lower() in PRESETS:
    return preset_hf_config(model), f"preset {model}"
  path = os.path.join(model, "config.json") if os.path.isdir(model) else model
  if not os.path.isfile(path):
    raise BadInput(f"--model={model!r} is neither a preset ({sorted(PRESETS)}) nor an HF config.json / folder")
  try:
    with open(path) as f:
      return json.load(f), path
  except json.JSONDecodeError as e:
    raise BadInput(f"{path}: not valid JSON ({e})") from None


def model_config(config, hf: dict | None, source: str):
  from agentfly_jax.models import ModelConfig
  from agentfly_jax.rl import setup

  if hf is None:
    return setup.model_config(config, config.model.vocab_size)
  try:
    return ModelConfig.from_hf_dict(hf, source=source, **setup.model_numerics(config))
  except ValueError as e:
    raise BadInput(str(e)) from None


# ---------------------------------------------------------------- abstract values
def with_shardings(tree, shardings):
  """Abstract ShapeDtypeStructs of `tree` carrying `shardings` (a prefix tree of Shardings)."""
  import jax

  def leaf(sh, sub):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), sub)

  return jax.tree.map(leaf, shardings, tree, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))


def named(mesh, specs):
  import jax
  from jax.sharding import NamedSharding, PartitionSpec as P

  return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))


def abstract_model(cls, cfg, mesh, rules):
  """(graphdef, abstract params with their shardings, rest, partition specs) of `cls(cfg)`."""
  from flax import nnx

  from agentfly_jax.models import partition_specs

  graphdef, params, rest = nnx.split(nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0))), nnx.Param, ...)
  specs = partition_specs(params, mesh, rules)
  return graphdef, with_shardings(params, named(mesh, specs)), rest, specs


# ---------------------------------------------------------------- compile + measure
_XLA_OOM = re.compile(
  r"memory required for HLO temporaries \(([\d.]+)([KMGT])\) exceeds available HBM "
  r"\(([\d.]+)([KMGT])\)"
)


def per_device_bytes(tree) -> int:
  """Bytes one device holds of the abstract arrays in `tree` (ShapeDtypeStructs with shardings)."""
  import jax
  import numpy as np

  total = 0
  for leaf in jax.tree.leaves(tree):
    shape = getattr(leaf, "shape", None)
    if shape is None or not hasattr(leaf, "dtype"):
      continue
    sharding = getattr(leaf, "sharding", None)
    local = sharding.shard_shape(tuple(shape)) if sharding is not None else tuple(shape)
    total += int(np.prod(local, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
  return total


def oom_row(name: str, message: str, argument_bytes: int, seconds: float) -> dict | None:
  """The row of a program XLA refused to compile for lack of HBM ("memory required for HLO
  temporaries (19.03G) exceeds available HBM (15.75G)"): its temporaries as XLA counted them +
  the arguments, not fitting; None when `message` is another error."""
  m = _XLA_OOM.search(message)
  if m is None:
    return None
  unit = {"K": 1024, "M": 1024**2, "G": GIB, "T": 1024 * GIB}
  temps = int(float(m.group(1)) * unit[m.group(2)])
  row = {
    "program": name,
    "compile_s": round(seconds, 2),
    "argument_bytes": int(argument_bytes),
    "output_bytes": 0,
    "alias_bytes": 0,
    "temp_bytes": temps,
    "flops": None,
    "xla_refused": True,
    "peak_bytes": int(argument_bytes) + temps,
  }
  print(
    f"  {name}: XLA refused to compile: temporaries {temps / GIB:.2f} GiB + arguments "
    f"{argument_bytes / GIB:.2f} GiB a chip > {m.group(3)}{m.group(4)} of HBM",
    flush=True,
  )
  return row


def compile_program(name: str, jitted, *args, **kwargs) -> dict:
  t0 = time.perf_counter()
  lowered = jitted.lower(*args, **kwargs)
  try:
    compiled = lowered.compile()
  except Exception as e:  # noqa: BLE001 -- XLA's own out-of-memory is a result (does not fit), others raise
    row = oom_row(name, str(e), per_device_bytes(args), time.perf_counter() - t0)
    if row is None:
      raise
    return row
  seconds = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  row = {
    "program": name,
    "compile_s": round(seconds, 2),
    "argument_bytes": int(mem.argument_size_in_bytes),
    "output_bytes": int(mem.output_size_in_bytes),
    "alias_bytes": int(mem.alias_size_in_bytes),
    "temp_bytes": int(mem.temp_size_in_bytes),
    "flops": None if cost is None else float(cost.get("flops", 0.0)),
  }  # None: a deviceless GPU
  row["peak_bytes"] = row["argument_bytes"] + row["output_bytes"] - row["alias_bytes"] + row["temp_bytes"]
  print(
    f"  {name}: compiled in {seconds:.1f} s, peak {row['peak_bytes'] / GIB:.2f} GiB a chip "
    f"(temp {row['temp_bytes'] / GIB:.2f}), "
    + ("no XLA FLOPs (GPU)" if row["flops"] is None else f"{row['flops'] / 1e12:.3f} TFLOP a chip"),
    flush=True,
  )
  return row


def model_flops(cfg, tokens: int, seq_len: int, *, backward: bool, remat: bool, critic: bool) -> float:
  """Model FLOPs of `tokens` tokens (rows of `seq_len`): 2 (forward) or 6 (+ backward) x the matmul
  params x tokens + causal attention, + one more forward of the layers with remat "full", + the
  critic's trunk (PPO). XLA's cost_analysis counts a loop body once (the scanned layers, the
  micro-batch accumulation), so this is the step's count."""
  d, q = cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim
  kv = cfg.num_key_value_heads * cfg.head_dim
  layer = d * (q + 2 * kv) + q * d + 3 * d * cfg.intermediate_size
  attn = 2 * 2 * q * seq_len / 2  # q k^T and p v, causal half, per token per layer (forward)
  per_token_fwd = cfg.num_hidden_layers * (2 * layer + attn)
  total = (3 if backward else 1) * (per_token_fwd + 2 * cfg.vocab_size * d) * tokens
  if backward and remat:
    total += per_token_fwd * tokens
  if critic:
    total += (3 if backward else 1) * per_token_fwd * tokens + (per_token_fwd * tokens if backward and remat else 0)
  return float(total)


def train_step_floor(
  cfg, num_params: int, layer_params: int, micro_rows: int, seq_len: int, chips: int, fsdp: int, critic: bool
) -> int:
  """Hand-computed floor of a train step a chip: sharded params + grads + Adam moments (all in
  param dtype / float32), one layer's weights gathered in the compute dtype, and with remat the
  inputs of every layer of one micro-batch (its rows split over fsdp); x2 with a critic."""
  import numpy as np

  pb, cb = np.dtype(cfg.params_dtype).itemsize, np.dtype(cfg.compute_dtype).itemsize
  state = num_params * (2 * pb + 8) / chips
  gathered = layer_params * cb
  acts = cfg.num_hidden_layers * -(-micro_rows // fsdp) * seq_len * cfg.hidden_size * cb
  return int((state + gathered + acts) * (2 if critic else 1))


def run(config, topology: str, model: str = "", programs=PROGRAMS, seq_len: int = 0, hbm_gib: float = 0.0) -> dict:
  """Compiles `programs` of `config` for `topology`; returns the report (rows per program)."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx
  from jax.sharding import NamedSharding, PartitionSpec as P

  from agentfly_jax.models import CausalLM, Critic
  from agentfly_jax.models.layer_stack import is_stacked_path
  from agentfly_jax.rl import memory_plan, programs as run_programs
  from agentfly_jax.rl.config import ALGORITHMS, validate_config
  from agentfly_jax.rl.setup import training_and_sampler_meshes
  from agentfly_jax.rl.core.train_state import create_train_state
  from agentfly_jax.rl.update import ModelParts, PolicyUpdate
  from agentfly_jax.sampling.jax_sampler import _generate_rows
  from agentfly_jax.models.sharding import resolve_rules

  unknown = sorted(set(programs) - set(PROGRAMS))
  if unknown:
    raise BadInput(f"--programs: unknown programs {unknown}; known: {list(PROGRAMS)}")
  generation, chips = parse_topology(topology)
  try:
    validate_config(config)
  except ValueError as e:
    raise BadInput(str(e)) from None
  check_mesh(config, chips, topology)
  cfg = model_config(config, *load_hf_config(model, config))
  devices = topology_devices(topology)
  hbm = (hbm_gib or HBM_GIB[generation]) * GIB
  mesh, sampler_mesh = training_and_sampler_meshes(config, devices)
  rules = config.mesh.get("rules")
  fsdp = mesh.shape["fsdp"]
  algo = ALGORITHMS[config.algo]
  c, r = config, config.rollout
  seq_len = seq_len or r.max_total_tokens

  graphdef, params, rest, specs = abstract_model(CausalLM, cfg, mesh, rules)
  critic_graphdef = critic_params = critic_rest = critic_specs = None
  if algo["critic"]:
    critic_graphdef, critic_params, critic_rest, critic_specs = abstract_model(Critic, cfg, mesh, rules)
  loss_cfg = run_programs.loss_config(config)
  optimizer, critic_optimizer = run_programs.policy_optimizers(config)
  state_sh = run_programs.train_state_sharding(
    params, critic_params, optimizer, critic_optimizer, mesh, specs, critic_specs
  )
  state = with_shardings(
    jax.eval_shape(
      lambda p, cp: create_train_state(p, optimizer, critic_params=cp, critic_optimizer=critic_optimizer),
      params,
      critic_params,
    ),
    state_sh,
  )
  update = PolicyUpdate(
    ModelParts(graphdef, rest, optimizer, critic_graphdef, critic_rest, critic_optimizer),
    config,
    loss_cfg,
    algo["estimator"],
    mesh,
    state_sh,
  )
  flat = [v for _, v in nnx.to_flat_state(params)]
  num_params = sum(int(np.prod(v.shape)) for v in flat)
  layer_params = (
    sum(int(np.prod(v.shape[1:])) for path, v in nnx.to_flat_state(params) if is_stacked_path(path))
    or num_params // cfg.num_hidden_layers
  )

  print(
    f"aot_compile: {cfg.model_type} {num_params / 1e9:.2f} B params, scan_layers={cfg.scan_layers}, "
    f"remat={cfg.remat}, on {topology} ({chips} chips, {hbm / GIB:.0f} GiB HBM each), mesh "
    f"fsdp={fsdp} x tp={mesh.shape['tp']}",
    flush=True,
  )
  rows = []
  rows_sh = NamedSharding(mesh, P("fsdp"))
  n_rows = -(-r.rows_per_step * r.num_chains // fsdp) * fsdp
  sds = lambda shape, dtype, sh=rows_sh: jax.ShapeDtypeStruct(shape, dtype, sharding=sh)  # noqa: E731
  arrays = {
    "input_ids": sds((n_rows, seq_len), jnp.int32),
    "target_ids": sds((n_rows, seq_len), jnp.int32),
    "attention_mask": sds((n_rows, seq_len), jnp.bool_),
    "action_mask": sds((n_rows, seq_len), jnp.bool_),
    "sampler_logprobs": sds((n_rows, seq_len), jnp.float32),
    "rewards": sds((n_rows,), jnp.float32),
    "group_ids": sds((n_rows,), jnp.int32),
  }
  ref = params if c.loss.kl_coef > 0 else None
  if "prepare" in programs:
    row = compile_program("prepare", update.prepare, params, ref, critic_params, arrays)
    row["micro_batch"] = f"{n_rows}x{seq_len}, chunks of {update.prepare_chunk} rows"
    row["model_flops"] = (
      model_flops(cfg, n_rows * seq_len, seq_len, backward=False, remat=False, critic=algo["critic"])
      * (2 if ref is not None else 1)
      / chips
    )
    rows.append(row)
  if "train_step" in programs:
    batch_out, _ = jax.eval_shape(update.prepare, params, ref, critic_params, arrays)
    micro_rows, num_micro = update.minibatch_layout()
    keys = tuple(batch_out) + (("segment_ids", "positions") if c.train.get("pack_sequences", False) else ())
    dtypes = {**{k: v.dtype for k, v in batch_out.items()}, "segment_ids": jnp.int32, "positions": jnp.int32}
    batch_sh = NamedSharding(mesh, P(None, "fsdp"))
    batch = {k: sds((num_micro, micro_rows, seq_len), dtypes[k], batch_sh) for k in keys}
    # the models' non-trained state goes in as the step's third argument (LoRA: the frozen base)
    row = compile_program("train_step", update.step_program(keys), state, batch, update.frozen)
    row["micro_batch"] = f"{num_micro}x{micro_rows}x{seq_len}"
    row["model_flops"] = (
      model_flops(
        cfg,
        num_micro * micro_rows * seq_len,
        seq_len,
        backward=True,
        remat=cfg.remat not in (False, "none", ""),
        critic=algo["critic"],
      )
      / chips
    )
    row["floor_bytes"] = train_step_floor(
      cfg, num_params, layer_params, micro_rows, seq_len, chips, fsdp, algo["critic"]
    )
    shape = memory_plan.ModelShape(
      num_params=num_params,
      num_layers=cfg.num_hidden_layers,
      hidden_size=cfg.hidden_size,
      num_heads=cfg.num_attention_heads,
      num_kv_heads=cfg.num_key_value_heads,
      head_dim=cfg.head_dim,
      vocab_size=cfg.vocab_size,
      layer_params=layer_params,
    )
    sizes = memory_plan.RunSizes(
      scan_layers=cfg.scan_layers,
      micro_batch=micro_rows,
      seq_len=seq_len,
      logits_chunk=c.train.logits_chunk,
      attention_chunk=cfg.attention_chunk,
      remat=cfg.remat not in (False, "none", ""),
      compute_dtype=cfg.dtype,
      param_dtype=cfg.param_dtype,
      reference_copy=False,
      critic=algo["critic"],
    )
    row["memory_plan_bytes"] = memory_plan.per_chip_jax_parts(
      shape, sizes, fsdp=fsdp, tp=mesh.shape["tp"], micro_batches=num_micro
    )["total"]
    rows.append(row)
  if "sft_step" in programs:
    sft_opt = run_programs.sft_optimizer(config)
    sft_sh = run_programs.train_state_sharding(params, None, sft_opt, None, mesh, specs, None)
    sft_state = with_shardings(jax.eval_shape(lambda p: create_train_state(p, sft_opt), params), sft_sh)
    step, sft_batch_sh = run_programs.sft_step_program(
      graphdef, rest, sft_opt, loss_cfg, mesh, rules, sft_sh, frozen=rest
    )
    from agentfly_jax.rl.batching import micro_batch_layout

    micro_rows, num_micro = micro_batch_layout(c.sft.rows_per_step, c.train.micro_batch_size, fsdp)
    sft_batch = {
      k: sds((num_micro, micro_rows, seq_len), jnp.int32 if k.endswith("ids") else jnp.bool_, sh)
      for k, sh in sft_batch_sh.items()
    }
    rows.append(compile_program("sft_step", step, sft_state, sft_batch, rest))
  sampler_params = params
  if sampler_mesh is not None:
    sampler_params = abstract_model(CausalLM, cfg, sampler_mesh, rules)[1]
  if "sampler" in programs:
    smesh = sampler_mesh or mesh
    rep = NamedSharding(smesh, P())
    b, p_len, n_new = r.max_batch_size, r.max_total_tokens, r.max_tokens_per_turn
    activation = None if smesh.size <= 1 else (smesh, tuple(sorted(resolve_rules(rules).items())))
    args = (
      sds((b, p_len), jnp.int32, rep),
      sds((b,), jnp.int32, rep),
      sds((b,), jnp.float32, rep),
      sds((b,), jnp.int32, rep),
      sds((b,), jnp.float32, rep),
      sds((b,), jnp.int32, rep),
      sds((b, 8), jnp.int32, rep),
      sds((b,), jnp.uint32, rep),
    )
    row = compile_program(
      "sampler", _generate_rows, graphdef, sampler_params, rest, *args, num_new_bucket=n_new, activation=activation
    )
    row["micro_batch"] = f"{b} rows, prompt {p_len} + {n_new} new"
    rows.append(row)
  if "weight_sync" in programs:
    target = jax.tree.map(lambda x: x.sharding, sampler_params)
    rows.append(compile_program("weight_sync", jax.jit(lambda x: x, out_shardings=target), params))

  for row in rows:
    row["hbm_bytes"] = int(hbm)
    row["fits"] = row["peak_bytes"] <= hbm and not row.get("xla_refused")
  return {
    "topology": topology,
    "chips": chips,
    "hbm_gib": hbm / GIB,
    "model": cfg.model_type,
    "num_params": num_params,
    "num_hidden_layers": cfg.num_hidden_layers,
    "scan_layers": cfg.scan_layers,
    "remat": str(cfg.remat),
    "dtype": cfg.dtype,
    "param_dtype": cfg.param_dtype,
    "mesh": {"fsdp": fsdp, "tp": mesh.shape["tp"], "sampler_devices": config.mesh.get("sampler_devices", 0)},
    "algo": config.algo,
    "seq_len": seq_len,
    "micro_batch_size": c.train.micro_batch_size,
    "rows": rows,
  }


def fit_advice(report: dict, row: dict) -> str:
  """What would fit, estimated from the row's bytes (state vs temporaries)."""
  hbm, peak = row["hbm_bytes"], row["peak_bytes"]
  fixed = row["argument_bytes"] + row["output_bytes"] - row["alias_bytes"]
  tips = []
  if report["remat"] in ("False", "none", ""):
    tips.append("--config.train.remat=full (keeps only each layer's input)")
  if row["temp_bytes"] and fixed < hbm:
    scale = (hbm * 0.9 - fixed) / row["temp_bytes"]
    if scale < 1:
      mb = max(1, int(report["micro_batch_size"] * scale))
      tips.append(f"--config.train.micro_batch_size={mb} (temporaries scale ~linearly with it)")
  chips = report["chips"] * peak / (hbm * 0.9)
  tips.append(f"a topology of >= {int(-(-chips // 1))} chips with mesh.fsdp over them (the state splits over fsdp)")
  return "; or ".join(tips)


def write_report(report: dict, out: str) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out + ".json", "w") as f:
    json.dump(report, f, indent=2)
  lines = [
    f"# AOT compile: {report['model']} ({report['num_params'] / 1e9:.2f} B params, "
    f"{report['num_hidden_layers']} layers, scan_layers={report['scan_layers']}, remat={report['remat']}) "
    f"on {report['topology']}",
    "",
    f"{report['chips']} chips x {report['hbm_gib']:.0f} GiB HBM; mesh {report['mesh']}; {report['algo']}; "
    f"{report['dtype']} compute, {report['param_dtype']} params; rows of {report['seq_len']} tokens. "
    "Bytes are per chip (XLA memory_analysis); peak = arguments + outputs - aliased + temporaries.",
    "",
    "| program | shape | compile s | args GiB | temp GiB | peak GiB | fits | XLA TFLOP/chip (loop bodies "
    "once) | model TFLOP/chip | floor GiB | memory_plan GiB |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  g = lambda b: f"{b / GIB:.2f}" if b is not None else ""  # noqa: E731
  tf = lambda f: "" if f is None else f"{f / 1e12:.1f}"  # noqa: E731
  for row in report["rows"]:
    lines.append(
      f"| {row['program']} | {row.get('micro_batch', '')} | {row['compile_s']:.1f} | "
      f"{g(row['argument_bytes'])} | {g(row['temp_bytes'])} | {g(row['peak_bytes'])} | "
      f"{'yes' if row['fits'] else 'NO'} | {tf(row['flops'])} | {tf(row.get('model_flops'))} | "
      f"{g(row.get('floor_bytes'))} | {g(row.get('memory_plan_bytes'))} |"
    )
  with open(out + ".md", "w") as f:
    f.write("\n".join(lines) + "\n")


def append_to_table(report: dict, prefix: str, label: str = "") -> None:
  """Adds `report` (labelled, e.g. the preset name) to the collected table `<prefix>.json` (a list of
  reports; one with the same label, topology, layout and programs is replaced) and rewrites
  `<prefix>.md` with one row per (report, program)."""
  path = prefix + ".json"
  reports = []
  if os.path.isfile(path):
    with open(path) as f:
      reports = json.load(f)
  report = dict(report, label=label or report["model"])
  key = lambda r: (
    r["label"],
    r["topology"],
    r["scan_layers"],
    r["remat"],  # noqa: E731
    tuple(sorted(x["program"] for x in r["rows"])),
  )
  reports = [r for r in reports if key(r) != key(report)] + [report]
  os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
  with open(path, "w") as f:
    json.dump(reports, f, indent=2)
  g = lambda b: "" if b is None else f"{b / GIB:.2f}"  # noqa: E731
  tf = lambda f: "" if f is None else f"{f / 1e12:.2f}"  # noqa: E731
  gpu = all(aot_gpu.is_gpu(parse_topology(r["topology"])[0]) for r in reports)
  lines = [
    f"# Programs of a run compiled for {'GPU' if gpu else 'TPU'} topologies (XLA, per chip)",
    "",
    "Compiled on a shared 2-core CPU with "
    + (
      "jax 0.10.2 + jax-cuda12-plugin (deviceless, no GPU; XLA TFLOP not reported for GPU)"
      if gpu
      else "jax[tpu] 0.10.2 / libtpu"
    )
    + " (experiments/aot_compile.py; "
    "compile times are under load from other jobs). peak = arguments + outputs - aliased + "
    "temporaries. floor: sharded params + grads + Adam moments + one layer's gathered weights + "
    "remat-kept layer inputs (by hand); memory_plan: rl/memory_plan.py per_chip_jax_parts. XLA TFLOP: "
    "cost_analysis, which counts a loop body once (scanned layers, micro-batch accumulation, decode "
    "loop); model TFLOP: 6ND + causal attention (+ remat's extra forward), the whole step.",
    "",
    "| model | topology | mesh | layers | remat | program | shape | compile s | peak GiB | HBM GiB | fits | "
    "XLA TFLOP/chip | model TFLOP/chip | floor GiB | memory_plan GiB | memory_plan / XLA |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in reports:
    mesh = f"fsdp {r['mesh']['fsdp']} x tp {r['mesh']['tp']}"
    layout = f"{r['num_hidden_layers']} {'scanned' if r['scan_layers'] else 'unrolled'}"
    for row in r["rows"]:
      plan = row.get("memory_plan_bytes")
      ratio = "" if plan is None else f"{plan / row['peak_bytes']:.2f}"
      mf = "" if row.get("model_flops") is None else f"{row['model_flops'] / 1e12:.1f}"
      lines.append(
        f"| {r['label']} | {r['topology']} | {mesh} | {layout} | {r['remat']} | {row['program']} | "
        f"{row.get('micro_batch', '')} | {row['compile_s']:.0f} | {g(row['peak_bytes'])} | "
        f"{row['hbm_bytes'] / GIB:.0f} | {'yes' if row['fits'] else 'NO'} | {tf(row['flops'])} | "
        f"{mf} | {g(row.get('floor_bytes'))} | {g(plan)} | {ratio} |"
      )
  with open(prefix + ".md", "w") as f:
    f.write("\n".join(lines) + "\n")

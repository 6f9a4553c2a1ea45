"""A run's programs as abstract values, compiled and measured (the compile half of rl/scale/aot.py).

    run = abstract_run(spec, cfg, devices, seq_len)   # AbstractRun: abstract params, state, update
    row = COMPILERS["train_step"](run, chips)         # one row per program, bytes a chip (aot.compile_rows)

Every array is a `jax.ShapeDtypeStruct` carrying its sharding on the topology's devices; nothing
is allocated and nothing runs. A program XLA refuses for lack of HBM is a row that does not fit
(`oom_row`), not an error.
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

from agentfly_jax.rl.scale.aot_batches import abstract_step_arrays, batch_note  # noqa: F401 (re-exported)

GIB = 1024**3


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


def abstract_model(cls, cfg, mesh, rules, trainable=None):
  """(graphdef, abstract trained params, abstract rest, the trained params' partition specs) of `cls(cfg)`:
  every param placed by the partition rules (as `models.shard_model` places a real one), then split by
  `trainable` (an nnx filter, rl/setup.trainable_filter; None: every nnx.Param) as rl/setup.py splits it."""
  from flax import nnx

  from agentfly_jax.models import partition_specs

  model = nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0)))
  every = nnx.state(model, nnx.Param)
  nnx.update(model, with_shardings(every, named(mesh, partition_specs(every, mesh, rules))))
  graphdef, params, rest = nnx.split(model, nnx.Param if trainable is None else trainable, ...)
  return graphdef, params, rest, partition_specs(params, mesh, rules)


def _sds(shape, dtype, sharding):
  import jax

  return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


@dataclasses.dataclass(frozen=True)
class AbstractRun:
  """What a run's programs take, as abstract values on a topology's meshes: the model config, the
  meshes, the policy's halves split as the trainer splits them (rl/setup.trainable_filter: the trained
  params; the rest, e.g. a frozen vision tower, abstract too and with their shardings), the critic's params
  (PPO; else None), the loss, the `PolicyUpdate` the trainer would build, its abstract TrainState, the
  sampler's halves (on the sampler sub-mesh when there is one), and the parameter counts (trained or not)."""

  spec: Any  # the run: rl.spec.RunSpec
  cfg: Any  # models.ModelConfig
  mesh: Any
  sampler_mesh: Any
  rules: Any
  seq_len: int  # tokens per training row
  critic: bool
  graphdef: Any
  params: Any
  rest: Any
  specs: Any
  critic_params: Any
  loss_cfg: Any
  update: Any  # rl.update.PolicyUpdate
  state: Any
  sampler_params: Any
  sampler_rest: Any
  num_params: int
  layer_params: int  # params of one decoder layer
  images: Any = None  # a vision-language policy's images of one row (rl/scale/aot_batches.RowImages), else None

  @property
  def fsdp(self) -> int:
    return self.mesh.shape["fsdp"]


def _flat_params(params, rest=None) -> list:
  """[(path, abstract param)] of the trained `params` and every nnx.Param of the `rest` (a frozen tower's)."""
  from flax import nnx

  frozen = [] if rest is None else [(k, v) for k, v in nnx.to_flat_state(rest) if isinstance(v, nnx.Param)]
  return list(nnx.to_flat_state(params)) + frozen


def _parameter_counts(params, num_layers: int, rest=None) -> tuple[int, int]:
  """(all params, trained (`params`) or frozen (the `rest`'s), one decoder layer's: the stacked layers'
  per-layer size, else layer 0's; a vision tower's blocks, stacked or not, are not decoder layers)."""
  import numpy as np

  from agentfly_jax.models.layer_stack import LAYERS, is_stacked_path, is_unrolled_path

  flat = _flat_params(params, rest)
  num_params = sum(int(np.prod(v.shape)) for _, v in flat)
  decoder = [(path, v) for path, v in flat if LAYERS in path]
  stacked = sum(int(np.prod(v.shape[1:])) for path, v in decoder if is_stacked_path(path))
  first = sum(
    int(np.prod(v.shape)) for path, v in decoder if is_unrolled_path(path) and path[path.index(LAYERS) + 1] == 0
  )
  return num_params, stacked or first or num_params // num_layers


def _abstract_update(spec, cfg, mesh, rules, critic: bool) -> dict:
  """The policy (+ critic) abstract halves, the loss, the abstract TrainState and the
  `PolicyUpdate` the trainer builds from them, as AbstractRun's fields."""
  import jax

  from agentfly_jax.models import Critic, model_class
  from agentfly_jax.rl import programs as run_programs
  from agentfly_jax.rl.core.train_state import create_train_state
  from agentfly_jax.rl.setup import trainable_filter
  from agentfly_jax.rl.update import ModelParts, PolicyUpdate

  # the abstract models carry no LoRA adapters: trained as a full fine-tune, a frozen vision tower aside
  graphdef, params, rest, specs = abstract_model(model_class(cfg), cfg, mesh, rules, trainable_filter(spec, lora=False))
  critic_graphdef = critic_params = critic_rest = critic_specs = None
  if critic:
    trainable = trainable_filter(spec, critic=True, lora=False)
    critic_graphdef, critic_params, critic_rest, critic_specs = abstract_model(Critic, cfg, mesh, rules, trainable)
  loss_cfg = run_programs.loss_config(spec)
  optimizer, critic_optimizer = run_programs.policy_optimizers(spec)
  state_sh = run_programs.train_state_sharding(
    params, critic_params, optimizer, critic_optimizer, mesh, specs, critic_specs
  )
  make = lambda p, cp: create_train_state(p, optimizer, critic_params=cp, critic_optimizer=critic_optimizer)
  state = with_shardings(jax.eval_shape(make, params, critic_params), state_sh)
  update = PolicyUpdate(
    ModelParts(graphdef, rest, optimizer, critic_graphdef, critic_rest, critic_optimizer),
    spec,
    loss_cfg,
    spec.algorithm.estimator,
    mesh,
    state_sh,
  )
  return dict(
    graphdef=graphdef,
    params=params,
    rest=rest,
    specs=specs,
    critic_params=critic_params,
    loss_cfg=loss_cfg,
    update=update,
    state=state,
  )


def abstract_run(spec, cfg, devices, seq_len: int, images: str = "") -> AbstractRun:
  """The run's abstract values on `devices` (its training mesh and sampler sub-mesh as the
  trainer makes them), rows of `seq_len` tokens. `spec`: the run's RunSpec; `images`: a
  vision-language policy's images a row (rl/scale/aot_batches.parse_images)."""
  from agentfly_jax.models import model_class
  from agentfly_jax.rl.scale.aot_batches import row_images
  from agentfly_jax.rl.setup import trainable_filter, training_and_sampler_meshes

  mesh, sampler_mesh = training_and_sampler_meshes(spec, devices)
  rules = spec.mesh.rules
  critic = spec.algorithm.critic
  parts = _abstract_update(spec, cfg, mesh, rules, critic)
  num_params, layer_params = _parameter_counts(parts["params"], cfg.num_hidden_layers, parts["rest"])
  sampler_params, sampler_rest = parts["params"], parts["rest"]
  if sampler_mesh is not None:  # the sampler's own copy of the model there, split alike
    trainable = trainable_filter(spec, lora=False)
    _, sampler_params, sampler_rest, _ = abstract_model(model_class(cfg), cfg, sampler_mesh, rules, trainable)
  return AbstractRun(
    spec=spec,
    cfg=cfg,
    mesh=mesh,
    sampler_mesh=sampler_mesh,
    rules=rules,
    seq_len=seq_len,
    critic=critic,
    sampler_params=sampler_params,
    sampler_rest=sampler_rest,
    num_params=num_params,
    layer_params=layer_params,
    images=row_images(spec, cfg, images, seq_len),
    **parts,
  )


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
  cfg,
  num_params: int,
  layer_params: int,
  micro_rows: int,
  seq_len: int,
  chips: int,
  fsdp: int,
  critic: bool,
  *,
  expert: int = 1,
  layer_expert_params: int = 0,
  row_split: int = 0,
  trained_params: int = 0,
) -> int:
  """Hand-computed floor of a train step a chip: sharded params + grads + Adam moments (all in
  param dtype / float32; grads and moments of `trained_params` only, 0: all), one layer's weights gathered in
  the compute dtype, and with remat the inputs of every layer of one micro-batch (its rows split over
  `row_split` chips, default fsdp); x2 with a critic. A mixture of experts on `expert` > 1 chips: a chip
  gathers its E / expert experts of the layer's `layer_expert_params` (not all of them), and its tokens' k
  assignments a sparse layer, each sent and received once by all_to_all (its rows split over every chip of the
  mesh)."""
  import numpy as np

  pb, cb = np.dtype(cfg.params_dtype).itemsize, np.dtype(cfg.compute_dtype).itemsize
  state = (num_params * pb + (trained_params or num_params) * (pb + 8)) / chips
  gathered = (layer_params - layer_expert_params + layer_expert_params / expert) * cb
  acts = cfg.num_hidden_layers * -(-micro_rows // (row_split or fsdp)) * seq_len * cfg.hidden_size * cb
  exchange = 0
  if expert > 1:
    tokens = -(-micro_rows * seq_len // chips)
    exchange = 2 * tokens * cfg.num_experts_per_tok * cfg.hidden_size * cb
  return int((state + gathered + acts + exchange) * (2 if critic else 1))


def expert_layer_params(params, cfg) -> int:
  """Params of one sparse layer's experts (the kernels under `experts`, all sparse layers' / their number);
  0 for a dense model."""
  import numpy as np
  from flax import nnx

  total = sum(int(np.prod(v.shape)) for path, v in nnx.to_flat_state(params) if "experts" in path)
  return total // max(1, len(cfg.moe_layers))


def activation_row_split(run: AbstractRun, rows: int) -> int:
  """Chips a micro-batch's `rows` are split over between the layers (the rule "act_batch"'s mesh axes that
  divide them)."""
  import math

  from agentfly_jax.models.sharding import spec_for_axes

  axes = spec_for_axes(("act_batch",), (rows,), run.rules, run.mesh, where="the micro-batch rows")[0]
  axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
  return math.prod(run.mesh.shape[a] for a in axes)


def _remat_on(cfg) -> bool:
  return cfg.remat not in (False, "none", "")


# ---------------------------------------------------------------- one function per program
def _reference_params(run: AbstractRun):
  """The KL reference's params (the policy's shapes) when the loss has a KL term, else None."""
  return run.params if run.spec.loss.kl_coef > 0 else None


def compile_prepare(run: AbstractRun, chips: int) -> dict:
  """The `prepare` row: old (+ reference) log-probs, values, advantages over the rollout batch."""
  n_rows, arrays = abstract_step_arrays(run)
  ref = _reference_params(run)
  update = run.update  # the models' rest (a frozen vision tower) an argument, as the trainer calls it
  row = compile_program("prepare", update.prepare, run.params, ref, run.critic_params, arrays, update.frozen)
  row["micro_batch"] = f"{n_rows}x{run.seq_len}, chunks of {run.update.prepare_chunk} rows" + batch_note(run)
  row["model_flops"] = (
    model_flops(run.cfg, n_rows * run.seq_len, run.seq_len, backward=False, remat=False, critic=run.critic)
    * (2 if ref is not None else 1)
    / chips
  )
  return row


def train_step_memory_plan(run: AbstractRun, micro_rows: int, num_micro: int) -> dict:
  """rl/scale/memory_plan.py's estimate of the train step a chip: {"parts": bytes by part, "total",
  "inputs": the ModelShape / RunSizes / mesh it came from, so a table can be re-estimated
  (`aot.replan_table`) without compiling again}."""
  import dataclasses

  from agentfly_jax.rl.scale import memory_plan

  cfg = run.cfg
  vision_params, vision_block_params = _vision_params(run)
  depth = cfg.vision.depth if cfg.vision is not None else 0
  shape = memory_plan.ModelShape(
    num_params=run.num_params,
    num_layers=cfg.num_hidden_layers,
    hidden_size=cfg.hidden_size,
    num_heads=cfg.num_attention_heads,
    num_kv_heads=cfg.num_key_value_heads,
    head_dim=cfg.head_dim,
    vocab_size=cfg.vocab_size,
    layer_params=run.layer_params,
    tied_embeddings=cfg.tie_word_embeddings,
    layer_expert_params=expert_layer_params(run.params, cfg),
    vision_params=vision_params,
    vision_depth=depth,
    vision_block_params=vision_block_params,
    vision_heads=cfg.vision.num_heads if cfg.vision is not None else 0,
  )
  platform = run.mesh.devices.flat[0].platform
  sizes = memory_plan.RunSizes(
    scan_layers=cfg.scan_layers,
    micro_batch=micro_rows,
    micro_batches=num_micro,
    seq_len=run.seq_len,
    logits_chunk=run.spec.train.logits_chunk,
    attention_chunk=cfg.attention_chunk,
    fused_attention=cfg.attention_impl == "pallas",
    remat=_remat_on(cfg),
    compute_dtype=cfg.dtype,
    param_dtype=cfg.param_dtype,
    reference_copy=False,
    critic=run.critic,
    backend="tpu" if platform == "tpu" else "gpu",
    vision_patches=run.images.num_patches if run.images is not None else 0,
    vision_train=run.spec.model.vision.train,
  )
  inputs = {
    "model": dataclasses.asdict(shape),
    "run": dataclasses.asdict(sizes),
    "fsdp": run.fsdp,
    "tp": run.mesh.shape["tp"],
    "expert": run.mesh.shape.get("expert", 1),
    "rows": activation_row_split(run, micro_rows),
  }
  return estimate_from_inputs(inputs)


def _vision_params(run: AbstractRun) -> tuple[int, int]:
  """(parameters of a vision-language policy's tower (`visual`), trained or frozen; of one of its blocks):
  (0, 0) for a text model."""
  import numpy as np

  flat = [(path, v) for path, v in _flat_params(run.params, run.rest) if "visual" in path]
  blocks = sum(int(np.prod(v.shape)) for path, v in flat if "blocks" in path)
  return sum(int(np.prod(v.shape)) for _, v in flat), blocks // run.cfg.vision.depth if flat else 0


def estimate_from_inputs(inputs: dict) -> dict:
  """`train_step_memory_plan`'s result from its recorded "inputs" (with today's memory_plan)."""
  from agentfly_jax.rl.scale import memory_plan

  shape, sizes = memory_plan.ModelShape(**inputs["model"]), memory_plan.RunSizes(**inputs["run"])
  parts = memory_plan.per_chip_jax_parts(
    shape, sizes, fsdp=inputs["fsdp"], tp=inputs["tp"], expert=inputs.get("expert", 1), rows=inputs.get("rows", 0)
  )
  total = parts.pop("total")
  return {"parts": parts, "total": total, "inputs": inputs}


def train_step_args(run: AbstractRun) -> tuple:
  """(the step program, its abstract arguments (state, batch, frozen), micro_rows, num_micro): one minibatch of
  micro-batches [num_micro, micro_rows, ...] of what `prepare` makes (+ segment_ids, positions when packed)."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec as P

  _, arrays = abstract_step_arrays(run)
  update = run.update
  ref = _reference_params(run)
  batch_out, _ = jax.eval_shape(update.prepare, run.params, ref, run.critic_params, arrays, update.frozen)
  micro_rows, num_micro = update.minibatch_layout()
  keys = tuple(batch_out) + (("segment_ids", "positions") if run.spec.train.pack_sequences else ())
  dtypes = {**{k: v.dtype for k, v in batch_out.items()}, "segment_ids": jnp.int32, "positions": jnp.int32}
  batch_sh = NamedSharding(run.mesh, P(None, "fsdp"))
  per_row = {k: v.shape[1:] for k, v in batch_out.items()}  # [seq_len, ...], or an image array's own
  batch = {k: _sds((num_micro, micro_rows, *per_row.get(k, (run.seq_len,))), dtypes[k], batch_sh) for k in keys}
  # the models' non-trained state goes in as the step's third argument (LoRA: the frozen base)
  return update.step_program(keys), (run.state, batch, update.frozen), micro_rows, num_micro


def compile_train_step(run: AbstractRun, chips: int) -> dict:
  """The `train_step` row: the policy step (+ the critic's) on one minibatch (`train_step_args`)."""
  program, args, micro_rows, num_micro = train_step_args(run)
  seq_len = run.seq_len
  row = compile_program("train_step", program, *args)
  row["micro_batch"] = f"{num_micro}x{micro_rows}x{seq_len}" + batch_note(run)
  tokens = num_micro * micro_rows * seq_len
  row["model_flops"] = (
    model_flops(run.cfg, tokens, seq_len, backward=True, remat=_remat_on(run.cfg), critic=run.critic) / chips
  )
  moe = {"expert": run.mesh.shape.get("expert", 1), "layer_expert_params": expert_layer_params(run.params, run.cfg)}
  args = (run.cfg, run.num_params, run.layer_params, micro_rows, seq_len, chips, run.fsdp, run.critic)
  split = {"row_split": activation_row_split(run, micro_rows), "trained_params": _parameter_counts(run.params, 1)[0]}
  row["floor_bytes"] = train_step_floor(*args, **moe, **split)
  plan = train_step_memory_plan(run, micro_rows, num_micro)
  row.update(memory_plan_bytes=plan["total"], memory_plan_parts=plan["parts"], memory_plan_inputs=plan["inputs"])
  return row


def compile_sft_step(run: AbstractRun, chips: int) -> dict:
  """The `sft_step` row: the SFT warm-start step on [num_micro, micro_rows, seq_len] micro-batches."""
  import jax
  import jax.numpy as jnp

  from agentfly_jax.rl import programs as run_programs
  from agentfly_jax.rl.batching import micro_batch_layout
  from agentfly_jax.rl.core.train_state import create_train_state

  c, params = run.spec, run.params
  sft_opt = run_programs.sft_optimizer(run.spec)
  sft_sh = run_programs.train_state_sharding(params, None, sft_opt, None, run.mesh, run.specs, None)
  sft_state = with_shardings(jax.eval_shape(lambda p: create_train_state(p, sft_opt), params), sft_sh)
  step, sft_batch_sh = run_programs.sft_step_program(
    run.graphdef, run.rest, sft_opt, run.loss_cfg, run.mesh, run.rules, sft_sh, frozen=run.rest
  )
  micro_rows, num_micro = micro_batch_layout(c.sft.rows_per_step, c.train.micro_batch_size, run.fsdp)
  sft_batch = {
    k: _sds((num_micro, micro_rows, run.seq_len), jnp.int32 if k.endswith("ids") else jnp.bool_, sh)
    for k, sh in sft_batch_sh.items()
  }
  return compile_program("sft_step", step, sft_state, sft_batch, run.rest)


def compile_sampler(run: AbstractRun, chips: int) -> dict:
  """The `sampler` row: the JAX sampler's prefill + decode loop at the rollout batch, replicated
  on the sampler sub-mesh (else the training mesh)."""
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec as P

  from agentfly_jax.models.sharding import resolve_rules
  from agentfly_jax.sampling.decode import generate_rows as _generate_rows

  r = run.spec.rollout
  smesh = run.sampler_mesh or run.mesh
  rep = NamedSharding(smesh, P())
  b, p_len, n_new = r.max_batch_size, r.max_total_tokens, r.max_tokens_per_turn
  activation = None if smesh.size <= 1 else (smesh, tuple(sorted(resolve_rules(run.rules).items())))
  args = (
    _sds((b, p_len), jnp.int32, rep),
    _sds((b,), jnp.int32, rep),
    _sds((b,), jnp.float32, rep),
    _sds((b,), jnp.int32, rep),
    _sds((b,), jnp.float32, rep),
    _sds((b,), jnp.int32, rep),
    _sds((b, 8), jnp.int32, rep),
    _sds((b,), jnp.uint32, rep),
  )
  row = compile_program(
    "sampler",
    _generate_rows,
    run.graphdef,
    run.sampler_params,
    run.sampler_rest,
    *args,
    num_new_bucket=n_new,
    activation=activation,
  )
  row["micro_batch"] = f"{b} rows, prompt {p_len} + {n_new} new"
  return row


def compile_weight_sync(run: AbstractRun, chips: int) -> dict:
  """The `weight_sync` row: the copy of the params from the trainer's shardings to the sampler's.
  On one mesh it is a compiled resharding program; with the sampler on its own devices
  (config.mesh.sampler_devices) the run moves them with `jax.device_put` (rl/stages.py
  SamplerWeights), a transfer and no XLA program: the row gives what a trainer chip sends and a
  sampler chip receives."""
  import jax

  target = jax.tree.map(lambda x: x.sharding, run.sampler_params)
  if run.sampler_mesh is None or set(run.sampler_mesh.devices.flat) == set(run.mesh.devices.flat):
    return compile_program("weight_sync", jax.jit(lambda x: x, out_shardings=target), run.params)
  sent, received = per_device_bytes(run.params), per_device_bytes(run.sampler_params)
  print(
    f"  weight_sync: a device_put between the trainer's and the sampler's devices (no program): "
    f"{sent / GIB:.2f} GiB sent a trainer chip, {received / GIB:.2f} GiB received a sampler chip",
    flush=True,
  )
  return {
    "program": "weight_sync",
    "compile_s": 0.0,
    "argument_bytes": sent,
    "output_bytes": received,
    "alias_bytes": 0,
    "temp_bytes": 0,
    "flops": 0.0,
    "transfer": True,
    "peak_bytes": max(sent, received),  # on different chips
  }


COMPILERS = {
  "prepare": compile_prepare,
  "train_step": compile_train_step,
  "sft_step": compile_sft_step,
  "sampler": compile_sampler,
  "weight_sync": compile_weight_sync,
}

"""Sharding by logical axis names: params carry names, rules map names to mesh axes.

    mesh = make_mesh(fsdp=2, tp=4)
    model = shard_model(model, mesh)              # params placed with NamedSharding per partition_specs
    specs = partition_specs(model, mesh)          # nnx.State of PartitionSpec, same tree as the params
    specs = partition_specs(model, mesh, rules={**DEFAULT_RULES, "mlp": "fsdp"})   # other rules

Each param declares the logical name of each of its dims when it is created (flax NNX metadata
`out_sharding`, see `param_with_axes`, as maxtext does); `rules` (config.mesh.rules) map each
logical name to a mesh axis, several mesh axes (a tuple), or None / "" (kept whole). A new module
only names its dims (and adds a rule for a new name); this file needs no edit.

DEFAULT_RULES on a ('fsdp', 'tp') mesh give Megatron column/row splits + FSDP, vocab-split
embeddings (kernel layout [in, out]):
  embed_tokens.embedding [V, D]   ('vocab', 'embed')        -> ('tp', 'fsdp')
  q_proj kernel [D, H*hd]         ('embed', 'q_heads')      -> ('fsdp', 'tp'); bias ('tp',)
  k/v_proj kernel [D, KVH*hd]     ('embed', 'kv_heads')     -> ('fsdp', 'tp'); bias ('tp',)
  o_proj kernel [H*hd, D]         ('q_heads_in', 'embed_out') -> (('tp', 'fsdp'), None); bias ('embed_vector',) -> (None,)
  gate/up_proj kernel [D, I]      ('embed', 'mlp')          -> ('fsdp', 'tp'); bias ('tp',)
  down_proj kernel [I, D]         ('mlp_in', 'embed_out')   -> (('tp', 'fsdp'), None); bias (None,)
    (when tp * fsdp does not divide the first dim: ('tp', 'fsdp'), as before)
  lm_head.kernel [D, V]           ('embed', 'vocab')        -> ('fsdp', 'tp')
  score.kernel [D, 1]             ('embed', 'score')        -> ('fsdp', None); bias (None,)
  norm scales [D] / q,k norms [hd] ('embed_vector',) / ('head_dim',) -> (None,)
  LoRA lora_a [in, r] / lora_b [r, out]  (in's name, 'lora_rank') / ('lora_rank', out's name)
  scanned layers (model.scan_layers): a leading ('layers', ...) dim      -> (None, ...)
On a mesh, a dim takes the longest prefix of its rule's mesh axes that divides its size and that
no earlier dim of the same param used (none: left whole).

Activations are named the same way: the model calls `constrain(x, ("act_batch", "act_length",
"act_embed"))` at its decoder layers' inputs and outputs, attention, MLP, logits and values; it is a
no-op unless a program runs it under `with activation_sharding(mesh, rules):` (the train step,
prepare and the sampler do on a multi-device mesh), where it becomes
`jax.lax.with_sharding_constraint` by the same rules (the act_* names of DEFAULT_RULES are the
defaults for rules that lack them).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Mapping

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

AXES = ("fsdp", "tp")
EXPERT_AXIS = "expert"  # optional: a mesh has it only with expert parallelism (make_mesh(expert=n))
OPTIONAL_AXES = (EXPERT_AXIS,)  # a rule naming one a mesh lacks treats it as size 1
DEFAULT_RULES: dict[str, Any] = {
  "vocab": "tp",  # vocabulary rows of the embedding / lm_head columns
  "embed": "fsdp",  # the model width D of weight matrices (FSDP)
  "q_heads": "tp",  # query heads x head_dim (column parallel)
  "kv_heads": "tp",  # key/value heads x head_dim (column parallel)
  "mlp": "tp",  # MLP hidden width (column parallel in, row parallel out)
  # The row-parallel kernels (o_proj [H*hd, D], down_proj [I, D]) put FSDP on their first dim
  # beside tp, so their last dim D stays whole: a TPU chip pads a split last dim to 128 lanes
  # (D/fsdp = 448 at 7B on 8 chips, 80 at 32B on 64) and XLA relayouts the weights, their Adam
  # moments and gradients. D takes fsdp only where the first dim could not (`embed_out`: a mesh
  # axis an earlier dim used is not used again). Qwen2.5-7B on v5p:2x2x2: 17.57 -> 17.07 GiB a chip.
  "q_heads_in": ("tp", "fsdp"),  # o_proj's input dim
  "mlp_in": ("tp", "fsdp"),  # down_proj's input dim
  "embed_out": "fsdp",  # the model width D as the last dim of o_proj / down_proj
  "embed_vector": None,  # D-sized vectors: norm scales, row-parallel output biases (whole)
  "head_dim": None,  # q/k norm scales
  "score": None,  # the critic's value head output (size 1)
  "lora_rank": None,  # LoRA adapters' rank dim (models/lora.py; small: kept whole)
  "layers": None,  # the stacked decoder layers' leading axis (model.scan_layers)
  "vision_patch": None,  # a vision patch's pixel dims (channels, time, height, width) in the patch embedding
  # Mixture of experts (models/moe.py): experts [E, D, I] split over the optional 'expert' mesh
  # axis (expert parallel: tokens exchanged with all_to_all), their widths as the dense MLP's.
  "experts": "expert",
  "moe_mlp": "tp",
  "moe_mlp_in": ("tp", "fsdp"),
  "router": None,  # the router's E outputs (small: whole)
  # Activations (`constrain`, under `activation_sharding`): rows split over fsdp (data
  # parallel), heads / MLP hidden / vocab over tp; the model width of activations is kept whole.
  "act_batch": "fsdp",
  "act_length": None,
  "act_embed": None,
  "act_heads": "tp",
  "act_kv_heads": "tp",
  "act_mlp": "tp",
  "act_vocab": "tp",
}
ACTIVATION_AXES = ("act_batch", "act_length", "act_embed", "act_heads", "act_kv_heads", "act_mlp", "act_vocab")
HIDDEN_AXES = ("act_batch", "act_length", "act_embed")  # [B, T, D] between the decoder layers
_METADATA_KEY = "out_sharding"  # flax NNX's sharding metadata (the logical names here)


def param_with_axes(value: jax.Array, axes: tuple | None) -> nnx.Param:
  """An nnx.Param of `value` whose dims carry the logical names `axes` (one per dim; None: a
  plain, unnamed Param); it is not placed anywhere here (`shard_model` / `partition_specs` apply
  the rules)."""
  if axes is None:
    return nnx.Param(value)
  axes = tuple(axes)
  if len(axes) != np.ndim(value):
    raise ValueError(f"logical axes {axes} do not fit a param of shape {np.shape(value)}")
  return nnx.Param(value, **{_METADATA_KEY: axes}, eager_sharding=False)


def logical_axes(var) -> tuple | None:
  """The logical axis names a param (nnx.Variable) was created with, or None."""
  names = var.get_metadata().get(_METADATA_KEY) if isinstance(var, nnx.Variable) else None
  return None if names is None else tuple(names)


def resolve_rules(rules: Mapping | None = None) -> dict[str, tuple]:
  """{logical name: tuple of mesh axes} from a mapping (or ConfigDict) whose values are a mesh
  axis name, a tuple/list of them, or None / "" (kept whole). None: DEFAULT_RULES. Idempotent."""
  if rules is None:
    rules = DEFAULT_RULES
  if hasattr(rules, "to_dict"):
    rules = rules.to_dict()
  out = {}
  for name, target in dict(rules).items():
    if target is None or target == "":
      out[name] = ()
    elif isinstance(target, str):
      out[name] = (target,)
    elif isinstance(target, (tuple, list)) and all(isinstance(a, str) for a in target):
      out[name] = tuple(target)
    else:
      raise ValueError(
        f"sharding rule {name!r} -> {target!r}: must be a mesh axis name, a tuple of them, or None / '' (kept whole)"
      )
  return out


def spec_for_axes(
  axes: tuple, shape: tuple, rules: Mapping | None = None, mesh: Mesh | None = None, *, where: str = "a param"
) -> P:
  """PartitionSpec of a param of `shape` whose dims are named `axes` under `rules`: each dim takes
  the longest prefix of its rule's mesh axes that no earlier dim used and, on `mesh`, that divides it.
  Raises ValueError naming `where` and the logical name that has no rule."""
  resolved = resolve_rules(rules)
  if len(axes) != len(shape):
    raise ValueError(f"{where}: logical axes {axes} do not fit shape {tuple(shape)}")
  sizes = None if mesh is None else dict(mesh.shape)
  used, spec = set(), []
  for name, dim in zip(axes, shape):
    if name is None:
      spec.append(None)
      continue
    if name not in resolved:
      raise ValueError(
        f"{where}: logical axis {name!r} has no sharding rule (config.mesh.rules); known names: {sorted(resolved)}"
      )
    targets = resolved[name]
    if sizes is not None:
      targets = tuple(a for a in targets if a in sizes or a not in OPTIONAL_AXES)
      unknown = [a for a in targets if a not in sizes]
      if unknown:
        raise ValueError(
          f"{where}: rule {name!r} -> {targets} names mesh axes {unknown} not in the mesh {tuple(sizes)}"
        )
    # the longest prefix of the rule's mesh axes that no earlier dim used and (on a mesh) divides the dim
    while targets and (
      used.intersection(targets) or (sizes is not None and dim % int(np.prod([sizes[a] for a in targets])))
    ):
      targets = targets[:-1]
    used.update(targets)
    spec.append(None if not targets else targets[0] if len(targets) == 1 else targets)
  return P(*spec)


def partition_spec_of(path: tuple, var, rules: Mapping | None = None, mesh: Mesh | None = None) -> P:
  """PartitionSpec of the param `var` at `path` (for error messages) from its logical names."""
  where = "parameter " + "/".join(map(str, path))
  axes = logical_axes(var)
  if axes is None:
    raise ValueError(
      f"{where} has no logical axis names: create it with "
      "agentfly_jax.models.sharding.param_with_axes (or nnx.Param(..., out_sharding=names))"
    )
  return spec_for_axes(axes, tuple(var.shape), rules, mesh, where=where)


def partition_specs(model, mesh: Mesh | None = None, rules: Mapping | None = None) -> nnx.State:
  """nnx.State of PartitionSpec with the same tree as `nnx.state(model, nnx.Param)` (`model`: a
  module or a State of its params)."""
  state = model if isinstance(model, nnx.State) else nnx.state(model, nnx.Param)
  resolved = resolve_rules(rules)
  return nnx.from_flat_state(
    [(path, partition_spec_of(path, var, resolved, mesh)) for path, var in nnx.to_flat_state(state)]
  )


def make_mesh(fsdp: int = 1, tp: int = 1, devices=None, *, expert: int = 1) -> Mesh:
  """A ('fsdp', 'tp') mesh over the first fsdp * tp devices (fsdp=-1: all devices / (tp * expert));
  with `expert` > 1 an ('fsdp', 'expert', 'tp') mesh of fsdp * expert * tp devices (expert
  parallelism for mixture-of-experts models: rule "experts" -> 'expert'; rows split over fsdp and
  expert)."""
  devices = list(jax.devices() if devices is None else devices)
  if fsdp == -1:
    fsdp = len(devices) // (tp * expert)
  n = fsdp * tp * expert
  if fsdp < 1 or tp < 1 or expert < 1 or n > len(devices):
    raise ValueError(f"make_mesh: fsdp={fsdp} x expert={expert} x tp={tp} needs {n} devices, have {len(devices)}")
  if expert == 1:
    grid = np.array(devices[:n], dtype=object).reshape(fsdp, tp)
    return Mesh(grid, AXES, axis_types=(jax.sharding.AxisType.Auto,) * 2)
  grid = np.array(devices[:n], dtype=object).reshape(fsdp, expert, tp)
  return Mesh(grid, ("fsdp", EXPERT_AXIS, "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 3)


def shard_model(model, mesh: Mesh, rules: Mapping | None = None):
  """Places every param of `model` (in place) with NamedSharding(mesh, its partition spec under
  `rules`); returns the model."""
  state = nnx.state(model, nnx.Param)
  specs = partition_specs(state, mesh, rules)
  shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs, is_leaf=lambda x: isinstance(x, P))
  nnx.update(model, place(state, shardings))
  return model


def place(tree, shardings):
  """`jax.device_put(tree, shardings)` that also works across processes: there each global
  array is assembled from this process's (identical) host values of its addressable shards
  (device_put of a local array onto a replicated multi-process sharding gives a broken array in
  jax 0.10)."""
  if jax.process_count() == 1:
    return jax.device_put(tree, shardings)

  def one(sharding, x):
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

  # shardings is a prefix of tree (a NamedSharding may stand for a whole nnx.Variable)
  return jax.tree.map(
    lambda sh, sub: jax.tree.map(lambda x: one(sh, x), sub),
    shardings,
    tree,
    is_leaf=lambda x: isinstance(x, jax.sharding.Sharding),
  )


_ACTIVE = threading.local()  # (mesh, resolved rules) of the innermost `activation_sharding`


@contextlib.contextmanager
def activation_sharding(mesh: Mesh | None, rules: Mapping | None = None):
  """Within this context (entered inside a traced function), `constrain` pins activations to
  `mesh` by `rules` (their act_* names; missing ones from DEFAULT_RULES). `mesh` None or of one
  device: nothing is constrained (single-device code is unchanged)."""
  previous = getattr(_ACTIVE, "value", None)
  if mesh is None or mesh.size <= 1:
    _ACTIVE.value = None
  else:
    defaults = {k: v for k, v in resolve_rules(DEFAULT_RULES).items() if k in ACTIVATION_AXES}
    _ACTIVE.value = (mesh, {**defaults, **resolve_rules(rules)})
  try:
    yield
  finally:
    _ACTIVE.value = previous


def active_mesh_specs(*arrays: tuple) -> tuple | None:
  """(mesh, [PartitionSpec per (logical axes, shape) pair]) under the active
  `activation_sharding`, by its rules; None outside one (for code that must split work by hand,
  e.g. a kernel under `shard_map`)."""
  active = getattr(_ACTIVE, "value", None)
  if active is None:
    return None
  mesh, rules = active
  return mesh, [spec_for_axes(tuple(axes), tuple(shape), rules, mesh, where="an activation") for axes, shape in arrays]


def active_rules() -> tuple | None:
  """(mesh, resolved rules) of the active `activation_sharding`, or None outside one."""
  return getattr(_ACTIVE, "value", None)


def constrain(x: jax.Array, axes: tuple) -> jax.Array:
  """`x` with its sharding constrained to the logical `axes` (one name or None per dim) under the
  active `activation_sharding`; `x` unchanged outside one."""
  active = active_mesh_specs((axes, x.shape))
  if active is None:
    return x
  mesh, (spec,) = active
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

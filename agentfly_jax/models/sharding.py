"""Partition rules on a ('fsdp', 'tp') mesh: Megatron column/row splits + FSDP, vocab-split embeddings.

    mesh = make_mesh(fsdp=2, tp=4)
    model = shard_model(model, mesh)        # params placed with NamedSharding per partition_specs
    specs = partition_specs(model, mesh)    # nnx.State of PartitionSpec, same tree as the params

Rules (kernel layout [in, out]):
  embed_tokens.embedding [V, D]            -> ('tp', 'fsdp')   vocab split over tp
  q/k/v_proj, gate/up_proj kernel [D, out] -> ('fsdp', 'tp')   column parallel; bias ('tp',)
  o_proj, down_proj kernel [in, D]         -> ('tp', 'fsdp')   row parallel; bias (None,)
  lm_head.kernel [D, V]                    -> ('fsdp', 'tp')
  score.kernel [D, 1]                      -> ('fsdp', None);  score.bias (None,)
  norm scales [D]                          -> (None,)
A dimension whose size the mesh axis does not divide is left unsplit (None) on that mesh.
"""
from __future__ import annotations

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

AXES = ("fsdp", "tp")
_COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "lm_head")
_ROW = ("o_proj", "down_proj")


def rule_for(path: tuple) -> tuple:
  """The partition rule (tuple of axis names / None, one per dim) for a param path."""
  names = [str(p) for p in path]
  leaf, owner = names[-1], names[-2] if len(names) > 1 else ""
  if leaf == "embedding":
    return ("tp", "fsdp")
  if leaf == "scale":
    return (None,)
  if owner in _COLUMN:
    return ("fsdp", "tp") if leaf == "kernel" else ("tp",)
  if owner in _ROW:
    return ("tp", "fsdp") if leaf == "kernel" else (None,)
  if owner == "score":
    return ("fsdp", None) if leaf == "kernel" else (None,)
  raise KeyError(f"no partition rule for parameter {'/'.join(names)}")


def partition_spec_for(path: tuple, shape: tuple, mesh: Mesh | None = None) -> P:
  """PartitionSpec for a param at `path` with `shape`; on `mesh`, axes that do not divide the
  dimension are dropped."""
  rule = rule_for(path)
  if len(rule) != len(shape):
    raise ValueError(f"rule {rule} for {'/'.join(map(str, path))} does not fit shape {shape}")
  if mesh is not None:
    rule = tuple(ax if ax is None or dim % mesh.shape[ax] == 0 else None for ax, dim in zip(rule, shape))
  return P(*rule)


def partition_specs(model, mesh: Mesh | None = None) -> nnx.State:
  """nnx.State of PartitionSpec with the same tree as `nnx.state(model, nnx.Param)`."""
  state = nnx.state(model, nnx.Param)
  return nnx.from_flat_state([(path, partition_spec_for(path, tuple(var.shape), mesh))
                              for path, var in nnx.to_flat_state(state)])


def make_mesh(fsdp: int = 1, tp: int = 1, devices=None) -> Mesh:
  """A ('fsdp', 'tp') mesh over the first fsdp * tp devices (fsdp=-1: all devices / tp)."""
  devices = list(jax.devices() if devices is None else devices)
  if fsdp == -1:
    fsdp = len(devices) // tp
  if fsdp < 1 or tp < 1 or fsdp * tp > len(devices):
    raise ValueError(f"make_mesh: fsdp={fsdp} x tp={tp} needs {fsdp * tp} devices, have {len(devices)}")
  grid = np.array(devices[: fsdp * tp], dtype=object).reshape(fsdp, tp)
  return Mesh(grid, AXES, axis_types=(jax.sharding.AxisType.Auto,) * 2)


def shard_model(model, mesh: Mesh):
  """Places every param of `model` (in place) with NamedSharding(mesh, its partition spec);
  returns the model."""
  state = nnx.state(model, nnx.Param)
  specs = partition_specs(model, mesh)
  shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs,
                           is_leaf=lambda x: isinstance(x, P))
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
  return jax.tree.map(lambda sh, sub: jax.tree.map(lambda x: one(sh, x), sub), shardings, tree,
                      is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))

"""Converting states between the unrolled and the scanned (stacked) layer layouts.

    scanned_params = stack_layers(unrolled_params)       # model.layers.<i>.x [..] -> model.layers.x [L, ..]
    unrolled_params = unstack_layers(scanned_params)     # the inverse
    stack_layers(train_state)                            # every nnx.State inside a pytree (params, Adam moments)
    for path, value in per_layer(path, value): ...       # a stacked param as one (path, value) per layer

Unrolled (`ModelConfig.scan_layers=False`): paths ('model', 'layers', i, 'self_attn', 'q_proj',
'kernel'), kernel [in, out]. Scanned: ('model', 'layers', 'self_attn', 'q_proj', 'kernel'),
kernel [L, in, out] whose first logical axis is "layers". A Qwen2.5-VL vision tower's blocks stack the
same way under their own attribute (('visual', 'blocks', i, ...) <-> ('visual', 'blocks', ...) [depth, ...],
logical axis "layers" too), so a VL state converts as one. Leaves may be arrays (jax / numpy) or
abstract `jax.ShapeDtypeStruct`s (their NamedSharding gains / loses a leading unsplit dim), so an
abstract restore target of either layout can be made from one of the other.
"""

from __future__ import annotations

from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

LAYERS = "layers"  # the decoder layers' module attribute and every stacked axis' logical name
STACKED_ATTRS = (LAYERS, "blocks")  # module attributes whose children stack: decoder layers, vision blocks
_METADATA_KEY = "out_sharding"


def _layers_at(path: tuple) -> int | None:
  """Index of the "layers" (or a vision tower's "blocks") element of `path`, or None."""
  for j, key in enumerate(path[:-1]):
    if str(key) in STACKED_ATTRS:
      return j
  return None


def _is_layer_index(key) -> bool:
  return isinstance(key, (int, np.integer)) or (isinstance(key, str) and key.isdigit())


def is_stacked_path(path: tuple) -> bool:
  """True for a scanned model's stacked param path (('model', 'layers', 'mlp', ...) or ('visual', 'blocks',
  'mlp', ...), no index)."""
  j = _layers_at(path)
  return j is not None and not _is_layer_index(path[j + 1])


def is_unrolled_path(path: tuple) -> bool:
  """True for an unrolled model's per-layer path (('model', 'layers', 3, 'mlp', ...), ('visual', 'blocks', 3,
  ...))."""
  j = _layers_at(path)
  return j is not None and _is_layer_index(path[j + 1])


def per_layer(path: tuple, value) -> Iterator[tuple[tuple, Any]]:
  """(path, value) as it is, or for a stacked path one (path with the layer index, value[i])
  per layer: the unrolled names HF import/export and weight syncs use."""
  if not is_stacked_path(path):
    yield path, value
    return
  j = _layers_at(path)
  for i in range(value.shape[0]):
    yield path[: j + 1] + (i,) + path[j + 1 :], value[i]


def _stack_values(values: list):
  first = values[0]
  if isinstance(first, jax.ShapeDtypeStruct):
    sharding = first.sharding
    if isinstance(sharding, NamedSharding):
      sharding = NamedSharding(sharding.mesh, P(None, *sharding.spec))
    return jax.ShapeDtypeStruct((len(values),) + tuple(first.shape), first.dtype, sharding=sharding)
  if isinstance(first, np.ndarray):
    return np.stack(values)
  return jnp.stack(values)


def _unstack_value(value, n: int) -> list:
  if isinstance(value, jax.ShapeDtypeStruct):
    sharding = value.sharding
    if isinstance(sharding, NamedSharding):
      sharding = NamedSharding(sharding.mesh, P(*tuple(sharding.spec)[1:]))
    return [jax.ShapeDtypeStruct(tuple(value.shape[1:]), value.dtype, sharding=sharding)] * n
  return [value[i] for i in range(n)]


def _rewrap(leaf, value, axes_change):
  """`leaf` (an nnx.Variable or a bare value) with `value`, its logical axes changed."""
  if not isinstance(leaf, nnx.Variable):
    return value
  axes = leaf.get_metadata().get(_METADATA_KEY)
  if axes is None:
    return leaf.replace(value=value)
  return leaf.replace(value=value, **{_METADATA_KEY: axes_change(tuple(axes))})


def _value(leaf):
  return leaf.get_raw_value() if isinstance(leaf, nnx.Variable) else leaf


def _stack_state(state: nnx.State) -> nnx.State:
  out, groups = [], {}
  for path, leaf in nnx.to_flat_state(state):
    if not is_unrolled_path(path):
      out.append((path, leaf))
      continue
    j = _layers_at(path)
    key = (path[: j + 1], path[j + 2 :])
    groups.setdefault(key, {})[int(path[j + 1])] = leaf
  for (prefix, suffix), by_index in groups.items():
    n = len(by_index)
    if sorted(by_index) != list(range(n)):
      raise ValueError(
        f"stack_layers: {'/'.join(map(str, prefix + ('<i>',) + suffix))} has layers "
        f"{sorted(by_index)}, expected 0..{n - 1}"
      )
    leaves = [by_index[i] for i in range(n)]
    stacked = _stack_values([_value(leaf) for leaf in leaves])
    out.append((prefix + suffix, _rewrap(leaves[0], stacked, lambda axes: (LAYERS,) + axes)))
  return nnx.from_flat_state(out)


def _unstack_state(state: nnx.State) -> nnx.State:
  out = []
  for path, leaf in nnx.to_flat_state(state):
    if not is_stacked_path(path):
      out.append((path, leaf))
      continue
    j = _layers_at(path)
    value = _value(leaf)
    for i, part in enumerate(_unstack_value(value, value.shape[0])):
      drop = lambda axes: axes[1:] if axes and axes[0] == LAYERS else axes
      out.append((path[: j + 1] + (i,) + path[j + 1 :], _rewrap(leaf, part, drop)))
  return nnx.from_flat_state(out)


def _map_states(tree, fn):
  return jax.tree.map(
    lambda x: fn(x) if isinstance(x, nnx.State) else x, tree, is_leaf=lambda x: isinstance(x, nnx.State)
  )


def stack_layers(tree):
  """`tree` (an nnx.State, or any pytree holding them: a TrainState with its optimizer moments)
  with every unrolled decoder layer's (and vision block's) variables stacked on a new leading axis (scanned
  layout)."""
  return _map_states(tree, _stack_state)


def unstack_layers(tree):
  """The inverse of `stack_layers`: every stacked variable split into one per layer."""
  return _map_states(tree, _unstack_state)


def _key_str(key) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def tree_layout(tree) -> str | None:
  """ "scanned" / "unrolled" when any path of `tree` (a pytree, or orbax's tree metadata) holds
  stacked / per-layer decoder (or vision block) variables; None when it holds none."""
  for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]:
    keys = tuple(_key_str(k) for k in path)
    if is_unrolled_path(keys):
      return "unrolled"
    if is_stacked_path(keys):
      return "scanned"
  return None


def to_layout(tree, layout: str | None):
  """`tree` converted to `layout` ("scanned" | "unrolled"; None or its own layout: unchanged)."""
  have = tree_layout(tree)
  if layout is None or have is None or have == layout:
    return tree
  if layout == "scanned":
    return stack_layers(tree)
  if layout == "unrolled":
    return unstack_layers(tree)
  raise ValueError(f"to_layout: layout must be 'scanned' or 'unrolled', got {layout!r}")

"""Rematerialisation (activation checkpointing) of the decoder layers, by policy name.

    call = layer_call(fn, "dots_saveable")    # fn(layer, x, ...) under nnx.remat with that policy
    body = scan_body(fn, "full")              # a pure fn (a lax.scan body) under jax.checkpoint
    call = checkpointed(fn, "full")           # a pure fn(layer state, ...) under jax.checkpoint

Names: "none" (keep every activation for the backward pass), "full" (keep only each layer's
inputs, recompute the rest: `jax.checkpoint` without a policy), or any policy of
`jax.checkpoint_policies` that needs no arguments (`remat_policies()`: dots_saveable,
nothing_saveable, everything_saveable, checkpoint_dots, dots_with_no_batch_dims_saveable, ...).
The booleans of older configs still work: False = "none", True = "full".
"""

from __future__ import annotations

import functools
import inspect

import jax
from flax import nnx


def remat_policies() -> tuple[str, ...]:
  """The accepted names: "none", "full" and jax.checkpoint_policies' argument-free policies
  (those taking (prim, *args, **params); factories such as save_only_these_names are left out)."""
  names = []
  for name in dir(jax.checkpoint_policies):
    fn = getattr(jax.checkpoint_policies, name)
    if name.startswith("_") or not callable(fn):
      continue
    try:
      kinds = [p.kind for p in inspect.signature(fn).parameters.values()]
    except (TypeError, ValueError):
      continue
    if inspect.Parameter.VAR_KEYWORD in kinds and inspect.Parameter.VAR_POSITIONAL in kinds:
      names.append(name)
  return ("none", "full", *sorted(names))


def remat_name(remat: bool | str) -> str:
  """The policy name of a config value (False / "" -> "none", True -> "full"); ValueError naming
  the known policies for an unknown one."""
  if remat is False or remat is None or remat == "":
    return "none"
  if remat is True:
    return "full"
  if isinstance(remat, str) and remat in remat_policies():
    return remat
  raise ValueError(f"unknown remat policy {remat!r}; known: {remat_policies()}")


@functools.lru_cache(maxsize=None)
def _wrapped(fn, name: str):
  if name == "none":
    return fn
  if name == "full":
    return nnx.remat(fn)
  return nnx.remat(fn, policy=getattr(jax.checkpoint_policies, name))


def layer_call(fn, remat: bool | str):
  """`fn` rematerialised with the policy `remat` (a name or a bool, see the module doc)."""
  return _wrapped(fn, remat_name(remat))


def checkpointed(fn, remat: bool | str, *, prevent_cse: bool = True):
  """The pure function `fn` (a decoder layer applied to its split state) under `jax.checkpoint`
  with the policy `remat` (unchanged for "none"). Pure, unlike `layer_call`'s nnx.remat, so it
  also runs on a layer merged outside an enclosing transform (prepare's lax.map)."""
  name = remat_name(remat)
  if name == "none":
    return fn
  policy = None if name == "full" else getattr(jax.checkpoint_policies, name)
  return jax.checkpoint(fn, policy=policy, prevent_cse=prevent_cse)


def scan_body(fn, remat: bool | str):
  """`checkpointed` for the body of the scanned decoder layers: prevent_cse=False (inside
  lax.scan CSE cannot merge the recomputation away; jax's advice)."""
  return checkpointed(fn, remat, prevent_cse=False)

"""Argument checks shared by `advantages` and `losses` (private).

Shapes and names are static under `jax.jit`, so these checks run at trace time and raise a
ValueError that names the function and the argument. Shape checks go through chex so the
public boundary is asserted the same way as the rest of the project.
"""

from __future__ import annotations

from typing import Any, Iterable

import chex
import jax.numpy as jnp


def float_array(fn: str, name: str, x: Any) -> jnp.ndarray:
  """`x` as a floating jax array (ints/bools become float32); ValueError naming `name`."""
  if x is None:
    raise ValueError(f"{fn}: argument `{name}` is required, got None")
  try:
    x = jnp.asarray(x)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{fn}: argument `{name}` is not an array: {e}") from e
  if not jnp.issubdtype(x.dtype, jnp.floating):
    x = x.astype(jnp.float32)
  return x


def int_array(fn: str, name: str, x: Any) -> jnp.ndarray:
  """`x` as an integer jax array; ValueError naming `name` for any other dtype."""
  if x is None:
    raise ValueError(f"{fn}: argument `{name}` is required, got None")
  x = jnp.asarray(x)
  if not jnp.issubdtype(x.dtype, jnp.integer):
    raise ValueError(f"{fn}: argument `{name}` must hold integers, got dtype {x.dtype}")
  return x


def mask_array(fn: str, name: str, x: Any) -> jnp.ndarray:
  """A 0/1 mask (bool, int or float) as float32."""
  if x is None:
    raise ValueError(f"{fn}: argument `{name}` is required, got None")
  return jnp.asarray(x).astype(jnp.float32)


def check_rank(fn: str, name: str, x: jnp.ndarray, rank: int, dims: str) -> None:
  """ValueError unless `x.ndim == rank`; `dims` names the expected axes, e.g. "[B, T]"."""
  try:
    chex.assert_rank(x, rank)
  except AssertionError as e:
    raise ValueError(f"{fn}: argument `{name}` must be {dims} (rank {rank}), got shape {tuple(x.shape)}") from e


def check_shape(fn: str, name: str, x: jnp.ndarray, shape: tuple[int, ...], like: str) -> None:
  """ValueError unless `x.shape == shape` (the shape of argument `like`)."""
  try:
    chex.assert_shape(x, shape)
  except AssertionError as e:
    raise ValueError(
      f"{fn}: argument `{name}` must have the shape of `{like}` {tuple(shape)}, got {tuple(x.shape)}"
    ) from e


def check_choice(fn: str, name: str, value: Any, choices: Iterable[str]) -> None:
  """ValueError unless `value` is one of `choices` (listed in the message)."""
  choices = tuple(choices)
  if value not in choices:
    raise ValueError(f"{fn}: unknown {name} {value!r}; known: {', '.join(choices)}")

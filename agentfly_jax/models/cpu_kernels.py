"""The CPU-only kernels of the dense layers, behind one switch (`active()`).

XLA:CPU leaves speed on the table in three places the model's plain path (layers.Linear: one
`lax.dot_general` over the kernel's logical axes, as MaxText's dense layer) would hit; on another
backend XLA's own kernels do better and the plain path runs:

- `dense`: the same product with its backward pass written out. Left to autodiff, XLA:CPU wrote dy
  transposed ([out, tokens]) in the producing fusion and ran the weight-gradient GEMM with its own
  emitter at under half of torch's rate; written as one 2-D GEMM contracting the token dim of both
  operands, a SmolLM2-sized MLP block's forward + backward takes ~0.7x the time
  (lab/results/bench_train_step_ab_dense.md).
- `fused_linear`: q/k/v and gate/up each as one GEMM over their concatenated kernels when a call has
  >= FUSE_MIN_ROWS tokens (training, prefill; not decode, which is bound by reading the weights):
  a faster train step (lab/results/cpu_code_paths/README.md). `ModelConfig.fuse_projections=False`
  opts a model out.
- the [out, in] kernel layout (`decode_layout()`: the JAX sampler's decode copy, made by
  `layers.set_kernel_layout`): XLA's CPU GEMMs at decode sizes (8-32 rows) run faster reading each output's
  weights as one contiguous row (lab/results/cpu_code_paths/README.md). Training and checkpoints keep
  [in, out].

The switch: on when JAX's default backend is the CPU, unless AGENTFLY_CPU_KERNELS=0 (=1 forces it on);
`forced(flag)` sets it for a block (tests, A/Bs). It is read when a function is traced.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os

import jax
import jax.numpy as jnp

KERNEL_LAYOUTS = ("in_out", "out_in")
FUSE_MIN_ROWS = 256  # fused projections concatenate their kernels per call: worth it from this many rows

_forced: list[bool] = []


def active() -> bool:
  """Whether the CPU kernels run (read at trace time)."""
  if _forced:
    return _forced[-1]
  env = os.environ.get("AGENTFLY_CPU_KERNELS", "")
  if env in ("0", "1"):
    return env == "1"
  return jax.default_backend() == "cpu"


@contextlib.contextmanager
def forced(flag: bool):
  """The switch set to `flag` inside the block (functions traced there keep what they saw)."""
  _forced.append(bool(flag))
  try:
    yield
  finally:
    _forced.pop()


def plain_dense(x: jax.Array, kernel: jax.Array, in_out: bool, precision) -> jax.Array:
  """x [..., in] @ kernel ([in, out] when `in_out`, else [out, in]) -> [..., out], one dot_general."""
  return jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0 if in_out else 1,)), ((), ())), precision=precision)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def dense(x: jax.Array, kernel: jax.Array, in_out: bool, precision) -> jax.Array:
  """`plain_dense` with its backward written out: dx = dy @ W^T, and the weight gradient as one 2-D
  GEMM over the flattened tokens (x2^T dy2, or dy2^T x2 for an [out, in] kernel)."""
  return plain_dense(x, kernel, in_out, precision)


def _dense_fwd(x, kernel, in_out, precision):
  return plain_dense(x, kernel, in_out, precision), (x, kernel)


def _dense_bwd(in_out, precision, res, dy):
  x, kernel = res
  dx = jax.lax.dot_general(dy, kernel, (((dy.ndim - 1,), (1 if in_out else 0,)), ((), ())), precision=precision)
  x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
  tokens = (((0,), (0,)), ((), ()))
  dk = (
    jax.lax.dot_general(x2, dy2, tokens, precision=precision)
    if in_out
    else jax.lax.dot_general(dy2, x2, tokens, precision=precision)
  )
  return dx.astype(x.dtype), dk.astype(kernel.dtype)


dense.defvjp(_dense_fwd, _dense_bwd)


def matmul(x: jax.Array, kernel: jax.Array, in_out: bool, precision) -> jax.Array:
  """The dense layer's product: `dense` when the switch is on, else `plain_dense`."""
  return (dense if active() else plain_dense)(x, kernel, in_out, precision)


def fuses(x: jax.Array, fuse_projections: bool) -> bool:
  """Whether `project` runs the Linears of x as one GEMM (static shapes: decided at trace time)."""
  return fuse_projections and active() and math.prod(x.shape[:-1]) >= FUSE_MIN_ROWS


def fused_linear(x: jax.Array, linears) -> list[jax.Array]:
  """The `layers.Linear`s (same input width, layout and dtype) applied to x [..., in] as one GEMM over
  their concatenated kernels: [..., out_i] each, equal to [l(x) for l in linears]. The params stay
  separate (the concatenation is part of the step; its gradient is a split). LoRA adapters of the
  Linears are added to their outputs (the x A's as one GEMM too)."""
  first = linears[0]
  in_out = first.kernel_layout == "in_out"
  kernel = jnp.concatenate([l.kernel[...] for l in linears], axis=1 if in_out else 0).astype(first.dtype)
  y = matmul(x.astype(first.dtype), kernel, in_out, first.precision)
  if any(l.bias is not None for l in linears):
    y = y + jnp.concatenate(
      [
        jnp.zeros((l.out_features,), first.dtype) if l.bias is None else l.bias[...].astype(first.dtype)
        for l in linears
      ]
    )
  splits = [sum(l.out_features for l in linears[: i + 1]) for i in range(len(linears) - 1)]
  outs = jnp.split(y, splits, axis=-1)
  adapted = [i for i, l in enumerate(linears) if l.lora_a is not None]
  if adapted:  # every x A_i as one GEMM over the concatenated A's, then each B_i
    a = jnp.concatenate([linears[i].lora_a[...] for i in adapted], axis=-1).astype(first.dtype)
    xa = matmul(x.astype(first.dtype), a, True, first.precision)
    ranks = [linears[i].lora_a.shape[-1] for i in adapted]
    parts = jnp.split(xa, [sum(ranks[: j + 1]) for j in range(len(ranks) - 1)], axis=-1)
    for i, part in zip(adapted, parts):
      l = linears[i]
      delta = matmul(part, l.lora_b[...].astype(first.dtype), True, first.precision)
      outs[i] = outs[i] + delta * jnp.asarray(l.lora_scale, first.dtype)
  return outs


def decode_layout() -> str:
  """The kernel layout a sampler's decode copy takes by default ("auto"): "out_in" when the switch is on."""
  return "out_in" if active() else "in_out"

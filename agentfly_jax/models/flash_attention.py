"""Causal self-attention (no KV cache) with a flash-style custom VJP, one block of queries at a time.

    out = flash_causal_attention(q, k, v, mask, num_kv_heads=3, chunk=256, dtype=jnp.float32)

Same maths and arguments as `layers.attend` (k [B*KVH, T, hd], unmasked scores in float32, the
softmax over keys, masked keys get `_MASK_VALUE`), but:
  * query block [s, e) reads keys [0, e) only: with a causal mask the upper triangle past the
    block is never computed (T=2048, chunk=256: 56 % of the square instead of all of it);
  * the forward keeps only the output and two per-row softmax statistics (float32 [B*KVH, G, T]); no
    [B, H, T, T] scores or probabilities live until the backward pass;
  * the backward recomputes one block's probabilities from the saved log-sum-exp and applies the
    softmax VJP in closed form (dS = P * (dP - rowsum(dO * O))), instead of differentiating the
    max / exp / sum / divide chain XLA would otherwise rebuild under `jax.checkpoint`.

`mask` (bool[B, T, T], True = may attend) must be causal in the sense that no query attends to a
key after it when T > chunk (`build_attention_mask` makes it so, padding and packed segments
included). A row with no allowed key (a left-padding position) attends uniformly to the keys its
block reads (`attend`: to all T keys) and passes no gradient to q or k; only such padding rows
can differ from `attend`, and no real token attends to them.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)  # layers.attend uses this one too
_BATCH = ((0,), (0,))


def _blocks(t: int, chunk: int) -> list[tuple[int, int]]:
  chunk = t if chunk <= 0 else min(chunk, t)
  return [(s, min(t, s + chunk)) for s in range(0, t, chunk)]


def _scores(qb, k, mask_b, precision):
  """qb [BK, G, c, hd] (already times 1/sqrt(hd)), k [BK, e, hd], mask_b bool[B, c, e] -> masked
  float32 scores [BK, G, c, e]."""
  bk, g, c, hd = qb.shape
  s = jax.lax.dot_general(
    qb.reshape(bk, g * c, hd), k, (((2,), (2,)), _BATCH), precision=precision, preferred_element_type=jnp.float32
  )
  b = mask_b.shape[0]
  s = s.reshape(b, bk // b, g, c, -1)
  s = jnp.where(mask_b[:, None, None], s, _MASK_VALUE)
  return s.reshape(bk, g, c, -1)


def _forward(q, k, v, mask, chunk, dtype, precision):
  """q [BK, G, T, hd] (times 1/sqrt(hd)), k/v [BK, T, hd] -> (out [BK, G, T, hd] in dtype, (row max, log of the
  row's sum of exp(score - max)), each float32 [BK, G, T]). The two are kept apart, not summed
  into one log-sum-exp: for a row with no allowed key the max is the huge mask value, and
  max + log(sum) would round the log away."""
  bk, g, t, hd = q.shape
  outs, maxes, logsums = [], [], []
  for s, e in _blocks(t, chunk):
    sc = _scores(q[:, :, s:e], k[:, :e], mask[:, s:e, :e], precision)
    m = sc.max(axis=-1, keepdims=True)
    p = jnp.exp(sc - m)
    denom = p.sum(axis=-1, keepdims=True)
    o = jax.lax.dot_general(
      p.astype(dtype).reshape(bk, g * (e - s), e),
      v[:, :e],
      (((2,), (1,)), _BATCH),
      precision=precision,
      preferred_element_type=jnp.float32,
    )
    outs.append((o.reshape(bk, g, e - s, hd) / denom).astype(dtype))
    maxes.append(m[..., 0])
    logsums.append(jnp.log(denom)[..., 0])
  cat = functools.partial(jnp.concatenate, axis=2)
  return cat(outs), (cat(maxes), cat(logsums))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _attention(q, k, v, mask, chunk, dtype, precision):
  return _forward(q, k, v, mask, chunk, dtype, precision)[0]


def _attention_fwd(q, k, v, mask, chunk, dtype, precision):
  out, (row_max, row_logsum) = _forward(q, k, v, mask, chunk, dtype, precision)
  return out, (q, k, v, mask, out, row_max, row_logsum)


def _attention_bwd(chunk, dtype, precision, res, d_out):
  q, k, v, mask, out, row_max, row_logsum = res
  bk, g, t, hd = q.shape
  # rowsum(dO * O): the softmax VJP's correction term, per query row.
  delta = (d_out.astype(jnp.float32) * out.astype(jnp.float32)).sum(axis=-1)
  dq_blocks = []
  dk = jnp.zeros(k.shape, jnp.float32)
  dv = jnp.zeros(v.shape, jnp.float32)
  for s, e in _blocks(t, chunk):
    c = e - s
    qb = q[:, :, s:e]
    mask_b = mask[:, s:e, :e]
    sc = _scores(qb, k[:, :e], mask_b, precision)
    p = jnp.exp((sc - row_max[:, :, s:e, None]) - row_logsum[:, :, s:e, None])  # [BK, G, c, e]
    do = d_out[:, :, s:e].reshape(bk, g * c, hd)
    p_flat = p.reshape(bk, g * c, e)
    dv_b = jax.lax.dot_general(
      p_flat.astype(dtype), do, (((1,), (1,)), _BATCH), precision=precision, preferred_element_type=jnp.float32
    )  # [BK, e, hd]
    dp = jax.lax.dot_general(
      do, v[:, :e], (((2,), (2,)), _BATCH), precision=precision, preferred_element_type=jnp.float32
    ).reshape(bk, g, c, e)
    ds = p * (dp - delta[:, :, s:e, None])
    b = mask.shape[0]
    ds = jnp.where(mask_b[:, None, None], ds.reshape(b, bk // b, g, c, e), 0.0).reshape(bk, g * c, e)
    ds = ds.astype(dtype)
    dq_b = jax.lax.dot_general(
      ds, k[:, :e], (((2,), (1,)), _BATCH), precision=precision, preferred_element_type=jnp.float32
    )  # [BK, G*c, hd]
    dk_b = jax.lax.dot_general(
      ds, qb.reshape(bk, g * c, hd), (((1,), (1,)), _BATCH), precision=precision, preferred_element_type=jnp.float32
    )  # [BK, e, hd]
    dq_blocks.append(dq_b.reshape(bk, g, c, hd))
    dk = dk.at[:, :e].add(dk_b)
    dv = dv.at[:, :e].add(dv_b)
  dq = jnp.concatenate(dq_blocks, axis=2)  # d/d(scaled q); the 1/sqrt(hd) is applied outside
  return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), np.zeros(mask.shape, jax.dtypes.float0)


_attention.defvjp(_attention_fwd, _attention_bwd)


def flash_causal_attention(q, k, v, mask, *, num_kv_heads: int, chunk: int, dtype, precision=None):
  """Causal GQA self-attention, blocks of `chunk` queries, flash-style backward (module doc).

  Args:
    q: [B, T, H, hd] (RoPE applied); k, v: [B*KVH, T, hd]; mask: bool[B, T, T] (causal when
      T > chunk); chunk: queries per block (<= 0 or >= T: one block).
  Returns:
    [B, T, H * hd] in `dtype`, equal to `layers.attend(q, k, v, mask, keys_transposed=False)`.
  """
  b, t, h, hd = q.shape
  kvh = num_kv_heads
  g = h // kvh
  # The 1/sqrt(hd) goes on q once ([B, T, H, hd]) instead of on every block of scores (autodiff
  # carries it into dq).
  qf = (
    (q * (1.0 / math.sqrt(hd)))
    .astype(dtype)
    .reshape(b, t, kvh, g, hd)
    .transpose(0, 2, 3, 1, 4)
    .reshape(b * kvh, g, t, hd)
  )
  out = _attention(qf, k.astype(dtype), v.astype(dtype), mask, int(chunk), dtype, precision)
  return out.reshape(b, kvh, g, t, hd).transpose(0, 3, 1, 2, 4).reshape(b, t, h * hd)

"""Per-token log-probs and entropies straight from final hidden states, chunked over tokens.

    lp, ent = chunked_logprobs_entropy(hidden, weight, targets, temperature=1.0, chunk=256)

The plain route (logits = hidden @ W, then log-softmax / entropy over the vocabulary) keeps a
float32 [B, T, V] logits array alive for the backward pass, and XLA adds several more [B, T, V]
temporaries (exp, the softmax, the gradient and its transpose for dW). Here a `lax.scan` walks
`chunk` tokens at a time: the forward keeps only the per-token log-sum-exp and mean logit; the
backward (a custom VJP) recomputes each chunk's logits and turns them straight into d hidden and
an accumulated dW, so no [B, T, V] array ever exists, at the cost of one more [chunk, D] x [D, V]
matmul per chunk.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np


SUPPRESSED_LOGIT = -1e9  # a token the model never writes (ModelConfig.placeholder_token_ids): probability 0


def suppress_logits(logits: jax.Array, ids: tuple) -> jax.Array:
  """logits [..., V] with the columns `ids` (a static tuple) at SUPPRESSED_LOGIT: a softmax gives them 0 exactly; a
  finite value, so a masked-out position whose target is such an id keeps a finite log-prob (0 * lp = 0)."""
  if not ids:
    return logits
  return logits.at[..., jnp.asarray(ids)].set(SUPPRESSED_LOGIT)


def _logits(h, w, vocab_major: bool, precision):
  """h [c, D], w [V, D] (vocab_major) or [D, V] -> float32 [c, V]."""
  contract = 1 if vocab_major else 0
  return jax.lax.dot_general(
    h, w, (((1,), (contract,)), ((), ())), precision=precision, preferred_element_type=jnp.float32
  )


def _stats(h, w, tgt, temperature, vocab_major, precision, suppress=()):
  """One chunk: z = logits / T; returns (z, lse, mean z under softmax, log-prob of tgt)."""
  z = suppress_logits(_logits(h, w, vocab_major, precision) / temperature, suppress)
  top = jax.lax.stop_gradient(z.max(axis=-1, keepdims=True))
  e = jnp.exp(z - top)
  s = e.sum(axis=-1, keepdims=True)
  lse = (top + jnp.log(s))[:, 0]
  mean_z = jnp.where(e > 0, e * z, 0.0).sum(axis=-1) / s[:, 0]
  picked = jnp.take_along_axis(z, tgt[:, None], axis=-1)[:, 0]
  return z, lse, mean_z, picked - lse


def _chunks(x, chunk: int):
  """[N, ...] -> [N_pad / chunk, chunk, ...] (zero-padded at the end)."""
  n = x.shape[0]
  pad = (-n) % chunk
  x = jnp.pad(x, ((0, pad),) + ((0, 0),) * (x.ndim - 1))
  return x.reshape(-1, chunk, *x.shape[1:])


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7))
def _flat_logprobs_entropy(h, w, tgt, temperature, chunk, vocab_major, precision, suppress):
  out, _ = _fwd(h, w, tgt, temperature, chunk, vocab_major, precision, suppress)
  return out


def _fwd(h, w, tgt, temperature, chunk, vocab_major, precision, suppress):
  n = h.shape[0]

  def body(_, xs):
    hc, tc = xs
    _, lse, mean_z, lp = _stats(hc, w.astype(hc.dtype), tc, temperature, vocab_major, precision, suppress)
    return None, (lp, lse - mean_z, lse, mean_z)

  _, (lp, ent, lse, mean_z) = jax.lax.scan(body, None, (_chunks(h, chunk), _chunks(tgt, chunk)))
  flat = lambda a: a.reshape(-1)[:n]  # noqa: E731
  return (flat(lp), flat(ent)), (h, w, tgt, lse, mean_z)


def _bwd(temperature, chunk, vocab_major, precision, suppress, res, cts):
  h, w, tgt, lse, mean_z = res
  g_lp, g_ent = cts
  n = h.shape[0]
  g_lp, g_ent = _chunks(g_lp, chunk), _chunks(g_ent, chunk)

  def body(dw, xs):
    hc, tc, lse_c, mz_c, glp_c, gent_c = xs
    wc = w.astype(hc.dtype)
    z = suppress_logits(_logits(hc, wc, vocab_major, precision) / temperature, suppress)
    p = jnp.exp(z - lse_c[:, None])
    onehot = jax.nn.one_hot(tc, z.shape[-1], dtype=z.dtype)
    # d lp / dz = onehot - p;  d entropy / dz = -p (z - E_p[z])
    dz = glp_c[:, None] * (onehot - p) - gent_c[:, None] * jnp.where(p > 0, p * (z - mz_c[:, None]), 0.0)
    if suppress:  # a suppressed column is a constant, not a function of h or W
      dz = dz.at[:, jnp.asarray(suppress)].set(0.0)
    dlogits = (dz / temperature).astype(hc.dtype)
    dh = jax.lax.dot_general(
      dlogits,
      wc,
      (((1,), (0 if vocab_major else 1,)), ((), ())),
      precision=precision,
      preferred_element_type=jnp.float32,
    )
    if vocab_major:  # dW [V, D] = dlogits^T h
      dw_c = jax.lax.dot_general(
        dlogits, hc, (((0,), (0,)), ((), ())), precision=precision, preferred_element_type=jnp.float32
      )
    else:  # dW [D, V] = h^T dlogits
      dw_c = jax.lax.dot_general(
        hc, dlogits, (((0,), (0,)), ((), ())), precision=precision, preferred_element_type=jnp.float32
      )
    return dw + dw_c, dh.astype(hc.dtype)

  xs = (_chunks(h, chunk), _chunks(tgt, chunk), lse, mean_z, g_lp, g_ent)  # lse, mean_z: [chunks, chunk]
  dw, dh = jax.lax.scan(body, jnp.zeros(w.shape, jnp.float32), xs)
  return dh.reshape(-1, h.shape[-1])[:n], dw.astype(w.dtype), np.zeros(tgt.shape, jax.dtypes.float0)


_flat_logprobs_entropy.defvjp(_fwd, _bwd)


def chunked_logprobs_entropy(
  hidden: jax.Array,
  weight: jax.Array,
  targets: jax.Array,
  *,
  temperature: float = 1.0,
  chunk: int = 256,
  vocab_major: bool = True,
  precision=None,
  suppress: tuple = (),
) -> tuple[jax.Array, jax.Array]:
  """log softmax(hidden @ W / temperature)[targets] and the softmax's entropy, per token.

  Args:
    hidden: float[..., D] final hidden states (compute dtype).
    weight: the output projection, [V, D] when `vocab_major` (a tied embedding) else [D, V]
      (an untied lm_head kernel), in its param dtype (cast to hidden's dtype per chunk; its
      gradient comes back in its own dtype, summed in float32).
    targets: int[...] token ids in [0, V), the same leading shape as `hidden`.
    temperature: Python float > 0; chunk: tokens per scan step (static).
    precision: jax.lax.Precision of the matmuls.
    suppress: token ids outside the softmax (`suppress_logits`: ModelConfig.placeholder_token_ids).
  Returns:
    (logprobs float32[...], entropy float32[...]); differentiable in hidden and weight (custom
    VJP: logits are recomputed chunk by chunk in the backward pass).
  """
  if not temperature > 0:
    raise ValueError(f"chunked_logprobs_entropy: temperature must be > 0, got {temperature!r}")
  if chunk < 1:
    raise ValueError(f"chunked_logprobs_entropy: chunk must be >= 1, got {chunk!r}")
  lead = hidden.shape[:-1]
  if targets.shape != lead:
    raise ValueError(f"chunked_logprobs_entropy: targets shape {targets.shape} != hidden's leading shape {lead}")
  h = hidden.reshape(-1, hidden.shape[-1])
  tgt = targets.reshape(-1).astype(jnp.int32)
  chunk = min(chunk, max(1, h.shape[0]))
  # the weight goes in its own dtype, cast to the compute dtype chunk by chunk: its gradient is
  # summed over the chunks and returned in float32 (a cast before would round dW to bfloat16)
  suppress = tuple(int(i) for i in suppress)
  lp, ent = _flat_logprobs_entropy(
    h, weight, tgt, float(temperature), int(chunk), bool(vocab_major), precision, suppress
  )
  return lp.reshape(lead), ent.reshape(lead)


def loss_slots(length: int, fraction: float, multiple: int = 8) -> int:
  """Static per-row slot count for `at_loss_positions`: ceil(fraction * length) rounded up to
  `multiple`, at most `length`."""
  k = max(1, math.ceil(fraction * length))
  return min(length, -(-k // multiple) * multiple)


DEFAULT_CAPACITY = (0.25, 0.5, 0.75)  # config.train.logits_capacity's default (LossConfig, PrepareConfig)


def capacity_fractions(capacity) -> tuple[float, ...]:
  """A capacity (a fraction, or a sequence of them) -> the sorted distinct fractions in (0, 1);
  ValueError naming a value outside [0, 1]. 0 and 1 mean "every position" and drop out."""
  values = (capacity,) if isinstance(capacity, (int, float)) else tuple(capacity)
  for v in values:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
      raise ValueError(f"logits capacity {v!r} must be a fraction in [0, 1] (0 or 1 = every position)")
  return tuple(sorted({float(v) for v in values if 0 < v < 1}))


def at_loss_positions(fn, hidden: jax.Array, targets: jax.Array, loss_mask: jax.Array, capacity):
  """`fn(hidden, targets) -> (a, b)` per token, evaluated only where `loss_mask` is True.

  The tokens an agent wrote are often a minority of a row (the prompt, tool observations and
  padding are not trained on), and the output projection + softmax is the largest per-token cost
  after the decoder. Each row's loss positions are gathered into K = `loss_slots(L, f)` slots
  (static) for the smallest fraction f of `capacity` whose K holds every row's loss positions,
  `fn` runs on [B, K, D] instead of [B, L, D], and the results are scattered back; when no
  fraction's slots hold them, `fn` runs on all L positions. The choice is a `lax.switch` inside
  the one compiled program (no recompiles), and the result never depends on it.

  Args:
    fn: (hidden [B, K, D], targets int[B, K]) -> two float32 [B, K] arrays.
    hidden: [B, L, D]; targets: int[B, L]; loss_mask: bool[B, L]; capacity: a fraction of L in
      (0, 1) or a sequence of them (`capacity_fractions`).
  Returns:
    two float32 [B, L] arrays, `fn`'s values on the loss positions and 0 elsewhere.
  """
  b, length = targets.shape
  mask = loss_mask.astype(bool)
  slots = sorted({loss_slots(length, f) for f in capacity_fractions(capacity)} - {length})

  def full(h, tgt, m):
    x, y = fn(h, tgt)
    return jnp.where(m, x, 0.0), jnp.where(m, y, 0.0)

  if not slots:
    return full(hidden, targets, mask)

  def compact(k, h, tgt, m):
    idx = jax.vmap(lambda row: jnp.nonzero(row, size=k, fill_value=length)[0])(m)  # [B, K]; L = empty slot
    safe = jnp.minimum(idx, length - 1)
    x, y = fn(jnp.take_along_axis(h, safe[..., None], axis=1), jnp.take_along_axis(tgt, safe, axis=1))
    rows = jnp.arange(b)[:, None]
    back = lambda v: jnp.zeros((b, length), jnp.float32).at[rows, idx].set(v.astype(jnp.float32), mode="drop")  # noqa: E731
    return back(x), back(y)

  most = jnp.max(mask.sum(axis=-1))
  branch = jnp.sum(most > jnp.asarray(slots))  # the first slot count that holds `most`; len(slots) = full
  branches = [functools.partial(compact, k) for k in slots] + [full]
  return jax.lax.switch(branch, branches, hidden, targets, mask)

"""Sparse mixture-of-experts block (HF Qwen3MoeSparseMoeBlock): top-k softmax router + SwiGLU experts.

    block = SparseMoeBlock(cfg, rngs=rngs)
    y, route = block(x)                    # x [B, T, D] -> y [B, T, D], RouterOut(logits, experts)
    y, route = block(x, routed=experts)    # replayed routing: int32[B, T, k] experts (-1: the router's own)
    aux = load_balancing_loss(routes, mask, num_experts, top_k)   # HF load_balancing_loss_func

Routing (HF Qwen3MoeTopKRouter): logits = x @ gate [N, E], probs = softmax(logits) in float32, the k
largest probs and their experts; with `norm_topk_prob` the k weights are divided by their sum; the
weights are cast to the compute dtype. Each expert e is down_e(silu(gate_e(x)) * up_e(x)) and a token's
output is the weighted sum over its k experts.

Dropless: every (token, expert) assignment is computed. The N * k assignments are sorted by expert and
each projection is one grouped matmul (`grouped_matmul`: `jax.lax.ragged_dot`, on CPU blocks of one expert's
rows) over the sorted rows with the per-expert group sizes; the outputs go back to their tokens by the
inverse permutation (no scatter-add, no capacity, no loop over experts).

Expert parallelism (`expert_parallel`): under `activation_sharding` whose rule "experts" names a mesh
axis of size ep > 1, the block runs under `shard_map`: each device holds E / ep experts, routes its own
tokens, sends each assignment to the device holding its expert with one `all_to_all` (buffers sized for
the worst case, every assignment of a device to one peer, so nothing is dropped), runs its local experts
as grouped matmuls and sends the results back with a second `all_to_all`. Expert hidden widths split
over the rule "moe_mlp"'s mesh axis (a psum after the down projection).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from agentfly_jax.models.config import ModelConfig
from agentfly_jax.models.layers import Linear, linear
from agentfly_jax.models.sharding import active_rules, constrain, param_with_axes, spec_for_axes

EXPERT_AXES = {  # logical names of the expert kernels [E, in, out]
  "gate_proj": ("experts", "embed", "moe_mlp"),
  "up_proj": ("experts", "embed", "moe_mlp"),
  "down_proj": ("experts", "moe_mlp_in", "embed_out"),
}


def grouped_matmul(x: jax.Array, w: jax.Array, group_sizes: jax.Array, precision=None) -> jax.Array:
  """x [M, K] rows sorted by group, w [G, K, N], group_sizes int32[G] (rows past their sum give 0) -> [M, N]:
  row r of group g is x[r] @ w[g]. `jax.lax.ragged_dot`, except when lowered for CPU: JAX lowers ragged_dot
  there to one dense dot of every row against all G kernels (masked), G times the work; the CPU branch
  (`_blocked_matmul`) computes each row against its own kernel only (lab/results/bench_moe_train_step.md)."""
  return jax.lax.platform_dependent(
    x,
    w,
    group_sizes,
    cpu=functools.partial(_blocked_matmul, precision=precision),
    default=functools.partial(jax.lax.ragged_dot, precision=precision),
  )


def _blocked_matmul(x: jax.Array, w: jax.Array, group_sizes: jax.Array, precision=None) -> jax.Array:
  """`grouped_matmul` as one batched matmul: each group's rows padded to whole blocks of `block` rows (at
  most M / block + G blocks), every block against its group's kernel, the rows gathered back. The block
  (a power of two in [8, 256], about M / 2G) bounds the padding near M / 2 rows."""
  m, k = x.shape
  g = w.shape[0]
  block = max(8, min(256, 1 << max(0, (m // (2 * g)).bit_length() - 1)))
  nb = -(-m // block) + g
  ends = jnp.cumsum(group_sizes)
  starts = ends - group_sizes
  padded = -(-group_sizes // block) * block
  pends = jnp.cumsum(padded)
  pstarts = pends - padded
  p = jnp.arange(nb * block)  # padded rows: group pg, source row src (valid below the group's end)
  pg = jnp.minimum(jnp.searchsorted(pends, p, side="right"), g - 1)
  src = starts[pg] + p - pstarts[pg]
  valid = src < ends[pg]
  xp = jnp.where(valid[:, None], jnp.take(x, jnp.where(valid, src, 0), axis=0), 0).reshape(nb, block, k)
  y = jnp.einsum("bmk,bkn->bmn", xp, jnp.take(w, pg[::block], axis=0), precision=precision).reshape(nb * block, -1)
  r = jnp.arange(m)  # each row's place among the padded rows (rows past the groups' sum: 0)
  rg = jnp.minimum(jnp.searchsorted(ends, r, side="right"), g - 1)
  inside = r < ends[-1]
  out = jnp.take(y, jnp.where(inside, pstarts[rg] + r - starts[rg], 0), axis=0)
  return jnp.where(inside[:, None], out, 0).astype(x.dtype)


class RouterOut(NamedTuple):
  """One sparse layer's routing: logits float32[B, T, E] (the router's, before softmax) and the
  experts each token went to, int32[B, T, k] (top-k, or the replayed ones)."""

  logits: jax.Array
  experts: jax.Array


class ExpertLinear(Linear):
  """E parallel Linears without bias: kernel [E, in, out]; applied to rows sorted by expert with
  `group_sizes` int32[E] (`jax.lax.ragged_dot`). LoRA (`add_lora`, inherited): lora_a [E, in, r],
  lora_b [E, r, out], one adapter per expert. Kept in the [in, out] layout (`set_kernel_layout`
  leaves it: `transposable` False)."""

  transposable = False

  def __init__(self, num_experts: int, d_in: int, d_out: int, *, cfg: ModelConfig, rngs: nnx.Rngs, axes):
    init = nnx.initializers.normal(cfg.initializer_range)
    self.kernel = param_with_axes(init(rngs.params(), (num_experts, d_in, d_out), cfg.params_dtype), axes)
    self.bias = nnx.data(None)
    self.in_features, self.out_features = d_in, d_out
    self.dtype = cfg.compute_dtype
    # bfloat16 operands: the default precision (TPU lowers ragged_dot to a Mosaic kernel that
    # refuses an fp32 contract precision on bf16 inputs)
    self.precision = cfg.matmul_precision if jnp.dtype(cfg.compute_dtype) == jnp.float32 else None
    self.kernel_layout = "in_out"
    self.lora_a = nnx.data(None)
    self.lora_b = nnx.data(None)
    self.lora_scale = 0.0

  def __call__(self, x: jax.Array, group_sizes: jax.Array, kernel: jax.Array | None = None) -> jax.Array:
    """x [M, in] sorted by expert, group_sizes int32[E] (rows past their sum give 0) -> [M, out].
    `kernel`: this device's experts' slice (expert parallel), else the whole kernel."""
    w = (self.kernel[...] if kernel is None else kernel).astype(self.dtype)
    return grouped_matmul(x.astype(self.dtype), w, group_sizes, self.precision)

  def lora_delta_grouped(self, x, group_sizes, a=None, b=None):
    """(x A_e) B_e * scale for rows sorted by expert (a, b: this device's slices, else the whole)."""
    a = (self.lora_a[...] if a is None else a).astype(self.dtype)
    b = (self.lora_b[...] if b is None else b).astype(self.dtype)
    xa = grouped_matmul(x.astype(self.dtype), a, group_sizes, self.precision)
    return grouped_matmul(xa, b, group_sizes, self.precision) * jnp.asarray(self.lora_scale, self.dtype)


def route(logits: jax.Array, top_k: int, norm_topk_prob: bool, dtype, routed: jax.Array | None = None):
  """logits [N, E] (any float) -> (weights [N, k] in `dtype`, experts int32[N, k]).

  softmax in float32, the top k (or the `routed` int[N, k] experts, their probs gathered; a token whose
  row holds a negative id has no recorded route and takes the router's own top k), renormalised when
  `norm_topk_prob` (HF Qwen3MoeTopKRouter)."""
  probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
  top, experts = jax.lax.top_k(probs, top_k)
  if routed is not None:
    routed = routed.astype(jnp.int32)
    experts = jnp.where(jnp.all(routed >= 0, axis=-1, keepdims=True), routed, experts)
    top = jnp.take_along_axis(probs, experts, axis=-1)
  if norm_topk_prob:
    top = top / jnp.sum(top, axis=-1, keepdims=True)
  return top.astype(dtype), experts.astype(jnp.int32)


def _sort_by_expert(experts: jax.Array, num_experts: int):
  """experts int32[N, k] -> (order int32[N*k]: assignments sorted by expert (stable), group sizes
  int32[E])."""
  flat = experts.reshape(-1)
  order = jnp.argsort(flat, stable=True)
  sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
  return order, sizes


def _swiglu_experts(block, rows, sizes, weights=None):
  """The experts' SwiGLU over `rows` [M, D] sorted by expert; `weights`: this device's slices
  {name: (kernel, lora_a, lora_b)} (expert parallel) or None (the whole params)."""

  def proj(name, x):
    lin = getattr(block, name)
    if weights is None:
      y = lin(x, sizes)
      if lin.lora_a is not None:
        y = y + lin.lora_delta_grouped(x, sizes)
      return y
    kernel, a, b = weights[name]
    y = lin(x, sizes, kernel)
    if a is not None:
      y = y + lin.lora_delta_grouped(x, sizes, a, b)
    return y

  h = jax.nn.silu(proj("gate_proj", rows)) * proj("up_proj", rows)
  return proj("down_proj", h)


def local_experts(block: "Experts", x: jax.Array, experts: jax.Array, weights: jax.Array) -> jax.Array:
  """Dropless single-device expert compute: x [N, D], experts int32[N, k], weights [N, k] -> [N, D]."""
  n, k = experts.shape
  order, sizes = _sort_by_expert(experts, block.num_experts)
  rows = jnp.take(x, order // k, axis=0)
  ys = _swiglu_experts(block, rows, sizes)
  ys = ys * jnp.take(weights.reshape(-1), order)[:, None].astype(ys.dtype)
  out = jnp.zeros_like(ys).at[order].set(ys, unique_indices=True)
  return out.reshape(n, k, -1).sum(axis=1)


class Experts(nnx.Module):
  """HF Qwen3MoeExperts: `num_experts` SwiGLU MLPs of width moe_intermediate_size, as three
  ExpertLinears gate_proj / up_proj [E, D, I] and down_proj [E, I, D]."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    e, d, i = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
    self.num_experts = e
    self.gate_proj = ExpertLinear(e, d, i, cfg=cfg, rngs=rngs, axes=EXPERT_AXES["gate_proj"])
    self.up_proj = ExpertLinear(e, d, i, cfg=cfg, rngs=rngs, axes=EXPERT_AXES["up_proj"])
    self.down_proj = ExpertLinear(e, i, d, cfg=cfg, rngs=rngs, axes=EXPERT_AXES["down_proj"])


class SparseMoeBlock(nnx.Module):
  """Router `gate` (a Linear D -> E, no bias; HF mlp.gate.weight) + `experts`.  [B, T, D] -> ([B, T, D], RouterOut)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.top_k = cfg.num_experts_per_tok
    self.norm_topk_prob = cfg.norm_topk_prob
    self.num_experts = cfg.num_experts
    self.dtype = cfg.compute_dtype
    self.gate = linear(cfg, cfg.hidden_size, cfg.num_experts, False, rngs, axes=("embed", "router"))
    self.experts = Experts(cfg, rngs=rngs)

  def __call__(self, x: jax.Array, routed: jax.Array | None = None):
    """x [B, T, D]; routed int[B, T, k] (router replay; a token of negative ids: the router's own top k) or
    None -> (y [B, T, D], RouterOut)."""
    b, t, d = x.shape
    logits = self.gate(x)  # in the compute dtype, as HF's F.linear
    flat_routed = None if routed is None else routed.reshape(b * t, self.top_k)
    weights, experts = route(logits.reshape(b * t, -1), self.top_k, self.norm_topk_prob, self.dtype, flat_routed)
    ep = expert_parallel_setup(self.num_experts)  # (mesh, expert axes, rules) or None
    if ep is None:
      y = local_experts(self.experts, x.reshape(b * t, d), experts, weights).reshape(b, t, d)
    else:
      y = expert_parallel(self.experts, x, experts.reshape(b, t, -1), weights.reshape(b, t, -1), *ep)
    y = constrain(y, ("act_batch", "act_length", "act_embed"))
    return y, RouterOut(logits.astype(jnp.float32), experts.reshape(b, t, self.top_k))


# ----------------------------------------------------------------------------- expert parallel


def _axis_size(mesh, axes) -> int:
  if axes is None:
    return 1
  axes = (axes,) if isinstance(axes, str) else tuple(axes)
  return math.prod(mesh.shape[a] for a in axes)


def expert_parallel_setup(num_experts: int):
  """(mesh, expert axes, rules) when the active activation sharding splits experts (rule
  "experts") over mesh axes of size > 1, else None. ValueError naming config.mesh.expert when that
  size does not divide `num_experts`."""
  active = active_rules()
  if active is None:
    return None
  mesh, rules = active
  ep_axes = tuple(a for a in rules.get("experts", ()) if a in mesh.shape)
  ep = _axis_size(mesh, ep_axes)
  if ep <= 1:
    return None
  if num_experts % ep:
    raise ValueError(
      f"config.mesh.expert: the expert-parallel degree {ep} (mesh axes {ep_axes}) does not divide "
      f"the model's num_experts={num_experts}"
    )
  return mesh, ep_axes, rules


def expert_parallel(block: Experts, x, experts, weights, mesh, ep_axes, rules):
  """Experts under shard_map with all_to_all token exchange. x [B, T, D], experts int32[B, T, k],
  weights [B, T, k] -> [B, T, D]; token rows split over the rule "act_batch"'s mesh axes and
  `ep_axes` (replicated over the others), experts over `ep_axes`, expert widths as the rule
  "moe_mlp" (less the expert axes)."""
  ep = _axis_size(mesh, ep_axes)
  e_loc = block.num_experts // ep
  ep_tuple = tuple(ep_axes)
  ep_axes = ep_axes[0] if len(ep_axes) == 1 else ep_axes
  b = x.shape[0]
  # token rows: split as the rule "act_batch" says, and over the expert axes too (expert parallel
  # is data parallel for the tokens) where the batch divides
  row_rules = {
    **rules,
    "act_batch": tuple(rules.get("act_batch", ())) + tuple(a for a in ep_tuple if a not in rules.get("act_batch", ())),
  }
  batch_axes = spec_for_axes(("act_batch",), (b,), row_rules, mesh, where="the MoE tokens")[0]
  width = block.gate_proj.out_features
  mlp_rules = {**rules, "moe_mlp": tuple(a for a in rules.get("moe_mlp", ()) if a not in ep_axes)}
  mlp_axes = spec_for_axes(("moe_mlp",), (width,), mlp_rules, mesh, where="the MoE experts")[0]
  tok = P(batch_axes, None, None)
  col, row = P(ep_axes, None, mlp_axes), P(ep_axes, mlp_axes, None)
  names = ("gate_proj", "up_proj", "down_proj")
  # cast before shard_map: its in_specs gather each kernel over the mesh axes its spec leaves out
  # (fsdp) in the compute dtype rather than float32, half the bytes moved and held a layer (and the
  # gradient's reduce-scatter, the gather's transpose, in the compute dtype too)
  kernels = [getattr(block, n).kernel[...].astype(getattr(block, n).dtype) for n in names]
  kernel_specs = [col, col, row]
  loras = []
  lora_specs = []
  for n, spec in zip(names, kernel_specs):
    lin = getattr(block, n)
    if lin.lora_a is None:
      loras.append((None, None))
      lora_specs.append((None, None))
    else:
      loras.append((lin.lora_a[...], lin.lora_b[...]))
      in_axes, out_axes = spec[1], spec[2]
      lora_specs.append((P(ep_axes, in_axes, None), P(ep_axes, None, out_axes)))

  def body(x, experts, weights, kernels, loras):
    bl, t, d = x.shape
    k = experts.shape[-1]
    n = bl * t
    x2, ex, w = x.reshape(n, d), experts.reshape(n * k), weights.reshape(n * k)
    order = jnp.argsort(ex, stable=True)
    sorted_e = ex[order]
    dest = sorted_e // e_loc  # nondecreasing: the assignments of one peer are contiguous
    counts = jnp.bincount(dest, length=ep)
    starts = jnp.cumsum(counts) - counts
    pos = jnp.arange(n * k) - starts[dest]
    cap = n * k  # worst case: every assignment of this device to one peer (dropless)
    send = jnp.zeros((ep, cap, d), x.dtype).at[dest, pos].set(jnp.take(x2, order // k, axis=0))
    send_e = jnp.full((ep, cap), e_loc, jnp.int32).at[dest, pos].set(sorted_e % e_loc)
    recv = jax.lax.all_to_all(send, ep_axes, 0, 0, tiled=True)
    recv_e = jax.lax.all_to_all(send_e, ep_axes, 0, 0, tiled=True).reshape(ep * cap)
    order2 = jnp.argsort(recv_e, stable=True)  # empty slots (e_loc) last
    sizes = jnp.bincount(recv_e, length=e_loc + 1)[:e_loc].astype(jnp.int32)
    rows = jnp.take(recv.reshape(ep * cap, d), order2, axis=0)
    local = {nm: (kern, a, bb) for nm, kern, (a, bb) in zip(names, kernels, loras)}
    ys = _swiglu_experts(block, rows, sizes, local)
    if mlp_axes is not None:
      ys = jax.lax.psum(ys, mlp_axes)
    back = jnp.zeros_like(ys).at[order2].set(ys, unique_indices=True).reshape(ep, cap, d)
    back = jax.lax.all_to_all(back, ep_axes, 0, 0, tiled=True)
    ys = back[dest, pos] * jnp.take(w, order)[:, None].astype(back.dtype)
    out = jnp.zeros_like(ys).at[order].set(ys, unique_indices=True)
    return out.reshape(n, k, d).sum(axis=1).reshape(bl, t, d)

  fn = jax.shard_map(
    body,
    mesh=mesh,
    in_specs=(tok, tok, tok, kernel_specs, lora_specs),
    out_specs=tok,
    check_vma=False,
  )
  return fn(x, experts, weights, kernels, loras)


# ----------------------------------------------------------------------------- router loss + stats


def load_balancing_loss(logits: jax.Array, experts: jax.Array, mask: jax.Array | None, num_experts: int) -> jax.Array:
  """HF load_balancing_loss_func (Switch Transformer eqs. 4-6) over the sparse layers.

  logits float[Lm, B, T, E], experts int[Lm, B, T, k] (the routed ones), mask bool[B, T] (padding
  excluded) or None -> scalar: E * sum_e f_e * P_e, with f_e the share of (layer, token) rows whose
  top-k holds e (summing to k) and P_e the mean router probability of e, both over the layers'
  unmasked tokens."""
  probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
  m = jnp.ones(logits.shape[1:3], jnp.float32) if mask is None else mask.astype(jnp.float32)
  hits = jax.nn.one_hot(experts, num_experts, dtype=jnp.float32).sum(axis=-2)  # [Lm, B, T, E]
  rows = m.sum() * logits.shape[0]
  tokens_per_expert = jnp.einsum("lbte,bt->e", hits, m) / rows
  prob_per_expert = jnp.einsum("lbte,bt->e", probs, m) / rows
  return num_experts * jnp.sum(tokens_per_expert * prob_per_expert)


def router_metrics(experts: jax.Array, mask: jax.Array | None, num_experts: int) -> dict:
  """Train metrics of the routing: experts int[Lm, B, T, k], mask bool[B, T] -> {router/expert_load_max,
  router/expert_load_min (the busiest / idlest expert's share of assignments x E: 1 = balanced),
  router/dropped_tokens (0: the experts are dropless)}."""
  m = jnp.ones(experts.shape[1:3], jnp.float32) if mask is None else mask.astype(jnp.float32)
  hits = jax.nn.one_hot(experts, num_experts, dtype=jnp.float32).sum(axis=-2)
  load = jnp.einsum("lbte,bt->e", hits, m)
  share = load / jnp.maximum(load.sum(), 1.0) * num_experts
  return {
    "router/expert_load_max": share.max(),
    "router/expert_load_min": share.min(),
    "router/dropped_tokens": jnp.zeros((), jnp.float32),
  }


def routing_mismatch(experts: jax.Array, reference: jax.Array, mask: jax.Array | None) -> jax.Array:
  """Share of routed (layer, token, slot) choices of `experts` not in `reference`'s set for that
  token (both int[Lm, B, T, k]; mask bool[B, T]): 0 when trainer and sampler route alike."""
  same = (experts[..., :, None] == reference[..., None, :]).any(-1).astype(jnp.float32)  # [Lm, B, T, k]
  m = jnp.ones(experts.shape[1:3], jnp.float32) if mask is None else mask.astype(jnp.float32)
  per = jnp.einsum("lbtk,bt->", 1.0 - same, m)
  return per / jnp.maximum(m.sum() * experts.shape[0] * experts.shape[-1], 1.0)


def stacked_routes(routes: list[RouterOut] | RouterOut) -> RouterOut:
  """The sparse layers' RouterOuts as one with a leading [Lm] axis (a scanned model's already is)."""
  if isinstance(routes, RouterOut):
    return routes
  return RouterOut(jnp.stack([r.logits for r in routes]), jnp.stack([r.experts for r in routes]))


__all__ = [
  "EXPERT_AXES",
  "ExpertLinear",
  "Experts",
  "RouterOut",
  "SparseMoeBlock",
  "grouped_matmul",
  "load_balancing_loss",
  "local_experts",
  "route",
  "router_metrics",
  "routing_mismatch",
  "stacked_routes",
]

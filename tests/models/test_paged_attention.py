"""models/paged_attention.py + pallas_paged_attention.py: the XLA path (`paged_attend`) in both cache layouts against a float64 dense
reference; the Pallas paged-attention kernel (`pallas_paged_decode`, Pallas' TPU interpret mode on this CPU)
against it; a model with attention_impl "pallas" stores its pages heads first and decodes through the kernel
to the XLA model's hidden states; the kernel's megacore mode per chip."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.experimental.pallas import tpu as pltpu

from agentfly_jax.models import CausalLM, tiny_config
from agentfly_jax.models import paged_attention
from agentfly_jax.models.paged_attention import PagedKVCache, PageTable, paged_attend, write_pages
from agentfly_jax.models.pallas_paged_attention import megacore_mode, pallas_paged_decode

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

B, H, KVH, HD, PAGE, NUM_PAGES, WIDTH, BLOCK = 4, 4, 2, 8, 4, 28, 6, 2


def _rows(rng, lengths, kvh=KVH):
  """Block tables int32[B, WIDTH] of distinct non-sink pages, the rows' keys / values [B, S, KVH, hd] (float64)."""
  pages = rng.permutation(np.arange(1, NUM_PAGES))[: B * WIDTH].reshape(B, WIDTH)
  s = max(lengths)
  return pages.astype(np.int32), rng.normal(size=(B, s, kvh, HD)), rng.normal(size=(B, s, kvh, HD))


def _filled(k, v, tables, lengths, heads_first, dtype):
  """Pages with each row's keys / values 0..length-1 written through `write_pages` (the rest zeros)."""
  kvh = k.shape[2]
  shape = (kvh, NUM_PAGES, PAGE, HD) if heads_first else (NUM_PAGES, PAGE, kvh, HD)
  k_pages, v_pages = jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)
  s = k.shape[1]
  positions = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (B, s))
  valid = positions < jnp.asarray(lengths)[:, None]
  table = PageTable.build(jnp.asarray(tables), positions, valid, PAGE, BLOCK)
  k_pages = write_pages(k_pages, jnp.asarray(k, jnp.float32), table.write_slots, heads_first=heads_first)
  v_pages = write_pages(v_pages, jnp.asarray(v, jnp.float32), table.write_slots, heads_first=heads_first)
  return k_pages, v_pages


def _dense(q, k, v, positions):
  """float64 causal attention of q [B, T, H, hd] over k / v [B, S, KVH, hd]: query t sees keys <= positions[b, t]."""
  h = q.shape[2]
  g = h // k.shape[2]
  k, v = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
  scores = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(HD)
  allowed = np.arange(k.shape[1])[None, None, :] <= positions[:, :, None]
  scores = np.where(allowed[:, None], scores, -np.inf)
  p = np.exp(scores - scores.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  return np.einsum("bhts,bshd->bthd", p, v).reshape(q.shape[0], q.shape[1], h * HD)


@pytest.mark.parametrize("heads_first", [False, True])
def test_paged_attend_equals_dense_attention_in_both_layouts(heads_first):
  rng = np.random.default_rng(1)
  lengths = [3, 13, 24, 8]  # one block, a partial last page, every page of the table, one whole block
  tables, k, v = _rows(rng, lengths)
  k_pages, v_pages = _filled(k, v, tables, lengths, heads_first, jnp.float32)
  t = 2
  positions = np.array([[n - 2, n - 1] for n in lengths], np.int32)
  q = rng.normal(size=(B, t, H, HD))
  table = PageTable.build(jnp.asarray(tables), jnp.asarray(positions), jnp.ones((B, t), bool), PAGE, BLOCK)
  out = paged_attend(
    jnp.asarray(q, jnp.float32),
    k_pages,
    v_pages,
    table,
    dtype=jnp.float32,
    precision=jax.lax.Precision.HIGHEST,
    heads_first=heads_first,
  )
  np.testing.assert_allclose(np.asarray(out), _dense(q, k, v, positions), atol=2e-5)


@pytest.mark.parametrize("heads_first", [False, True])
def test_rows_in_groups_each_to_its_own_length_equal_dense_attention(monkeypatch, heads_first):
  """More rows than paged_attention.ROW_GROUP (set to 2 here): 5 rows of mixed lengths, a short row beside a
  long one in a group, the last group of one row; every group visits only its own blocks."""
  monkeypatch.setattr(paged_attention, "ROW_GROUP", 2)
  rng = np.random.default_rng(7)
  lengths = [2, 24, 5, 6, 17]
  b, t, width, num_pages = len(lengths), 1, WIDTH, 1 + len(lengths) * WIDTH
  tables = rng.permutation(np.arange(1, num_pages))[: b * width].reshape(b, width).astype(np.int32)
  k, v = rng.normal(size=(b, max(lengths), KVH, HD)), rng.normal(size=(b, max(lengths), KVH, HD))
  shape = (KVH, num_pages, PAGE, HD) if heads_first else (num_pages, PAGE, KVH, HD)
  pos = jnp.broadcast_to(jnp.arange(max(lengths), dtype=jnp.int32), (b, max(lengths)))
  fill = PageTable.build(jnp.asarray(tables), pos, pos < jnp.asarray(lengths)[:, None], PAGE, BLOCK)
  k_pages, v_pages = (
    write_pages(jnp.zeros(shape), jnp.asarray(x, jnp.float32), fill.write_slots, heads_first=heads_first)
    for x in (k, v)
  )
  positions = np.array([[n - 1] for n in lengths], np.int32)
  q = rng.normal(size=(b, t, H, HD))
  table = PageTable.build(jnp.asarray(tables), jnp.asarray(positions), jnp.ones((b, t), bool), PAGE, BLOCK)
  attend = jax.jit(
    lambda q, kp, vp, table: paged_attend(
      q, kp, vp, table, dtype=jnp.float32, precision=jax.lax.Precision.HIGHEST, heads_first=heads_first
    )
  )
  out = attend(jnp.asarray(q, jnp.float32), k_pages, v_pages, table)
  np.testing.assert_allclose(np.asarray(out), _dense(q, k, v, positions), atol=2e-5)


def test_the_two_layouts_hold_the_same_pages():
  rng = np.random.default_rng(2)
  lengths = [5, 9, 17, 2]
  tables, k, v = _rows(rng, lengths)
  first = _filled(k, v, tables, lengths, False, jnp.float32)
  heads = _filled(k, v, tables, lengths, True, jnp.float32)
  unused = sorted(set(range(1, NUM_PAGES)) - set(tables.ravel().tolist()))
  for a, b in zip(first, heads):
    np.testing.assert_array_equal(np.asarray(a).transpose(2, 0, 1, 3), np.asarray(b))
    assert float(jnp.abs(b[:, np.asarray(unused)]).max()) == 0.0  # only the rows' own pages (and the sink) written
  cache = PagedKVCache.zeros(3, NUM_PAGES, PAGE, KVH, HD, stacked=True, heads_first=True)
  assert cache.k.shape == (3, KVH, NUM_PAGES, PAGE, HD)
  assert (cache.num_pages, cache.page_size, cache.num_layers) == (NUM_PAGES, PAGE, 3)
  assert cache.axes() == (None, "act_kv_heads", None, None, None)


@pytest.mark.slow
@pytest.mark.parametrize(
  "h, kvh, kind",
  [
    (4, 2, "TPU v5 lite"),  # 2 query heads a kv head (q goes in as [B, H, 1, hd] float32), one core
    (16, 2, "TPU v5"),  # 8 a kv head (q as it is), the grid split by kv head over v5p's two cores
    (4, 1, "TPU v5"),  # one kv head: split by batch row
  ],
)
def test_pallas_kernel_interpreted_equals_the_xla_path_on_a_decode_step(h, kvh, kind):
  """The kernel on bfloat16 pages (what it reads: a float32 cache is rounded inside it), heads first, with
  q unscaled and lengths = position + 1, equals `paged_attend` on the same pages and a float64 reference."""
  rng = np.random.default_rng(3)
  lengths = [1, 10, 24, 9]
  tables, k, v = _rows(rng, lengths, kvh)
  k_pages, v_pages = _filled(k, v, tables, lengths, True, jnp.bfloat16)
  positions = jnp.asarray([[n - 1] for n in lengths], jnp.int32)
  q = jnp.asarray(rng.normal(size=(B, 1, h, HD)), jnp.float32)
  table = PageTable.build(jnp.asarray(tables), positions, jnp.ones((B, 1), bool), PAGE, BLOCK)
  cores = 2 if kind == "TPU v5" else 1  # a megacore grid runs on two simulated cores (on one it would wait forever)
  with pltpu.force_tpu_interpret_mode(pltpu.InterpretParams(num_cores_or_threads=cores)):
    out = jax.jit(lambda *a: pallas_paged_decode(*a, device_kind=kind))(q, k_pages, v_pages, table)
  ref = paged_attend(
    q, k_pages, v_pages, table, dtype=jnp.float32, precision=jax.lax.Precision.HIGHEST, heads_first=True
  )
  assert out.shape == (B, 1, h * HD) and out.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-5)
  dense = _dense(np.asarray(q, np.float64), _bf16(k), _bf16(v), np.asarray(positions))
  np.testing.assert_allclose(np.asarray(out), dense, atol=1e-5)


def _bf16(x):
  return np.asarray(jnp.asarray(x, jnp.bfloat16), np.float64)


def test_megacore_mode_splits_only_two_core_chips():
  assert megacore_mode("TPU v5", kv_heads=4, batch=3) == "kv_head"  # v5p
  assert megacore_mode("TPU v4", kv_heads=1, batch=8) == "batch"
  assert megacore_mode("TPU v5", kv_heads=1, batch=3) is None
  for kind in ("TPU v5 lite", "TPU v6 lite", "cpu"):
    assert megacore_mode(kind, kv_heads=4, batch=8) is None


def test_a_scanned_model_over_pages_equals_its_forward_without_a_cache():
  """The scanned model over a stacked paged cache: a prompt in two chunks then two decode steps give the hidden
  states of one forward over the whole sequence without a cache; a cache in the other layout is refused."""
  cfg = tiny_config("qwen2", vocab_size=64, scan_layers=True)
  model = CausalLM(cfg, rngs=nnx.Rngs(1))
  cache = model.init_paged_cache(16, PAGE, jnp.float32)
  assert cache.stacked and not cache.heads_first
  ids = jnp.asarray([[5, 9, 4, 1, 7, 2, 11, 3, 8, 6], [8, 8, 5, 13, 2, 40, 41, 9, 0, 0]], jnp.int32)
  tables = [[3, 1, 2, 0, 0, 0], [4, 5, 6, 7, 0, 0]]
  step = jax.jit(lambda c, i, t: model.hidden_states(i, cache=c, pages=t))
  other = PagedKVCache.zeros(2, 16, PAGE, cfg.num_key_value_heads, cfg.head_dim, stacked=True, heads_first=True)
  with pytest.raises(ValueError, match="heads_first=True"):
    step(other, ids[:, :1], _table(tables, [[0], [0]]))
  hidden = []
  for lo, hi in ((0, 6), (6, 8), (8, 9), (9, 10)):  # chunk, chunk, one decode step, another
    h, cache = step(cache, ids[:, lo:hi], _table(tables, np.arange(lo, hi)[None].repeat(2, 0)))
    hidden.append(np.asarray(h))
  np.testing.assert_allclose(np.concatenate(hidden, axis=1), np.asarray(model.hidden_states(ids)[0]), atol=2e-5)


@pytest.mark.slow
@pytest.mark.parametrize("scan_layers", [False, True])
def test_a_pallas_model_decodes_through_the_kernel_to_the_xla_models_hidden_states(scan_layers):
  """attention_impl "pallas": init_paged_cache lays the pages out heads first, a prefill chunk (T > 1) takes
  the XLA path over them and a decode step (T = 1) the kernel (interpreted); both equal the "flash" model's
  hidden states on its own pages-first cache (both caches bfloat16, the kernel's read precision)."""
  cfg = tiny_config(
    "qwen2",
    vocab_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    attention_impl="pallas",
    scan_layers=scan_layers,
  )
  pallas = CausalLM(cfg, rngs=nnx.Rngs(0))
  xla = CausalLM(dataclasses.replace(cfg, attention_impl="flash"), rngs=nnx.Rngs(0))
  caches = [m.init_paged_cache(16, PAGE, jnp.bfloat16) for m in (pallas, xla)]
  assert caches[0].heads_first and not caches[1].heads_first
  with pytest.raises(ValueError, match="heads_first=False"):
    pallas.hidden_states(jnp.zeros((1, 1), jnp.int32), cache=caches[1], pages=_table([[1, 2]], [[0]]))
  tables = [[1, 2, 3, 4], [5, 6, 7, 8]]
  prompt = jnp.asarray([[3, 9, 4, 1, 7, 2], [8, 8, 5, 0, 0, 0]], jnp.int32)
  valid = jnp.asarray([[True] * 6, [True] * 3 + [False] * 3])
  chunk = _table(tables, np.arange(6)[None].repeat(2, 0), valid)
  step = _table(tables, [[6], [3]])
  nxt = jnp.asarray([[11], [12]], jnp.int32)
  out = []
  for model, cache in zip((pallas, xla), caches):
    with pltpu.force_tpu_interpret_mode():
      h1, cache = jax.jit(lambda c, m=model: m.hidden_states(prompt, cache=c, pages=chunk))(cache)
      h2, cache = jax.jit(lambda c, m=model: m.hidden_states(nxt, cache=c, pages=step))(cache)
    out.append((np.asarray(h1), np.asarray(h2)))
  (p1, p2), (x1, x2) = out
  np.testing.assert_allclose(p1[np.asarray(valid)], x1[np.asarray(valid)], atol=1e-4)
  np.testing.assert_allclose(p2, x2, atol=1e-4)


def _table(tables, positions, valid=None):
  positions = jnp.asarray(positions, jnp.int32)
  valid = jnp.ones(positions.shape, bool) if valid is None else valid
  return PageTable.build(jnp.asarray(tables, jnp.int32), positions, valid, PAGE, BLOCK)

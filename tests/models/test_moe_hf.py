"""Qwen3-MoE (models/moe.py): logit parity with HF transformers' Qwen3MoeForCausalLM on tiny random
configs (saved by HF, loaded by ours), HF's load-balancing loss, round trips, bad checkpoints."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from agentfly_jax.models import CausalLM, from_pretrained, save_pretrained, tiny_config  # noqa: E402
from agentfly_jax.models.moe import load_balancing_loss, route  # noqa: E402
from tests.models.test_models_hf import hf_logits, left_padded_batch, randomize_, rel_err  # noqa: E402

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

# (id, extra HF config kwargs): every layer sparse and renormalised; raw top-k weights with a
# dense layer in between (decoder_sparse_step 2 + mlp_only_layers) and attention biases.
VARIANTS = [
  ("all-sparse-norm", dict(norm_topk_prob=True, num_hidden_layers=2)),
  (
    "mixed-raw-bias",
    dict(
      norm_topk_prob=False,
      num_hidden_layers=4,
      decoder_sparse_step=2,
      mlp_only_layers=[3],
      attention_bias=True,
      tie_word_embeddings=True,
    ),
  ),
]


def hf_moe_config(**extra):
  kwargs = dict(
    vocab_size=211,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=48,
    num_experts=8,
    num_experts_per_tok=2,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
  )
  kwargs.update(extra)
  cfg = transformers.Qwen3MoeConfig(**kwargs)
  cfg._attn_implementation = "eager"
  return cfg


@pytest.fixture(scope="module", params=VARIANTS, ids=[v[0] for v in VARIANTS])
def moe_folder(request, tmp_path_factory):
  name, extra = request.param
  torch.manual_seed(0)
  hf = transformers.Qwen3MoeForCausalLM(hf_moe_config(**extra)).eval()
  randomize_(hf, seed=len(name))
  with torch.no_grad():  # a sharper router, so top-k choices are not near-ties
    for layer in hf.model.layers:
      if hasattr(layer.mlp, "gate"):
        layer.mlp.gate.weight.mul_(6.0)
  folder = tmp_path_factory.mktemp(name)
  hf.save_pretrained(folder)
  return str(folder), hf


def test_config_reads_hf_fields(moe_folder):
  folder, hf = moe_folder
  model = from_pretrained(folder)
  cfg = model.config
  assert cfg.model_type == "qwen3_moe" and cfg.num_experts == 8 and cfg.num_experts_per_tok == 2
  assert cfg.norm_topk_prob == hf.config.norm_topk_prob
  sparse = [type(layer.mlp).__name__ == "Qwen3MoeSparseMoeBlock" for layer in hf.model.layers]
  assert [cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers)] == sparse
  assert [layer.sparse for layer in model.model.layers] == sparse


def test_logits_match_hf_fp32(moe_folder):
  folder, hf = moe_folder
  model = from_pretrained(folder)
  rng = np.random.default_rng(11)
  ids = rng.integers(0, hf.config.vocab_size, (3, 17)).astype(np.int32)
  ours = model(jnp.asarray(ids))
  assert ours.shape == (3, 17, hf.config.vocab_size)
  assert rel_err(ours, hf_logits(hf, ids)) <= 1e-4


def test_logits_match_hf_left_padded(moe_folder):
  folder, hf = moe_folder
  model = from_pretrained(folder)
  rng = np.random.default_rng(12)
  ids, mask, positions = left_padded_batch(rng, hf.config.vocab_size, [12, 7, 2], 12)
  ours = np.asarray(model(jnp.asarray(ids), attention_mask=jnp.asarray(mask), positions=jnp.asarray(positions)))
  ref = hf_logits(hf, ids, mask, positions)
  assert rel_err(ours[mask], ref[mask]) <= 1e-4


def test_router_matches_hf_and_load_balancing_loss(moe_folder):
  folder, hf = moe_folder
  model = from_pretrained(folder)
  rng = np.random.default_rng(13)
  ids, mask, _ = left_padded_batch(rng, hf.config.vocab_size, [10, 6], 10)
  with torch.no_grad():
    out = hf(
      input_ids=torch.as_tensor(ids, dtype=torch.long),
      attention_mask=torch.as_tensor(mask, dtype=torch.long),
      output_router_logits=True,
    )
  _, _, routes = model.hidden_states(jnp.asarray(ids), attention_mask=jnp.asarray(mask), with_router=True)
  hf_router = np.stack([r.float().numpy() for r in out.router_logits]).reshape(routes.logits.shape)
  m = np.asarray(mask)
  assert rel_err(np.asarray(routes.logits)[:, m], hf_router[:, m]) <= 1e-4
  top = torch.topk(torch.softmax(torch.as_tensor(hf_router), -1), 2, dim=-1).indices.numpy()
  assert (np.sort(np.asarray(routes.experts), -1)[:, m] == np.sort(top, -1)[:, m]).all()
  ours = load_balancing_loss(routes.logits, routes.experts, jnp.asarray(mask), 8)
  np.testing.assert_allclose(float(ours), float(out.aux_loss), rtol=1e-5)


def test_load_balancing_loss_random_logits_against_hf():
  from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

  rng = np.random.default_rng(5)
  logits = rng.normal(size=(3, 4, 9, 16)).astype(np.float32) * 2.0  # [Lm, B, T, E]
  mask = rng.random((4, 9)) > 0.3
  _, experts = jax.vmap(lambda l: route(l, 4, False, jnp.float32))(jnp.asarray(logits.reshape(3, 36, 16)))
  ours = load_balancing_loss(jnp.asarray(logits), experts.reshape(3, 4, 9, 4), jnp.asarray(mask), 16)
  ref = load_balancing_loss_func(
    tuple(torch.as_tensor(l.reshape(36, 16)) for l in logits), 16, 4, torch.as_tensor(mask, dtype=torch.long)
  )
  np.testing.assert_allclose(float(ours), float(ref), rtol=1e-5)
  ref_nomask = load_balancing_loss_func(tuple(torch.as_tensor(l.reshape(36, 16)) for l in logits), 16, 4)
  np.testing.assert_allclose(
    float(load_balancing_loss(jnp.asarray(logits), experts.reshape(3, 4, 9, 4), None, 16)), float(ref_nomask), rtol=1e-5
  )


def test_round_trip_ours_to_hf(moe_folder, tmp_path):
  folder, hf = moe_folder
  model = from_pretrained(folder)
  out = save_pretrained(model, tmp_path / "ours")
  names = set(json.load(open(os.path.join(folder, "config.json"))))
  assert {"moe_intermediate_size", "norm_topk_prob"} <= names and names & {"num_experts", "num_local_experts"}
  back = transformers.Qwen3MoeForCausalLM.from_pretrained(out).eval()
  back.config._attn_implementation = "eager"
  ids = np.random.default_rng(14).integers(0, hf.config.vocab_size, (2, 9)).astype(np.int32)
  assert rel_err(hf_logits(back, ids), hf_logits(hf, ids)) <= 1e-6


@pytest.mark.slow
def test_scanned_layers_equal_unrolled():
  cfg = tiny_config("qwen3_moe", vocab_size=97, hidden_size=64, head_dim=16, intermediate_size=96)
  from flax import nnx

  from agentfly_jax.models.layer_stack import stack_layers

  unrolled = CausalLM(cfg, rngs=nnx.Rngs(3))
  scanned = nnx.eval_shape(lambda: CausalLM(cfg.replace(scan_layers=True), rngs=nnx.Rngs(0)))
  graphdef, _ = nnx.split(scanned)
  scanned = nnx.merge(graphdef, stack_layers(nnx.state(unrolled)))
  ids = jnp.asarray(np.random.default_rng(15).integers(0, 97, (2, 13)), jnp.int32)

  @nnx.jit  # logits and routes in one program per layout (op-by-op dispatch compiles every op on its own)
  def logits_and_routes(model):
    return model(ids), model.hidden_states(ids, with_router=True)[2]

  l1, r1 = logits_and_routes(scanned)
  l2, r2 = logits_and_routes(unrolled)
  np.testing.assert_allclose(np.asarray(l1), np.asarray(l2), rtol=1e-5, atol=1e-5)
  assert r1.experts.shape == (2, 2, 13, 2) and (np.asarray(r1.experts) == np.asarray(r2.experts)).all()


def test_expert_count_mismatch_names_the_field(moe_folder, tmp_path):
  folder, _ = moe_folder
  bad = tmp_path / "bad"
  bad.mkdir()
  for f in os.listdir(folder):
    os.symlink(os.path.join(folder, f), bad / f)
  cfg = json.load(open(os.path.join(folder, "config.json")))
  cfg["num_experts"] = 6
  os.remove(bad / "config.json")
  json.dump(cfg, open(bad / "config.json", "w"))
  with pytest.raises(ValueError, match="num_experts=6"):
    from_pretrained(str(bad))
  with pytest.raises(ValueError, match="num_experts=4"):
    from_pretrained(folder, num_experts=4)


def test_replayed_routes_reproduce_the_forward(moe_folder):
  folder, hf = moe_folder
  model = from_pretrained(folder)
  ids = jnp.asarray(np.random.default_rng(16).integers(0, hf.config.vocab_size, (2, 8)), jnp.int32)
  h, _, routes = model.hidden_states(ids, with_router=True)
  h2, _, routes2 = model.hidden_states(ids, routed_experts=routes.experts, with_router=True)
  np.testing.assert_allclose(np.asarray(h2), np.asarray(h), rtol=1e-6, atol=1e-6)
  other = (routes.experts + 1) % 8  # other experts: another forward
  h3, _, routes3 = model.hidden_states(ids, routed_experts=other, with_router=True)
  assert (np.asarray(routes3.experts) == np.asarray(other)).all()
  assert np.abs(np.asarray(h3) - np.asarray(h)).max() > 1e-3

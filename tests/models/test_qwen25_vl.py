"""Qwen2.5-VL (models/qwen25_vl.py, models/vision.py): logits, the vision tower and the M-RoPE positions
equal HF transformers' Qwen2_5_VLForConditionalGeneration on a tiny random config (saved by HF, loaded
by ours), on fresh random token ids and pixels; round trips; bad inputs refused by name."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from flax import nnx  # noqa: E402

from agentfly_jax.models import (  # noqa: E402
  CausalLM,
  Qwen25VL,
  from_pretrained,
  mrope_positions,
  save_pretrained,
  tiny_config,
  to_hf_state_dict,
  vision_layout,
)
from tests.models.test_models_hf import randomize_, rel_err  # noqa: E402

IMAGE, START, END, VOCAB = 290, 292, 293, 300
PATCH_DIM = 3 * 2 * 4 * 4


def hf_vl_config():
  cfg = transformers.Qwen2_5_VLConfig(
    text_config=dict(
      vocab_size=VOCAB,
      hidden_size=64,
      intermediate_size=96,
      num_hidden_layers=2,
      num_attention_heads=4,
      num_key_value_heads=2,
      rms_norm_eps=1e-6,
      max_position_embeddings=512,
      rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
      bos_token_id=None,
      eos_token_id=None,
    ),
    vision_config=dict(
      depth=3,
      hidden_size=32,
      intermediate_size=48,
      num_heads=2,
      patch_size=4,
      spatial_merge_size=2,
      temporal_patch_size=2,
      window_size=16,
      out_hidden_size=64,
      fullatt_block_indexes=[1],
    ),
    image_token_id=IMAGE,
    video_token_id=291,
    vision_start_token_id=START,
    vision_end_token_id=END,
  )
  cfg._attn_implementation = "eager"
  cfg.text_config._attn_implementation = "eager"
  cfg.vision_config._attn_implementation = "eager"
  return cfg


def placeholders(hf_config) -> list[int]:
  """The HF config's vision placeholder and delimiter ids (what ModelConfig.placeholder_token_ids suppresses)."""
  names = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
  return sorted({getattr(hf_config, n) for n in names if getattr(hf_config, n, None) is not None})


def saved_hf_vl(tmp_path_factory, name: str, seed: int = 5):
  """A random HF Qwen2.5-VL of hf_vl_config (torch seed 0, weights randomized by `seed`) and the folder it was
  saved to: (hf_model, folder)."""
  torch.manual_seed(0)
  hf = transformers.Qwen2_5_VLForConditionalGeneration(hf_vl_config()).eval()
  randomize_(hf, seed=seed)
  folder = tmp_path_factory.mktemp(name)
  hf.save_pretrained(folder)
  return hf, str(folder)


@pytest.fixture(scope="module")
def vl(tmp_path_factory):
  torch.manual_seed(0)
  hf = transformers.Qwen2_5_VLForConditionalGeneration(hf_vl_config()).eval()
  randomize_(hf, seed=3)
  with torch.no_grad():
    hf.model.visual.merger.ln_q.weight.copy_(1.0 + 0.2 * torch.randn(32, generator=torch.Generator().manual_seed(4)))
  folder = tmp_path_factory.mktemp("qwen25_vl")
  hf.save_pretrained(folder)
  return str(folder), hf, from_pretrained(folder)


def conversation(rng, parts):
  """Token ids of parts: ("text", n) random text tokens, or ("image", grid) an image's pad tokens between
  vision start / end; returns (ids, grids)."""
  ids, grids = [], []
  for kind, value in parts:
    if kind == "text":
      ids += rng.integers(0, 280, value).tolist()
    else:
      grids.append(value)
      ids += [START] + [IMAGE] * (value[0] * value[1] * value[2] // 4) + [END]
  return ids, grids


def batch(rng, rows):
  """Left-padded rows of conversations -> (ids int32[B, T], mask bool[B, T], grids int[I, 3], pixels)."""
  convs = [conversation(rng, parts) for parts in rows]
  t = max(len(ids) for ids, _ in convs)
  ids = np.zeros((len(rows), t), np.int32)
  mask = np.zeros((len(rows), t), bool)
  for b, (row, _) in enumerate(convs):
    ids[b, t - len(row) :], mask[b, t - len(row) :] = row, True
  grids = np.array([g for _, gs in convs for g in gs], np.int64)
  pixels = rng.standard_normal((int(np.prod(grids, axis=1).sum()), PATCH_DIM)).astype(np.float32)
  return ids, mask, grids, pixels


def _saved_name(name: str) -> str:
  """HF's in-memory parameter name -> the name its checkpoints hold (and ours use)."""
  return name.replace("model.language_model.", "model.").replace("model.visual.", "visual.")


def hf_logits(hf, ids, mask, grids, pixels):
  with torch.no_grad():
    out = hf(
      input_ids=torch.as_tensor(ids, dtype=torch.long),
      attention_mask=torch.as_tensor(mask, dtype=torch.long),
      pixel_values=torch.as_tensor(pixels),
      image_grid_thw=torch.as_tensor(grids),
      mm_token_type_ids=torch.as_tensor(ids == IMAGE, dtype=torch.int32),
    )
  return out.logits.float().numpy()


# One batch, a row per case (each row's logits checked on its own): one image; several images of
# different sizes in one conversation; text, then an image after some turns; text only.
CASES = {
  "one_image": [("text", 5), ("image", (1, 8, 12)), ("text", 7)],
  "images_of_different_sizes": [
    ("text", 3),
    ("image", (1, 4, 6)),
    ("text", 4),
    ("image", (1, 8, 12)),
    ("text", 2),
    ("image", (1, 6, 4)),
    ("text", 3),
    ("image", (2, 4, 4)),  # two frames: full attention stays within each (HF's cu_seqlens)
  ],
  "image_in_a_later_turn": [("text", 17), ("image", (1, 6, 8)), ("text", 9)],
  "text_only": [("text", 30)],
}
ROWS = sorted(CASES)


@pytest.fixture(scope="module")
def forward(vl):
  """(ids, mask, grids, pixels, our logits, HF's logits) of the CASES batch (left-padded rows)."""
  _, hf, model = vl
  ids, mask, grids, pixels = batch(np.random.default_rng(7), [CASES[name] for name in ROWS])
  ours = np.asarray(
    model(jnp.asarray(ids), attention_mask=jnp.asarray(mask), pixel_values=pixels, image_grid_thw=grids)
  )
  return ids, mask, grids, pixels, ours, hf_logits(hf, ids, mask, grids, pixels)


@pytest.mark.parametrize("case", ROWS)
def test_logits_match_hf(forward, case):
  ids, mask, _, _, ours, ref = forward
  b = ROWS.index(case)
  assert ours.shape == ref.shape == ids.shape + (VOCAB,)
  assert rel_err(ours[b][mask[b]], ref[b][mask[b]]) <= 1e-4


def test_vision_tower_matches_hf_visual(vl, forward):
  _, hf, model = vl
  _, _, grids, pixels, _, _ = forward
  ours = np.asarray(model.image_features(pixels, grids))
  with torch.no_grad():
    ref = hf.model.visual(torch.as_tensor(pixels), grid_thw=torch.as_tensor(grids)).pooler_output.numpy()
  assert ours.shape == ref.shape == (len(pixels) // 4, 64)
  assert len(set(vision_layout(grids, model.config.vision).full_segments.tolist())) == len(grids) + 1
  assert rel_err(ours, ref) <= 1e-4


@pytest.fixture(scope="module")
def scanned(vl):
  """The `vl` checkpoint loaded with scan_layers=True: decoder layers and vision blocks stacked."""
  return from_pretrained(vl[0], scan_layers=True)


def test_scanned_tower_matches_unrolled_and_hf(vl, forward, scanned):
  """The scanned tower (one block traced, full-or-window attention a scanned flag) gives the unrolled
  tower's features and HF's, on one image and on two images of different sizes, and the CASES logits."""
  _, hf, model = vl
  assert scanned.visual.blocks.attn.qkv.kernel.shape[0] == model.config.vision.depth == 3
  rng = np.random.default_rng(21)
  for grids in ([(1, 8, 12)], [(1, 4, 6), (1, 12, 8)]):
    grids = np.array(grids, np.int64)
    pixels = rng.standard_normal((int(np.prod(grids, axis=1).sum()), PATCH_DIM)).astype(np.float32)
    ours = np.asarray(scanned.image_features(pixels, grids))
    with torch.no_grad():
      ref = hf.model.visual(torch.as_tensor(pixels), grid_thw=torch.as_tensor(grids)).pooler_output.numpy()
    assert ours.shape == ref.shape == (len(pixels) // 4, 64)
    assert rel_err(ours, ref) <= 1e-4
    assert rel_err(ours, np.asarray(model.image_features(pixels, grids))) <= 1e-5
  ids, mask, grids, pixels, unrolled, ref = forward
  got = np.asarray(
    scanned(jnp.asarray(ids), attention_mask=jnp.asarray(mask), pixel_values=pixels, image_grid_thw=grids)
  )
  for b in range(len(ROWS)):
    assert rel_err(got[b][mask[b]], ref[b][mask[b]]) <= 1e-4, ROWS[b]
    assert rel_err(got[b][mask[b]], unrolled[b][mask[b]]) <= 1e-5, ROWS[b]


def test_layouts_convert_with_identical_outputs(vl, scanned, tmp_path):
  """stack_layers / unstack_layers / to_layout move the tower's blocks with the LM's layers: the
  converted params give the other layout's features bit for bit; both save the same HF tensors."""
  from agentfly_jax.models.layer_stack import stack_layers, to_layout, tree_layout, unstack_layers

  _, _, model = vl
  grids = np.array([(1, 4, 6), (1, 8, 12)], np.int64)
  pixels = np.random.default_rng(22).standard_normal((int(np.prod(grids, axis=1).sum()), PATCH_DIM))
  pixels = pixels.astype(np.float32)
  features = lambda m: np.asarray(m.image_features(pixels, grids))  # noqa: E731
  want_unrolled, want_scanned = features(model), features(scanned)
  state, scanned_state = nnx.state(model), nnx.state(scanned)
  assert (tree_layout(state), tree_layout(scanned_state)) == ("unrolled", "scanned")
  stacked = stack_layers(state)
  assert jax.tree.structure(stacked) == jax.tree.structure(scanned_state)
  for a, b in zip(jax.tree.leaves(stacked), jax.tree.leaves(scanned_state)):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(features(nnx.merge(nnx.graphdef(scanned), stacked)), want_scanned)
  np.testing.assert_array_equal(features(nnx.merge(nnx.graphdef(model), unstack_layers(scanned_state))), want_unrolled)
  tree = {"params": scanned_state, "moments": [scanned_state]}  # every State in a pytree, as a TrainState's
  back = to_layout(to_layout(tree, "unrolled"), "scanned")
  assert tree_layout(to_layout(tree, "unrolled")) == "unrolled"
  for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(tree)):
    np.testing.assert_array_equal(a, b)
  ours, theirs = to_hf_state_dict(scanned), to_hf_state_dict(model)
  assert ours.keys() == theirs.keys() and "visual.blocks.2.attn.qkv.weight" in ours
  for name, value in theirs.items():
    np.testing.assert_array_equal(ours[name], value, err_msg=name)


def test_mrope_positions_match_hf_get_rope_index(vl):
  _, hf, model = vl
  rows = [CASES["images_of_different_sizes"], CASES["one_image"], [("text", 4), ("image", (1, 12, 4)), ("text", 1)]]
  ids, mask, grids, _ = batch(np.random.default_rng(12), rows)
  ours, deltas = mrope_positions(ids, grids, model.config, mask)
  ref, ref_deltas = hf.model.get_rope_index(
    torch.as_tensor(ids, dtype=torch.long),
    torch.as_tensor(ids == IMAGE, dtype=torch.int32),
    image_grid_thw=torch.as_tensor(grids),
    attention_mask=torch.as_tensor(mask, dtype=torch.long),
  )
  np.testing.assert_array_equal(ours, ref.numpy())
  np.testing.assert_array_equal(deltas, ref_deltas.numpy()[:, 0])
  assert ours.shape == (3,) + ids.shape
  assert (ours[1] != ours[2]).any() and (deltas < 0).all()  # images' rows and columns; fewer positions than tokens


@pytest.mark.slow
def test_jitted_forward_with_layout_and_scanned_layers(vl, forward):
  """Under jit the host computes the layout and positions; the scanned LM gives the same logits."""
  folder, _, model = vl
  ids, mask, grids, pixels, eager, _ = forward
  positions, _ = mrope_positions(ids, grids, model.config, mask)
  layout = vision_layout(grids, model.config.vision)
  scanned = from_pretrained(folder, scan_layers=True)

  @jax.jit
  def forward(m, ids, mask, positions, pixels, layout):
    return m(ids, attention_mask=mask, positions=positions, pixel_values=pixels, vision_layout=layout)

  for m in (model, scanned):
    out = np.asarray(forward(m, jnp.asarray(ids), jnp.asarray(mask), positions, pixels, layout))
    assert rel_err(out[mask], eager[mask]) <= 1e-5


def test_text_only_forward_matches_hf(vl, forward):
  """No images: plain [B, T] positions, as HF's text-only forward."""
  _, hf, model = vl
  ids = np.where(forward[0] == IMAGE, 7, forward[0])
  with torch.no_grad():
    ref = hf(input_ids=torch.as_tensor(ids, dtype=torch.long)).logits.numpy()
  assert rel_err(model(jnp.asarray(ids)), ref) <= 1e-4


def test_round_trip_to_hf(vl, tmp_path):
  folder, hf, model = vl
  out = save_pretrained(model, tmp_path / "rt")
  loaded = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(out).eval()
  ours_sd = to_hf_state_dict(model)
  hf_sd = {k: v.numpy() for k, v in loaded.state_dict().items()}
  for name, value in hf.state_dict().items():
    np.testing.assert_array_equal(ours_sd[_saved_name(name)], value.numpy(), err_msg=name)
    np.testing.assert_array_equal(hf_sd[name], value.numpy(), err_msg=name)
  assert len(ours_sd) == len(hf.state_dict())


def test_tiny_config_matches_hf_names_and_shapes():
  """tiny_config("qwen2_5_vl")'s HF config.json builds HF's model, whose tensors are ours by name and
  shape, and reads back as the same config."""
  from agentfly_jax.models import ModelConfig, hf_name

  cfg = tiny_config("qwen2_5_vl", vocab_size=320, tie_word_embeddings=False)
  hf_dict = cfg.to_hf_dict()
  assert ModelConfig.from_hf_dict(hf_dict) == cfg
  hf = transformers.Qwen2_5_VLForConditionalGeneration(transformers.Qwen2_5_VLConfig(**hf_dict))
  assert hf.config.vision_config.depth == cfg.vision.depth and hf.config.image_token_id == cfg.image_token_id
  hf_shapes = {_saved_name(k): tuple(v.shape) for k, v in hf.state_dict().items()}
  abstract = nnx.eval_shape(lambda: Qwen25VL(cfg, rngs=nnx.Rngs(0)))
  ours = {}
  for path, var in nnx.to_flat_state(nnx.state(abstract, nnx.Param)):
    name, transposed = hf_name(path)
    ours[name] = (var.shape[-1],) + tuple(var.shape[:-1]) if transposed else tuple(var.shape)
  assert ours == hf_shapes


def test_image_for_text_only_model_is_refused():
  model = nnx.eval_shape(lambda: CausalLM(tiny_config("qwen2", vocab_size=64), rngs=nnx.Rngs(0)))
  with pytest.raises(ValueError, match="text-only model"):
    model(jnp.zeros((1, 4), jnp.int32), pixel_values=np.zeros((4, PATCH_DIM), np.float32), image_grid_thw=[[1, 2, 2]])


def test_more_image_tokens_than_grids_take_is_refused(vl):
  _, _, model = vl
  ids, mask, grids, pixels = batch(np.random.default_rng(15), [CASES["one_image"]])
  extra = np.concatenate([ids, np.full((1, 3), IMAGE, np.int32)], axis=1)
  with pytest.raises(ValueError, match="more image tokens"):
    mrope_positions(extra, grids, model.config)
  with pytest.raises(ValueError, match="image tokens"):
    model(jnp.asarray(extra), pixel_values=pixels, image_grid_thw=grids)
  with pytest.raises(ValueError, match="take only"):
    mrope_positions(ids, np.concatenate([grids, grids]), model.config)


def test_every_param_has_logical_axes_and_a_partition_spec():
  from agentfly_jax.models import partition_specs
  from agentfly_jax.models.sharding import logical_axes

  for scan in (False, True):
    cfg = tiny_config("qwen2_5_vl", scan_layers=scan)
    abstract = nnx.eval_shape(lambda: Qwen25VL(cfg, rngs=nnx.Rngs(0)))
    flat = nnx.to_flat_state(nnx.state(abstract, nnx.Param))
    unnamed = [path for path, var in flat if logical_axes(var) is None]
    assert not unnamed
    specs = nnx.to_flat_state(partition_specs(abstract))
    assert len(specs) == len(flat)
    if scan:  # the language model's layers and the vision blocks stacked on a leading "layers" axis
      flat, specs = dict(flat), dict(specs)
      lm, tower = ("model", "layers", "self_attn", "q_proj", "kernel"), ("visual", "blocks", "attn", "qkv", "kernel")
      assert (flat[lm].shape[0], flat[tower].shape[0]) == (cfg.num_hidden_layers, cfg.vision.depth)
      blocks = [p for p in flat if p[:2] == ("visual", "blocks")]
      assert blocks and all(logical_axes(flat[p])[0] == "layers" for p in blocks + [lm])
      assert all(tuple(specs[p])[0] is None for p in blocks + [lm])  # the layers axis is never split
    else:
      assert ("visual", "blocks", 0, "attn", "qkv", "kernel") in dict(flat)


def test_bad_vision_config_is_refused_by_name():
  with pytest.raises(ValueError, match="mrope_section"):
    tiny_config("qwen2_5_vl", mrope_section=(4, 4, 4))
  with pytest.raises(ValueError, match="VisionConfig.window_size"):
    tiny_config("qwen2_5_vl").vision.replace(window_size=12)
  with pytest.raises(ValueError, match="need model_type 'qwen2_5_vl'"):
    tiny_config("qwen2", mrope_section=(4, 6, 6))
  with pytest.raises(ValueError, match=r"image_grid_thw\[0\]"):
    mrope_positions(np.zeros((1, 4), np.int32), [[1, 3, 4]], tiny_config("qwen2_5_vl"))


def test_train_step_calls_with_images(vl, forward):
  """The train step's calls (hidden_states + token_logprobs_entropy, as rl/core/train_step.py makes them)
  with images added as pixel_values + vision_layout and positions [3, B, T]: HF's log-probs, the vision
  placeholders out of the softmax (a target that is one: probability 0, a finite log-prob)."""
  _, hf, model = vl
  ids, mask, grids, pixels, _, ref = forward
  positions, _ = mrope_positions(ids, grids, model.config, mask)
  targets = np.roll(ids, -1, axis=1)
  hidden, _ = model.hidden_states(
    jnp.asarray(ids),
    attention_mask=jnp.asarray(mask),
    positions=jnp.asarray(positions),
    pixel_values=jnp.asarray(pixels),
    vision_layout=vision_layout(grids, model.config.vision),
  )
  lp, _ = model.token_logprobs_entropy(hidden, jnp.asarray(targets), chunk=16)
  suppressed = np.asarray(ref, np.float32).copy()
  suppressed[..., placeholders(hf.config)] = -np.inf
  ref_lp = np.take_along_axis(jax.nn.log_softmax(jnp.asarray(suppressed), axis=-1), targets[..., None], axis=-1)[..., 0]
  written = mask & ~np.isin(targets, placeholders(hf.config))
  assert written.sum() > 10 and (mask & ~written).any()
  np.testing.assert_allclose(np.asarray(lp)[written], np.asarray(ref_lp)[written], atol=2e-4)
  assert np.all(np.asarray(lp)[mask & ~written] < -1e8) and np.isfinite(np.asarray(lp)).all()
  # the plain-logits path (train.logits_chunk=0) through the same softmax
  from agentfly_jax.rl.core.train_step import policy_logprobs_entropy

  vision = dict(pixel_values=jnp.asarray(pixels), vision_layout=vision_layout(grids, model.config.vision))
  plain, _ = policy_logprobs_entropy(
    model, jnp.asarray(ids), jnp.asarray(targets), jnp.asarray(mask), chunk=0, vision={**vision, "positions": positions}
  )
  np.testing.assert_allclose(np.asarray(plain)[written], np.asarray(ref_lp)[written], atol=2e-4)
  assert np.all(np.asarray(plain)[mask & ~written] < -1e8)


@pytest.mark.slow  # tracing a 7B-sized model's init: ~30 s on a loaded 2-core CPU
@pytest.mark.parametrize("name", ["qwen2.5-vl-3b", "qwen2.5-vl-7b"])
def test_presets_build_as_hf_builds_them(name):
  """The presets (transformers 4.x config layout) build; their parameters are HF's model's, name by name
  (HF's built on the meta device, no memory)."""
  from agentfly_jax.models import ModelConfig, hf_name
  from agentfly_jax.models.presets import preset_hf_config

  hf_dict = preset_hf_config(name)
  cfg = ModelConfig.from_hf_dict(hf_dict)
  assert cfg.mrope_section == (16, 24, 24) and cfg.vision.out_hidden_size == cfg.hidden_size
  with torch.device("meta"):
    hf = transformers.Qwen2_5_VLForConditionalGeneration(transformers.Qwen2_5_VLConfig(**hf_dict))
  hf_shapes = {_saved_name(k): tuple(v.shape) for k, v in hf.state_dict().items()}
  if cfg.tie_word_embeddings:
    hf_shapes.pop("lm_head.weight")
  abstract = nnx.eval_shape(lambda: Qwen25VL(cfg, rngs=nnx.Rngs(0)))
  ours = {}
  for path, var in nnx.to_flat_state(nnx.state(abstract, nnx.Param)):
    hf_key, transposed = hf_name(path)
    ours[hf_key] = (var.shape[-1],) + tuple(var.shape[:-1]) if transposed else tuple(var.shape)
  assert ours == hf_shapes

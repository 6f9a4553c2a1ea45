"""Image messages through our chat template + image processor equal HF's Qwen2_5_VLProcessor; bad images refused."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from agentfly_jax.vision.content import normalize_content, to_content_parts
from agentfly_jax.vision.decode import ImageError, decode_image, image_data_url, image_png_bytes
from agentfly_jax.vision.processor import VisionProcessor, check_text_only
from tests.agents.vision_testlib import hf_processor, random_image, vl_tokenizer


def _hf(messages, add_generation_prompt=True):
  out = hf_processor().apply_chat_template(
    messages, tokenize=True, return_dict=True, return_tensors="np", add_generation_prompt=add_generation_prompt
  )
  return out["input_ids"][0], out.get("pixel_values"), out.get("image_grid_thw")


def _ours(messages, add_generation_prompt=True, **kwargs):
  return VisionProcessor().encode(vl_tokenizer(), messages, add_generation_prompt=add_generation_prompt, **kwargs)


def _assert_equal(messages, reference_messages=None):
  enc = _ours(messages)
  ids, pixels, grid = _hf(reference_messages or messages)
  np.testing.assert_array_equal(enc.token_ids, ids)
  np.testing.assert_array_equal(enc.image_grid_thw, grid)
  np.testing.assert_allclose(enc.pixel_values, pixels, rtol=0, atol=1e-6)
  return enc


@pytest.mark.parametrize("size", [(37, 53), (224, 224), (90, 310), (500, 28)])
def test_one_image_equals_hf(size):
  rng = np.random.default_rng(size[0] * 1000 + size[1])
  image = random_image(rng, *size)
  messages = [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": "What is it?"}]}]
  enc = _assert_equal(messages)
  n_pad = int((enc.token_ids == vl_tokenizer().token_to_id("<|image_pad|>")).sum())
  assert n_pad == int(np.prod(enc.image_grid_thw[0])) // 4 > 0


def test_several_images_and_a_later_turn_equal_hf():
  rng = np.random.default_rng(7)
  a, b, c = random_image(rng, 60, 45), random_image(rng, 120, 80), random_image(rng, 33, 200)
  messages = [
    {"role": "system", "content": "You look at pictures."},
    {
      "role": "user",
      "content": [{"type": "text", "text": "Compare "}, {"type": "image", "image": a}, {"type": "image", "image": b}],
    },
    {"role": "assistant", "content": "The first is smaller."},
    {"role": "user", "content": [{"type": "text", "text": "And this one?"}, {"type": "image", "image": c}]},
  ]
  enc = _assert_equal(messages)
  assert enc.image_grid_thw.shape == (3, 3)


def test_image_url_bytes_array_and_modes_equal_hf_on_the_same_images():
  """data URLs, PNG bytes, uint8 arrays and RGBA / L images decode to what HF gets from the PIL image itself."""
  rng = np.random.default_rng(11)
  rgba, gray, rgb = random_image(rng, 40, 64, "RGBA"), random_image(rng, 70, 30, "L"), random_image(rng, 50, 50)
  ours = [
    {
      "role": "user",
      "content": [
        {"type": "image_url", "image_url": {"url": image_data_url(rgba)}},
        {"type": "image", "image": image_png_bytes(gray)},
        {"type": "image", "image": np.asarray(rgb)},
        {"type": "text", "text": "three"},
      ],
    }
  ]
  reference = [
    {"role": "user", "content": [{"type": "image", "image": im} for im in (rgba, gray, rgb)] + [ours[0]["content"][3]]}
  ]
  _assert_equal(ours, reference)


def test_text_only_messages_render_as_the_plain_tokenizer():
  messages = [{"role": "user", "content": "hello"}]
  enc = _ours(messages)
  ids, _, _ = _hf(messages)
  np.testing.assert_array_equal(enc.token_ids, ids)
  assert enc.image_grid_thw.shape == (0, 3) and enc.images == []


def test_bad_images_name_their_field():
  field = "messages[0].content[1].image"
  with pytest.raises(ImageError, match=r"messages\[0\]\.content\[1\]\.image: the bytes do not decode"):
    decode_image(b"\x89PNG not really", field)
  png = image_png_bytes(Image.new("RGB", (40, 40)))
  with pytest.raises(ImageError, match="truncated or corrupt"):
    decode_image(png[: len(png) // 2], field)
  with pytest.raises(ImageError, match="dtype float32"):
    decode_image(np.zeros((4, 4, 3), np.float32), field)
  with pytest.raises(ImageError, match=r"shape \(4, 4, 2\)"):
    decode_image(np.zeros((4, 4, 2), np.uint8), field)
  with pytest.raises(ImageError, match="no fetching"):
    decode_image("https://example.com/a.png", field)
  with pytest.raises(ImageError, match="not valid base64"):
    decode_image("data:image/png;base64,@@@", field)
  with pytest.raises(ImageError, match=r"content\[0\]\.type: expected 'text', 'image' or 'image_url'"):
    normalize_content([{"type": "audio"}], "content")
  with pytest.raises(ImageError, match=r"messages\[0\]\.content\[0\]: an image part, but the model reads text only"):
    check_text_only([{"role": "user", "content": [{"type": "image", "image": png}]}])


def test_a_decompression_bomb_is_refused_before_decoding():
  """A PNG whose header declares 30000 x 30000 pixels (900 M) is refused from its header, never decoded."""
  small = Image.new("1", (30000, 30000))  # 1-bit: 112 MB of pixels, a few hundred kB as PNG
  buf = io.BytesIO()
  small.save(buf, format="PNG", optimize=False)
  bomb = buf.getvalue()
  assert len(bomb) < 2_000_000
  with pytest.raises(
    ImageError, match=r"tool 'x': the image declares .*more than the limit|more pixels than the limit"
  ):
    decode_image(bomb, "tool 'x'")
  with pytest.raises(ImageError, match=r"the image declares 300 x 300 = 90000 pixels, more than the limit of 1000"):
    decode_image(image_data_url(Image.new("RGB", (300, 300))), "obs", max_pixels=1000)


def test_modes_convert_to_rgb_or_are_refused():
  rng = np.random.default_rng(9)
  for mode in ("L", "RGBA", "P", "I;16", "CMYK"):
    image = random_image(rng, 6, 5, "RGBA").convert(mode)
    assert decode_image(image, "img").mode == "RGB"
  with pytest.raises(ImageError, match=r"img: an image in mode 'La' cannot be converted to RGB"):
    decode_image(Image.new("La", (8, 8)), "img")


def test_more_image_tokens_than_the_context_is_an_error_naming_the_image():
  rng = np.random.default_rng(3)
  messages = [
    {
      "role": "user",
      "content": [{"type": "text", "text": "a"}, {"type": "image", "image": random_image(rng, 280, 280)}],
    }
  ]
  with pytest.raises(ImageError, match=r"messages\[0\]\.content\[1\]: the image needs 100 image tokens"):
    _ours(messages, max_tokens=60)
  assert len(_ours(messages, max_tokens=200).token_ids) < 200


def test_tool_values_become_parts():
  rng = np.random.default_rng(5)
  image = random_image(rng, 20, 30)
  assert to_content_parts("text", "tool 't'") is None and to_content_parts([1, "a"], "tool 't'") is None
  parts = to_content_parts(["see:", image, image_png_bytes(image), np.asarray(image)], "tool 't'")
  assert [p["type"] for p in parts] == ["text", "image", "image", "image"]
  for p in parts[1:]:
    np.testing.assert_array_equal(np.asarray(p["image"]), np.asarray(image))
  with pytest.raises(ImageError, match=r"tool 't'\[1\]\.image: the bytes do not decode"):
    to_content_parts(["a", b"junk"], "tool 't'")
  encoded = base64.b64encode(image_png_bytes(image)).decode()
  assert to_content_parts([{"type": "image_url", "image_url": {"url": "data:image/png;base64," + encoded}}], "f")


def test_a_models_own_resize_bounds_are_read_from_its_folder(tmp_path):
  from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

  Qwen2VLImageProcessorPil(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16).save_pretrained(tmp_path)
  image = random_image(np.random.default_rng(13), 400, 300)
  _, grid = VisionProcessor.from_pretrained(tmp_path).process([image])
  _, default_grid = VisionProcessor().process([image])
  assert int(np.prod(grid[0])) // 4 <= 16 < int(np.prod(default_grid[0])) // 4
  _, small_grid = VisionProcessor(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16).process([image])
  np.testing.assert_array_equal(grid, small_grid)
  with pytest.raises(FileNotFoundError, match="preprocessor_config.json does not exist"):
    VisionProcessor.from_pretrained(tmp_path / "missing")


def test_an_image_url_part_without_a_type_is_an_image():
  image = random_image(np.random.default_rng(14), 30, 30)
  [part] = normalize_content([{"image_url": {"url": image_data_url(image)}}], "content")
  np.testing.assert_array_equal(np.asarray(part["image"]), np.asarray(image))

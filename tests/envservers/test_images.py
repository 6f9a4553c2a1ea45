"""Image observations: the part builders (PIL / uint8 arrays / PNG bytes, pixels round-trip), the bounded
checks (a decompression bomb refused from its header, an oversized image before base64 decoding, a wrong
mode, undecodable data), and a real env server that turns each bad observation into an error (an error
observation for `step`, a BadObservation reply for `reset`) and serves the next call on the same chain."""

from __future__ import annotations

import base64
import io
import time

import numpy as np
import pytest
import trio
from PIL import Image

from envservers import images, protocol
from envservers.client import Connection
from envservers.envs.image_probe import bomb_png, mode_i16_png
from envservers_helpers import running_server

FRAME_BYTES = 1_000_000


@pytest.fixture(scope="module")
def probe_server():
  with running_server("image_probe=2:1", extra=("--max-frame-bytes", str(FRAME_BYTES))) as server:
    yield server


def _pixels(part: dict) -> np.ndarray:
  return np.asarray(images.decode_image_part(part))


def _png_part(data: bytes) -> dict:
  return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()}}


def test_parts_from_pil_arrays_and_png_bytes_round_trip_their_pixels():
  rng = np.random.default_rng(7)
  rgb = rng.integers(0, 256, (17, 23, 3), dtype=np.uint8)
  rgba = rng.integers(0, 256, (9, 5, 4), dtype=np.uint8)
  gray = rng.integers(0, 256, (6, 11), dtype=np.uint8)
  for array in (rgb, rgba, gray):
    part = images.image_part(array)
    assert part["image_url"]["url"].startswith("data:image/png;base64,")
    np.testing.assert_array_equal(_pixels(part), array)
    np.testing.assert_array_equal(_pixels(images.image_part(Image.fromarray(array))), array)
    np.testing.assert_array_equal(_pixels(images.image_part(images.png_bytes(array))), array)
  palette = Image.fromarray(rgb).convert("P")  # converted to an allowed mode, same colours
  np.testing.assert_array_equal(_pixels(images.image_part(palette)), np.asarray(palette.convert("RGB")))
  obs = images.observation("How many?", rgb, gray)
  images.check_observation(obs)
  assert [p["type"] for p in obs] == ["text", "image_url", "image_url"] and obs[0]["text"] == "How many?"
  with pytest.raises(TypeError, match="uint8"):
    images.image_part(rgb.astype(np.float32))
  with pytest.raises(ValueError, match=r"\[H, W, 3\]"):
    images.image_part(np.zeros((4, 4, 2), np.uint8))
  with pytest.raises(TypeError, match="PIL image, a uint8 array or PNG bytes"):
    images.image_part("a path?")


def test_bad_images_are_refused_by_name_before_they_cost_anything():
  # A header declaring 36 M pixels (over our 16.8 M) and one declaring 2.5 G (over Pillow's own bound):
  # refused from the header, no pixel is decoded.
  for side in (6000, 50_000):
    t0 = time.perf_counter()
    with pytest.raises(images.ObservationError, match="pixels"):
      images.check_observation([_png_part(bomb_png(side, side))])
    assert time.perf_counter() - t0 < 0.5
  small = images.ImageLimits(max_pixels=100, max_image_bytes=10_000)
  with pytest.raises(images.ObservationError, match="11x10 = 110 pixels declared; the limit is 100"):
    images.image_part(np.zeros((10, 11), np.uint8), small)
  noise = np.random.default_rng(0).integers(0, 256, (9, 9, 3), dtype=np.uint8)
  images.image_part(noise, small)  # within both limits
  big = images.png_bytes(np.random.default_rng(1).integers(0, 256, (80, 80, 3), dtype=np.uint8))
  with pytest.raises(images.ObservationError, match=r"bytes of image data; the limit is 10,000"):
    images.check_observation([_png_part(big)], small)
  # 100 MB of base64: refused from its length (the payload is not even valid base64).
  huge = [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + "!" * 100_000_000}}]
  with pytest.raises(images.ObservationError, match="75,000,000 bytes"):
    images.check_observation(huge)
  with pytest.raises(images.ObservationError, match=r"observation\[1\]: mode 'I;16'"):
    images.check_observation([images.text_part("x"), _png_part(mode_i16_png())])
  with pytest.raises(images.ObservationError, match="does not decode"):
    images.check_observation([_png_part(big[: len(big) // 2])])
  cases = {
    "not a decodable image/png": [_png_part(b"GIF89a not a png")],
    "base64 payload does not decode": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@@"}}],
    "media type 'image/gif'": [{"type": "image_url", "image_url": {"url": "data:image/gif;base64,AAAA"}}],
    "must be a data URL": [{"type": "image_url", "image_url": {"url": "http://example.com/x.png"}}],
    r"observation\[0\].type: must be 'text' or 'image_url'": [{"type": "audio"}],
    "a text part is": [{"type": "text", "text": 3}],
    "at least one part": [],
    "a str or a list of parts": {"type": "text", "text": "x"},
  }
  for words, obs in cases.items():
    with pytest.raises(images.ObservationError, match=words):
      images.check_observation(obs)
  many = [images.image_part(noise)] * 9
  with pytest.raises(images.ObservationError, match="9 images; the limit is 8"):
    images.check_observation(many)


async def _chain(address: str):
  conn = await Connection.open(address, token=None)
  await conn.call("acquire", {"env": "image_probe", "chain_id": "c"})
  return conn


def test_server_serves_images_and_turns_bad_ones_into_errors_and_serves_on(probe_server):
  async def main():
    conn = await _chain(probe_server.address)
    args = {"env": "image_probe", "chain_id": "c"}
    first = await conn.call("reset", {**args, "row": {"color": [10, 200, 40]}})
    text, image = first["observation"]
    assert text == {"type": "text", "text": "probe: ok"}
    assert (_pixels(image) == [10, 200, 40]).all() and _pixels(image).shape == (24, 32, 3)
    # Two 400x400 noise PNGs (~480 KB each) are valid images but over the 1 MB frame of this server.
    for kind, words in (
      ("bomb", "6000x6000 = 36,000,000 pixels declared"),
      ("oversize", "75,000,000 bytes of image data"),
      ("frame:400", f"a reply frame holds at most {FRAME_BYTES:,} bytes"),
      ("mode", "mode 'I;16'"),
      ("truncated", "does not decode"),
      ("garbage", "not a decodable image/png"),
      ("bad_part", "must be 'text' or 'image_url'"),
      ("not_a_list", "a str or a list of parts"),
    ):
      out = await conn.call("step", {**args, "action": kind})
      assert out["info"]["error"] == protocol.BAD_OBSERVATION, kind
      assert out["observation"].startswith("Error (BadObservation)") and words in out["observation"], kind
      assert out["reward"] == 1.0 and out["done"] is False  # the env's reward and end are kept
      ok = await conn.call("step", {**args, "action": "ok"})  # the same chain, the next call works
      assert "error" not in ok["info"] and (_pixels(ok["observation"][1]) == [10, 200, 40]).all()
    for kind in ("bomb", "garbage"):
      with pytest.raises(protocol.RemoteError, match="reset returned a bad observation") as caught:
        await conn.call("reset", {**args, "row": {"kind": kind}})
      assert caught.value.error_type == protocol.BAD_OBSERVATION
      assert (await conn.call("reset", {**args, "row": {"color": [1, 2, 3]}}))["observation"][0]["type"] == "text"
    stats = await conn.call("stats")
    await conn.aclose()
    return stats

  stats = trio.run(main)
  assert stats["internal_errors"] == 0 and stats["connection_errors"] == 0
  assert stats["pools"]["image_probe"]["crashes"] == 0


def test_a_fitting_image_pair_passes_the_frame_check(probe_server):
  async def main():
    conn = await _chain(probe_server.address)
    out = await conn.call("step", {"env": "image_probe", "chain_id": "c", "action": "frame:200"})
    await conn.aclose()
    return out

  out = trio.run(main)
  assert "error" not in out["info"]
  a, b = (
    Image.open(io.BytesIO(base64.b64decode(p["image_url"]["url"].split(",", 1)[1]))) for p in out["observation"][1:]
  )
  assert a.size == b.size == (200, 200)

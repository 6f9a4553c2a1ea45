"""An env-server env type whose observations are content lists with images (registered on import, reached by
`python -m envservers --import image_obs_env --env image_obs=N`): `step({"height", "width", "seed"})` returns
`[{"type": "text", ...}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}]` of a random
image; `step("broken")` an image_url that is not an image."""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image

from envservers import BlockingEnv, StepOutcome, register_env


def random_png(height: int, width: int, seed: int) -> bytes:
  pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
  buf = io.BytesIO()
  Image.fromarray(pixels).save(buf, format="PNG")
  return buf.getvalue()


def _url(data: bytes) -> str:
  return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


@register_env
class ImageObs(BlockingEnv):
  name = "image_obs"

  def step_blocking(self, action):
    if action == "broken":
      return StepOutcome(observation=[{"type": "image_url", "image_url": {"url": _url(b"not a png")}}])
    png = random_png(int(action["height"]), int(action["width"]), int(action["seed"]))
    text = f"a {action['height']}x{action['width']} picture:"
    return StepOutcome(
      observation=[{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": _url(png)}}], reward=0.5
    )

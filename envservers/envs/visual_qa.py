"""`visual_qa`: questions about a picture drawn with Pillow (counts of shapes and colours, a word or number
written in it), one answer per episode, an exact-match reward.

A scene is up to 8 shapes (circle, square, triangle) in six flat colours, each in its own cell of a 4 x 4
grid on a white 224 x 224 canvas (no overlap, no anti-aliasing: one shape is one connected blob of one
colour), and for `read_text` questions a word or number in black in a free cell. Rows come from a seed:

    rows = make_rows(64, seed=0, split="train")    # split: train | dev | test

A row is {"id", "question", "answer", "solution": {"kind", "scene"}}: the scene the image is drawn from
sits in `solution` and the answer in `answer`, both reward-only fields (data/row_fields.py), so an agent
sees the question and, from `reset`, the image. Splits are disjoint: a scene-and-question's split is
fixed by a hash of it (8 : 1 : 1), whatever the seed.

reset(row) returns [text part: the question, image part: the picture]; a step's action is the answer
(text); the episode ends there with reward 1.0 for an exact match (case, spaces and a final full stop
ignored), else 0.0. The env reward `exact_match` gives the same for the episode's answer.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from envservers import images
from envservers.env import BlockingEnv, StepOutcome, env_reward
from envservers.registry import register_env

SIZE, GRID = 224, 4
CELL = SIZE // GRID
COLORS = {
  "red": (220, 30, 30),
  "green": (30, 160, 60),
  "blue": (30, 70, 220),
  "yellow": (235, 200, 20),
  "purple": (140, 50, 170),
  "orange": (245, 130, 20),
}
SHAPES = ("circle", "square", "triangle")
WORDS = tuple(
  "apple river stone cloud tiger piano lemon house chair green robot ocean train smile water light "
  "bread candle mango zebra violin pencil rocket garden".split()
)
KINDS = ("count_color", "count_shape", "count_shape_color", "read_text")
SPLITS = {"train": range(0, 8), "dev": range(8, 9), "test": range(9, 10)}
MAX_SHAPES = 8
_TARGET_KEYS = {"count_color": ("color",), "count_shape": ("shape",), "count_shape_color": ("shape", "color")}
_TARGET_KEYS["read_text"] = ()


def _plural(shape: str) -> str:
  return shape + "s"


def draw_scene(scene: dict) -> Image.Image:
  """The RGB picture of `scene` ({"shapes": [{shape, color, cell}], "text": {value, cell} | None})."""
  image = Image.new("RGB", (SIZE, SIZE), (255, 255, 255))
  draw = ImageDraw.Draw(image)
  for item in scene["shapes"]:
    row, col = divmod(item["cell"], GRID)
    x0, y0, pad = col * CELL, row * CELL, 8
    box = (x0 + pad, y0 + pad, x0 + CELL - pad, y0 + CELL - pad)
    fill = COLORS[item["color"]]
    if item["shape"] == "circle":
      draw.ellipse(box, fill=fill)
    elif item["shape"] == "square":
      draw.rectangle(box, fill=fill)
    else:
      draw.polygon([(box[0], box[3]), (box[2], box[3]), ((box[0] + box[2]) // 2, box[1])], fill=fill)
  text = scene.get("text")
  if text:
    row, col = divmod(text["cell"], GRID)
    font = ImageFont.load_default(size=22 if len(text["value"]) <= 3 else 15)
    draw.text((col * CELL + CELL // 2, row * CELL + CELL // 2), text["value"], fill=(0, 0, 0), font=font, anchor="mm")
  return image


def answer_for(kind: str, scene: dict, target: dict) -> str:
  """The answer to question `kind` about `scene` (target: the colour / shape asked about)."""
  shapes = scene["shapes"]
  if kind == "count_color":
    return str(sum(s["color"] == target["color"] for s in shapes))
  if kind == "count_shape":
    return str(sum(s["shape"] == target["shape"] for s in shapes))
  if kind == "count_shape_color":
    return str(sum(s["shape"] == target["shape"] and s["color"] == target["color"] for s in shapes))
  return scene["text"]["value"]


def question_for(kind: str, target: dict) -> str:
  if kind == "count_color":
    return f"How many {target['color']} shapes are in the picture? Answer with a number."
  if kind == "count_shape":
    return f"How many {_plural(target['shape'])} are in the picture? Answer with a number."
  if kind == "count_shape_color":
    return f"How many {target['color']} {_plural(target['shape'])} are in the picture? Answer with a number."
  return "What word or number is written in black in the picture? Answer with it alone."


def _random_item(rng: np.random.Generator) -> tuple[str, dict, dict]:
  kind = KINDS[int(rng.integers(len(KINDS)))]
  cells = [int(c) for c in rng.permutation(GRID * GRID)]
  n = int(rng.integers(1, MAX_SHAPES + 1))
  shapes = [
    {"shape": SHAPES[int(rng.integers(len(SHAPES)))], "color": list(COLORS)[int(rng.integers(len(COLORS)))], "cell": c}
    for c in cells[:n]
  ]
  text = None
  if kind == "read_text":
    value = WORDS[int(rng.integers(len(WORDS)))] if rng.random() < 0.5 else str(int(rng.integers(0, 1000)))
    text = {"value": value, "cell": cells[n]}
  target = {"shape": SHAPES[int(rng.integers(len(SHAPES)))], "color": list(COLORS)[int(rng.integers(len(COLORS)))]}
  if kind != "read_text" and rng.random() < 0.7:  # mostly ask about something that is there
    pick = shapes[int(rng.integers(n))]
    target = {"shape": pick["shape"], "color": pick["color"]}
  target = {k: target[k] for k in _TARGET_KEYS[kind]}
  return kind, {"shapes": shapes, "text": text}, target


def split_of(kind: str, scene: dict, target: dict) -> str:
  """The split a scene-and-question belongs to, from a hash of it (8 : 1 : 1)."""
  key = json.dumps({"kind": kind, "scene": scene, "target": target}, sort_keys=True)
  bucket = int(hashlib.sha256(key.encode()).hexdigest(), 16) % 10
  return next(name for name, buckets in SPLITS.items() if bucket in buckets)


def make_rows(n: int, seed: int, split: str = "train") -> list[dict]:
  """`n` rows of `split` (train | dev | test) from `seed`; disjoint across splits for any seeds."""
  if split not in SPLITS:
    raise ValueError(f"visual_qa split must be one of {sorted(SPLITS)}, got {split!r}")
  if not isinstance(n, int) or n < 0:
    raise ValueError(f"visual_qa: n must be a non-negative int, got {n!r}")
  rng = np.random.default_rng([seed, list(SPLITS).index(split)])
  rows, seen = [], set()
  while len(rows) < n:
    kind, scene, target = _random_item(rng)
    key = json.dumps([kind, scene, target], sort_keys=True)
    if split_of(kind, scene, target) != split or key in seen:
      continue
    seen.add(key)
    rows.append(
      {
        "id": f"visual_qa-{split}-{seed}-{len(rows)}",
        "question": question_for(kind, target),
        "answer": answer_for(kind, scene, target),
        "solution": {"kind": kind, "scene": scene, "target": target},
      }
    )
  return rows


def normalize(text: str) -> str:
  return " ".join(str(text).strip().rstrip(".").strip("\"'").split()).lower()


def _check_scene(row: dict) -> dict:
  """The row's scene, checked; ValueError naming the field."""
  solution = row.get("solution")
  if not isinstance(solution, dict) or not isinstance(solution.get("scene"), dict):
    raise ValueError("visual_qa row needs 'solution': {'kind', 'scene', 'target'} (as make_rows writes)")
  scene = solution["scene"]
  shapes = scene.get("shapes")
  if not isinstance(shapes, list) or len(shapes) > MAX_SHAPES:
    raise ValueError(f"visual_qa row field 'solution.scene.shapes' must be a list of at most {MAX_SHAPES} shapes")
  for i, item in enumerate(shapes):
    if not isinstance(item, dict) or item.get("shape") not in SHAPES or item.get("color") not in COLORS:
      raise ValueError(f"visual_qa row field 'solution.scene.shapes[{i}]' needs a shape in {SHAPES} and a colour")
    if not isinstance(item.get("cell"), int) or not 0 <= item["cell"] < GRID * GRID:
      raise ValueError(f"visual_qa row field 'solution.scene.shapes[{i}].cell' must be an int in [0, {GRID * GRID})")
  text = scene.get("text")
  if text is not None and (
    not isinstance(text, dict)
    or not isinstance(text.get("value"), str)
    or not 0 < len(text["value"]) <= 12
    or not isinstance(text.get("cell"), int)
    or not 0 <= text["cell"] < GRID * GRID
  ):
    raise ValueError(
      "visual_qa row field 'solution.scene.text' must be null or {'value': 1-12 characters, 'cell': int}"
    )
  if not isinstance(row.get("question"), str) or not isinstance(row.get("answer"), str):
    raise ValueError("visual_qa row needs a str 'question' and a str 'answer'")
  return scene


@register_env
class VisualQAEnv(BlockingEnv):
  name = "visual_qa"
  call_timeout_s = 30.0

  def __init__(self):
    self.row: dict | None = None
    self.given: str | None = None

  def reset_blocking(self, row: dict | None):
    self.row, self.given = None, None
    if row is None:
      return "No episode: reset with a visual_qa row."
    scene = _check_scene(row)
    self.row = row
    return [images.text_part(row["question"]), images.image_part(draw_scene(scene))]

  def step_blocking(self, action: Any) -> StepOutcome:
    if self.row is None:
      return StepOutcome("Error: no episode: reset with a visual_qa row first.", done=True, info={"error": "NoEpisode"})
    if self.given is not None:
      return StepOutcome("The episode is over: you answered already.", done=True, info={"error": "EpisodeOver"})
    if not isinstance(action, str):
      return StepOutcome(f"Error: the answer is text, got {type(action).__name__}", info={"error": "BadAction"})
    self.given = action
    reward = self.exact_match()
    return StepOutcome(f"Your answer {action.strip()!r:.80} is recorded.", reward=reward, done=True)

  @env_reward("exact_match")
  def exact_match(self) -> float:
    """1.0 if the episode's answer equals the row's (case, spaces, quotes and a final full stop ignored)."""
    if self.row is None or self.given is None:
      return 0.0
    return float(normalize(self.given) == normalize(self.row["answer"]))

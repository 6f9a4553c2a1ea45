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

from typing import Any

from PIL import Image, ImageDraw, ImageFont

from envservers import images
from envservers.env import BlockingEnv, StepOutcome, env_reward
from envservers.envs.visual_qa_rows import (  # noqa: F401 (the rows' home; importable from here too)
  CELL,
  COLORS,
  GRID,
  KINDS,
  MAX_SHAPES,
  SHAPES,
  SIZE,
  SPLITS,
  WORDS,
  answer_for,
  make_rows,
  question_for,
  split_of,
)
from envservers.registry import register_env


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

"""visual_qa's rows: scenes (shapes, colours, a word) and questions from a seed, seeded disjoint splits.

Pure data (no server imports), so a task makes the same rows the env server checks and draws
(envservers/envs/visual_qa.py; a task imports it through envservers.api).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

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
KINDS = ("count_color", "count_shape", "count_shape_color", "read_text")  # the default mix
# "name_color": 4-8 shapes of one colour, asked for the colour (six answers: a small visual task a random-init
# tower learns on CPU; make_rows(kinds=("name_color",)), tasks/visual_qa_colors.py)
ALL_KINDS = KINDS + ("name_color",)
SAME_COLOR_SHAPES = (4, 8)
SPLITS = {"train": range(0, 8), "dev": range(8, 9), "test": range(9, 10)}
MAX_SHAPES = 8
_TARGET_KEYS = {"count_color": ("color",), "count_shape": ("shape",), "count_shape_color": ("shape", "color")}
_TARGET_KEYS["read_text"] = ()
_TARGET_KEYS["name_color"] = ()


def _plural(shape: str) -> str:
  return shape + "s"


def answer_for(kind: str, scene: dict, target: dict) -> str:
  """The answer to question `kind` about `scene` (target: the colour / shape asked about)."""
  shapes = scene["shapes"]
  if kind == "count_color":
    return str(sum(s["color"] == target["color"] for s in shapes))
  if kind == "count_shape":
    return str(sum(s["shape"] == target["shape"] for s in shapes))
  if kind == "count_shape_color":
    return str(sum(s["shape"] == target["shape"] and s["color"] == target["color"] for s in shapes))
  if kind == "name_color":
    return shapes[0]["color"]
  return scene["text"]["value"]


def question_for(kind: str, target: dict) -> str:
  if kind == "count_color":
    return f"How many {target['color']} shapes are in the picture? Answer with a number."
  if kind == "count_shape":
    return f"How many {_plural(target['shape'])} are in the picture? Answer with a number."
  if kind == "count_shape_color":
    return f"How many {target['color']} {_plural(target['shape'])} are in the picture? Answer with a number."
  if kind == "name_color":
    return "What colour are the shapes in the picture? Answer with the colour alone."
  return "What word or number is written in black in the picture? Answer with it alone."


def _random_item(rng: np.random.Generator, kinds: tuple = KINDS) -> tuple[str, dict, dict]:
  kind = kinds[int(rng.integers(len(kinds)))]
  cells = [int(c) for c in rng.permutation(GRID * GRID)]
  if kind == "name_color":
    color = list(COLORS)[int(rng.integers(len(COLORS)))]
    n = int(rng.integers(SAME_COLOR_SHAPES[0], SAME_COLOR_SHAPES[1] + 1))
    shapes = [{"shape": SHAPES[int(rng.integers(len(SHAPES)))], "color": color, "cell": c} for c in cells[:n]]
    return kind, {"shapes": shapes, "text": None}, {}
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


def make_rows(n: int, seed: int, split: str = "train", kinds: tuple = KINDS) -> list[dict]:
  """`n` rows of `split` (train | dev | test) from `seed`, questions of `kinds` (default the four of
  KINDS); disjoint across splits for any seeds."""
  if split not in SPLITS:
    raise ValueError(f"visual_qa split must be one of {sorted(SPLITS)}, got {split!r}")
  if not isinstance(n, int) or n < 0:
    raise ValueError(f"visual_qa: n must be a non-negative int, got {n!r}")
  kinds = tuple(kinds)
  if not kinds or any(k not in ALL_KINDS for k in kinds):
    raise ValueError(f"visual_qa: kinds must be a non-empty subset of {ALL_KINDS}, got {kinds!r}")
  rng = np.random.default_rng([seed, list(SPLITS).index(split)])
  prefix = "visual_qa" if kinds == KINDS else "visual_qa_" + "_".join(kinds)
  rows, seen = [], set()
  while len(rows) < n:
    kind, scene, target = _random_item(rng, kinds)
    key = json.dumps([kind, scene, target], sort_keys=True)
    if split_of(kind, scene, target) != split or key in seen:
      continue
    seen.add(key)
    rows.append(
      {
        "id": f"{prefix}-{split}-{seed}-{len(rows)}",
        "question": question_for(kind, target),
        "answer": answer_for(kind, scene, target),
        "solution": {"kind": kind, "scene": scene, "target": target},
      }
    )
  return rows

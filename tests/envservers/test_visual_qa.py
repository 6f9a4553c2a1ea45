"""The `visual_qa` env: seeded, disjoint splits; answers that agree with the pixels of the picture the agent
gets (shapes counted as connected blobs of one colour); a scripted policy that reads the generating row at
full reward and a random one low, through a real env server."""

from __future__ import annotations

import json

import numpy as np
import pytest
import trio
from scipy import ndimage

from envservers import images, protocol
from envservers.client import Connection
from envservers.envs.visual_qa import COLORS, VisualQAEnv, make_rows, normalize
from envservers_helpers import running_server


@pytest.fixture(scope="module")
def vqa_server():
  with running_server("visual_qa=2:1") as server:
    yield server


def _key(row: dict) -> str:
  return json.dumps(row["solution"], sort_keys=True)


def test_rows_are_seeded_and_the_splits_disjoint():
  train, dev, test = make_rows(300, 0, "train"), make_rows(60, 0, "dev"), make_rows(60, 0, "test")
  assert train == make_rows(300, 0, "train") and make_rows(50, 1, "train") != train[:50]
  keys = [{_key(r) for r in rows} for rows in (train, dev, test, make_rows(60, 5, "test"))]
  assert len(keys[0]) == 300 and len(keys[1]) == 60 and len(keys[2]) == 60
  assert not (keys[0] & keys[1]) and not (keys[0] & keys[2]) and not (keys[1] & keys[2])
  assert not (keys[0] & keys[3])  # another seed's test rows are still not training rows
  assert {r["solution"]["kind"] for r in train} == {"count_color", "count_shape", "count_shape_color", "read_text"}
  assert len({r["answer"] for r in train}) > 10
  with pytest.raises(ValueError, match="split must be one of"):
    make_rows(3, 0, "validation")


def _blobs(pixels: np.ndarray) -> list[tuple[str, str]]:
  """(colour, shape) of every one-colour connected blob; the shape from its area in its 40x40 box."""
  found = []
  for color, rgb in COLORS.items():
    labels, count = ndimage.label((pixels == rgb).all(axis=-1))
    for i in range(1, count + 1):
      area = int((labels == i).sum())
      found.append((color, "square" if area > 1500 else "circle" if area > 1000 else "triangle"))
  return found


def test_the_answer_agrees_with_the_pixels_the_agent_gets():
  env = VisualQAEnv()
  rows = [r for r in make_rows(50, 3, "dev") if r["solution"]["kind"] != "read_text"]
  assert len(rows) > 25
  for row in rows:
    text, part = env.reset_blocking(row)
    assert text == {"type": "text", "text": row["question"]} and "solution" not in json.dumps(text)
    blobs = _blobs(np.asarray(images.decode_image_part(part)))
    target = row["solution"]["target"]
    counted = sum(all(dict(zip(("color", "shape"), b))[k] == v for k, v in target.items()) for b in blobs)
    assert str(counted) == row["answer"], (row["question"], blobs)
    assert len(blobs) == len(row["solution"]["scene"]["shapes"])


async def _play(conn: Connection, row: dict, answer) -> tuple[float, dict]:
  args = {"env": "visual_qa", "chain_id": row["id"]}
  await conn.call("acquire", args)
  try:
    first = (await conn.call("reset", {**args, "row": row}))["observation"]
    assert [p["type"] for p in first] == ["text", "image_url"]
    out = await conn.call("step", {**args, "action": answer(row)})
    assert out["done"]
    reward = await conn.call("compute_reward", {**args, "name": "exact_match"})
    assert reward["reward"] == out["reward"]
    return out["reward"], first[1]
  finally:
    await conn.call("release", args)


def scripted(row: dict) -> str:
  """Reads the generating row's scene and counts (or reads the written text) itself."""
  solution = row["solution"]
  if solution["kind"] == "read_text":
    return solution["scene"]["text"]["value"].upper() + "."  # case and a full stop do not matter
  hits = [s for s in solution["scene"]["shapes"] if all(s[k] == v for k, v in solution["target"].items())]
  return f" {len(hits)} "


def test_scripted_policy_full_reward_random_low_through_a_server(vqa_server):
  rows = make_rows(40, 0, "test")
  rng = np.random.default_rng(0)

  def random_answer(row):
    return str(int(rng.integers(0, 9))) if rng.random() < 0.8 else "apple"

  async def main():
    conn = await Connection.open(vqa_server.address, token=None)
    good = [(await _play(conn, row, scripted))[0] for row in rows]
    rand = [(await _play(conn, row, random_answer))[0] for row in rows]
    # A bad row is an EnvError naming the field; the server serves the next chain.
    args = {"env": "visual_qa", "chain_id": "bad"}
    await conn.call("acquire", args)
    with pytest.raises(protocol.RemoteError, match="solution"):
      await conn.call("reset", {**args, "row": {"question": "q", "answer": "1"}})
    broken = {**rows[0], "solution": {**rows[0]["solution"], "scene": {"shapes": [{"shape": "star"}], "text": None}}}
    with pytest.raises(protocol.RemoteError, match=r"solution.scene.shapes\[0\]"):
      await conn.call("reset", {**args, "row": broken})
    again, _ = await _play(conn, rows[0], scripted)
    await conn.aclose()
    return good, rand, again

  good, rand, again = trio.run(main)
  print(f"visual_qa: scripted mean reward {np.mean(good):.3f} over {len(rows)}, random {np.mean(rand):.3f}")
  assert good == [1.0] * len(rows) and again == 1.0
  assert np.mean(rand) < 0.35


def test_answers_normalise_only_case_space_quotes_and_full_stop():
  assert normalize("  'Apple'. ") == "apple" and normalize("3.") == "3"
  assert normalize("3 shapes") != "3" and normalize("three") != "3"

"""The built-in visual_qa task: its rows hide the answer and the scene from the agent, its agent reads
images, and `build_run` builds a tiny Qwen2.5-VL run of configs/visual_qa_grpo.py (the policy a Qwen25VL,
its vision tower frozen by default, trained with model.vision.train=True)."""

from __future__ import annotations

import pytest
from flax import nnx

from agentfly_jax.data.row_fields import REWARD_ONLY_FIELDS, agent_view
from agentfly_jax.rl.spec import RunSpec
from agentfly_jax.tasks import get_task


def test_rows_and_agent():
  task = get_task("visual_qa")
  rows = task.make_rows(8, 0)
  assert len(rows) == 8 and all(r["question"] and r["answer"] for r in rows)
  test_ids = {r["id"] for r in task.make_eval_rows(8, 0)}
  assert not test_ids & {r["id"] for r in rows}
  seen = agent_view(rows[0], REWARD_ONLY_FIELDS)
  assert "answer" not in seen and "solution" not in seen


def test_splits_are_disjoint_and_the_default_rows_keep_their_draws():
  """train / dev (the evals during training) / test (the locked split) disjoint in both tasks; the kinds argument
  leaves the default mix's rows as they were drawn (the same scenes from the same seeds)."""
  from envservers.api import visual_qa_rows

  for name in ("visual_qa", "visual_qa_colors"):
    task = get_task(name)
    splits = [task.make_rows(64, 0), task.make_eval_rows(32, 0), task.make_test_rows(32, 0)]
    scenes = [{repr(r["solution"]) for r in rows} for rows in splits]
    assert not (scenes[0] & scenes[1] or scenes[0] & scenes[2] or scenes[1] & scenes[2]), name
    assert {r["id"].split("-")[1] for r in splits[2]} == {"test"}
  assert visual_qa_rows.make_rows(16, 3) == visual_qa_rows.make_rows(16, 3, "train", visual_qa_rows.KINDS)
  with pytest.raises(ValueError, match="kinds must be a non-empty subset"):
    visual_qa_rows.make_rows(2, 0, "train", ("colour",))


def test_colour_rows_and_the_demo_policy():
  """visual_qa_colors: 4-8 shapes of one colour, the answer that colour; the demo calls the answer tool with the
  row's colour when told to (`use_tool`), else with a guess it leaves out of the loss."""
  import json

  import numpy as np

  from agentfly_jax.tasks import visual_qa_colors

  rows = visual_qa_colors.make_rows(48, 1)
  for r in rows:
    shapes = r["solution"]["scene"]["shapes"]
    assert 4 <= len(shapes) <= 8 and {s["color"] for s in shapes} == {r["answer"]}
  assert len({r["answer"] for r in rows}) == len(visual_qa_colors.COLORS)
  rng = np.random.default_rng(0)
  said = set()
  for r in rows[:20]:
    [(text, learn)] = visual_qa_colors.scripted_response("", True, rng, row=r)  # the picture's colour, learned
    call = json.loads(text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
    assert learn and call == {"name": "answer", "arguments": {"answer": r["answer"]}}
    pieces = visual_qa_colors.scripted_response("", False, rng, row=r)  # a guess: generated, left out of the loss
    assert [learn for _, learn in pieces] == [True, False, True]
    call = json.loads("".join(t for t, _ in pieces).removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
    assert call["arguments"]["answer"] == pieces[1][0] in visual_qa_colors.COLORS
    said.add(pieces[1][0])
  assert len(said) > 3

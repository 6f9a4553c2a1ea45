"""The demo task: the tool, the reward, the data and the demonstration policy agree."""

import numpy as np

from agentfly_jax.tasks import Task, get_task
from agentfly_jax.tasks import lookup


def test_rows_tool_reward_and_demo_policy():
  rows = lookup.make_rows(50, seed=3)
  assert rows == lookup.make_rows(50, seed=3) and rows != lookup.make_rows(50, seed=4)
  for row in rows[:10]:
    obs = lookup.lookup(key=row["key"])
    assert obs == f"The code is {row['answer']}."
    assert lookup.code_match(prediction=obs, answer=row["answer"])["reward"] == 1.0
    wrong = next(w for w in lookup.WORDS if w != row["answer"])
    assert lookup.code_match(prediction=f"The code is {wrong}.", answer=row["answer"])["reward"] == 0.0
  assert lookup.lookup(key="not a key").startswith("Error")
  # codes spread over the word list (a fixed hash, not a constant)
  assert len({lookup.secret_code(k) for k in lookup.KEYS}) > 16
  rng = np.random.default_rng(0)
  prompt = f'...user\n{rows[0]["question"]}<|im_end|>\n<|im_start|>assistant\n'
  call = lookup.scripted_response(prompt, True, rng)
  assert f'"key": "{rows[0]["key"]}"' in call and call.startswith("<tool_call>")
  after_obs = prompt + call + f"<|im_end|>\n<tool_response>\n{lookup.lookup(key=rows[0]['key'])}\n</tool_response>"
  assert lookup.scripted_response(after_obs, True, rng) == f"The code is {rows[0]['answer']}."


def test_task_registry_and_user_task_errors():
  assert get_task("lookup") is lookup
  import pytest

  with pytest.raises(ValueError, match="unknown task 'nope'"):
    get_task("nope")
  with pytest.raises(ValueError, match=r"Task.rows: row 1"):
    Task(tools=[lookup.lookup], reward=lookup.code_match, rows=[{"question": "a"}, {"q": "b"}])
  t = Task(tools=[lookup.lookup], reward=lookup.code_match, rows=[{"question": "a", "answer": "x"}] * 3)
  assert len(t.make_rows(5, seed=1)) == 5 and t.spec().tools == (lookup.lookup,)


def test_user_task_eval_rows():
  rows = [{"question": f"q{i}", "answer": str(i)} for i in range(5)]
  t = Task(tools=[lookup.lookup], reward=lookup.code_match, rows=rows, eval_rows=rows[:2])
  assert [r["question"] for r in t.make_eval_rows(10, seed=0)] == ["q0", "q1"]
  t2 = Task(tools=[lookup.lookup], reward=lookup.code_match, rows=rows)
  assert len(t2.make_eval_rows(3, seed=0)) == 3

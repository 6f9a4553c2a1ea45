"""One task type (tasks/contract.TaskSpec, constructed as `Task(...)`): built-in task modules and
user modules are read by the one `from_module` (UPPERCASE globals, or @tool / @reward found), rows
are checked once as they enter the task, fixed rows stream in real epochs."""

import textwrap

import numpy as np
import pytest

from agentfly_jax.rl.config import default_config
from agentfly_jax.tasks import Task, TaskSpec, get_task, task_spec
from agentfly_jax.tasks.contract import from_module
from agentfly_jax.tasks.from_config import build_task, set_custom_task, task_fingerprint
from agent_testlib import tokenizer_dir

OLD_STYLE_MODULE = textwrap.dedent('''
    """A user task module written the old way: UPPERCASE globals, no @tool scan needed."""
    from agentfly_jax.rewards import reward
    from agentfly_jax.tools import tool

    @tool(name="shout")
    def shout(text: str) -> str:
      """Upper-cases text.

      Args:
        text: what to shout.
      """
      return text.upper()

    @reward(name="shouted")
    def shouted(prediction, answer):
      return float(str(prediction).strip() == answer)

    TOOLS = (shout,)
    REWARD = shouted
    SYSTEM_PROMPT = "Shout the word back."
    ROWS = [{"question": f"shout w{i}", "answer": f"W{i}"} for i in range(6)]
    EVAL_ROWS = [{"question": "shout e", "answer": "E"}]

    def scripted_response(prompt_text, use_tool, rng):
      return "W0"
''')


@pytest.fixture
def old_style_module(tmp_path, monkeypatch):
  (tmp_path / "old_style_task.py").write_text(OLD_STYLE_MODULE)
  monkeypatch.chdir(tmp_path)
  yield "old_style_task"
  import sys

  sys.modules.pop("old_style_task", None)


def test_a_builtin_module_becomes_the_contract():
  from agentfly_jax.tasks import lookup

  spec = task_spec(get_task("lookup"), "lookup")
  assert isinstance(spec, TaskSpec) and spec.name == "lookup" and spec.source is lookup
  assert spec.tools == lookup.TOOLS and spec.reward is lookup.REWARD and spec.system_prompt == lookup.SYSTEM_PROMPT
  assert spec.scripted_response is lookup.scripted_response and spec.agent_factory is lookup.make_agent
  assert spec.make_rows(5, seed=3) == lookup.make_rows(5, seed=3) and spec.env_types == ()
  # the dev split (eval during training) and the locked test split come from the module
  assert spec.make_eval_rows(4, seed=2) == lookup.make_eval_rows(4, seed=2)
  assert spec.make_test_rows(4, seed=2) == lookup.make_test_rows(4, seed=2)
  assert spec.tokenizer_corpus() == lookup.tokenizer_corpus()
  agent = spec.make_agent(tokenizer_dir())
  assert list(agent.tools) == ["lookup"]
  # build_task from a config gives the same contract
  built = build_task(default_config())
  assert built.tools == spec.tools and built.name == "lookup"
  assert task_fingerprint(built) == task_fingerprint(spec)


def test_env_types_come_from_the_tools_and_the_reward():
  spec = task_spec(get_task("webshop"))
  assert spec.env_types == ("webshop",) and spec.name == "webshop"


def test_a_module_without_make_agent_gets_the_default_agent():
  math_calc = get_task("math_calc")
  spec = task_spec(math_calc)
  assert spec.agent_factory is None and from_module(math_calc).agent_factory is None
  agent = spec.make_agent(tokenizer_dir())
  assert sorted(agent.tools) == sorted(t.name for t in math_calc.TOOLS)
  assert math_calc.SYSTEM_PROMPT in agent.system_prompt


def test_an_old_style_user_module_still_loads(old_style_module):
  c = set_custom_task(default_config(), module=old_style_module)
  spec = build_task(c)
  assert isinstance(spec, TaskSpec) and spec.name == "custom"
  assert [t.name for t in spec.tools] == ["shout"] and spec.reward.name == "shouted"
  assert spec.system_prompt == "Shout the word back." and spec.scripted_response is not None
  assert len(spec.rows) == 6 and spec.make_eval_rows(5, 0) == [{"question": "shout e", "answer": "E"}]
  rows = spec.make_rows(20, seed=1)
  assert len(rows) == 20 and {r["question"] for r in rows} <= {f"shout w{i}" for i in range(6)}
  # the module given directly is read the same way (the one reader of its globals)
  import importlib

  direct = task_spec(importlib.import_module(old_style_module))
  assert direct.tools == spec.tools and direct.reward is spec.reward and direct.name == old_style_module
  assert direct.rows == spec.rows and direct.eval_rows == spec.eval_rows
  with pytest.raises(ValueError, match="task 'custom' has no locked test split"):  # it defines none
    spec.make_test_rows(3, 0)


def test_a_user_module_s_locked_test_split_reaches_the_contract(old_style_module, tmp_path):
  """TEST_ROWS (fixed) or make_test_rows(n, seed) (generated, seed-dependent) of a module loaded by
  config.task.module: make_test_rows gives them, the training and dev rows do not include them."""
  rng = np.random.default_rng()
  words = [f"t{int(x)}" for x in rng.choice(10_000, size=5, replace=False)]
  source = (tmp_path / "old_style_task.py").read_text()
  (tmp_path / "fixed_test_task.py").write_text(
    source + f"TEST_ROWS = [{{'question': 'shout ' + w, 'answer': w.upper()}} for w in {words!r}]\n"
  )
  (tmp_path / "generated_test_task.py").write_text(
    source
    + "def make_test_rows(n, seed):\n  return [{'question': f'shout s{seed}-{i}', 'answer': 'X'} for i in range(n)]\n"
  )
  fixed = build_task(set_custom_task(default_config(), module="fixed_test_task"))
  assert [r["question"] for r in fixed.make_test_rows(3, seed=7)] == [f"shout {w}" for w in words[:3]]
  assert len(fixed.make_test_rows(100, 0)) == 5
  held_out = {r["question"] for r in fixed.make_test_rows(100, 0)}
  assert not held_out & {r["question"] for r in fixed.make_rows(200, 0) + fixed.make_eval_rows(100, 0)}
  generated = build_task(set_custom_task(default_config(), module="generated_test_task"))
  assert [r["question"] for r in generated.make_test_rows(2, seed=4242)] == ["shout s4242-0", "shout s4242-1"]
  assert generated.name == "custom" and generated.make_eval_rows(5, 0) == [{"question": "shout e", "answer": "E"}]
  # a bad fixed test row is named as the task is made (rows are checked once, as they enter the task)
  (tmp_path / "bad_test_task.py").write_text(
    source + "TEST_ROWS = [{'question': 'shout a', 'answer': 'A'}, {'answer': 'B'}]\n"
  )
  with pytest.raises(ValueError, match=r"module bad_test_task test rows.*1.*question"):
    build_task(set_custom_task(default_config(), module="bad_test_task"))
  import sys

  for name in ("fixed_test_task", "generated_test_task", "bad_test_task"):
    sys.modules.pop(name, None)


def test_a_task_object_becomes_the_contract():
  from agentfly_jax.tasks import lookup

  rows = [{"question": f"q{i}", "answer": str(i)} for i in range(5)]
  task = Task(
    tools=[lookup.lookup],
    reward=lookup.code_match,
    rows=rows,
    eval_rows=rows[:2],
    system_prompt="Find codes.",
    corpus=["extra text"],
  )
  spec = task_spec(task)
  assert Task is TaskSpec and spec is task  # one type
  assert spec.tools == (lookup.lookup,) and spec.reward is lookup.code_match and spec.source is None
  # fixed rows form real epochs: every row once per epoch, reshuffled per epoch
  drawn = spec.make_rows(15, seed=0)
  for e in range(3):
    assert sorted(r["question"] for r in drawn[5 * e : 5 * e + 5]) == [r["question"] for r in rows]
  assert drawn[:5] != drawn[5:10] or drawn[5:10] != drawn[10:]
  assert [r["question"] for r in spec.make_eval_rows(10, 0)] == ["q0", "q1"]
  corpus = spec.tokenizer_corpus()
  assert corpus[:2] == ["Find codes.", "extra text"] and "q0 0" in corpus
  assert task_spec(spec) is spec
  with pytest.raises(ValueError, match="has no locked test split"):
    spec.make_test_rows(2, 0)
  locked = task_spec(Task(tools=[lookup.lookup], reward=lookup.code_match, rows=rows[:3], test_rows=rows[3:]))
  assert locked.make_test_rows(10, seed=1) == rows[3:] and locked.make_test_rows(1, seed=2) == rows[3:4]
  assert (
    Task(tools=[lookup.lookup], reward=lookup.code_match, rows=rows[:3], test_rows=rows[3:]).make_test_rows(9, 0)
    == rows[3:]
  )
  with pytest.raises(TypeError, match="a task must be a TaskSpec, a Task or a task module, got dict"):
    task_spec({"tools": []})
  with pytest.raises(ValueError, match="has neither rows nor a row generator"):
    TaskSpec(name="empty", tools=(), reward=lookup.code_match)
  with pytest.raises(ValueError, match=r"Task.rows: row 1 has no field 'question'"):
    Task(tools=[lookup.lookup], reward=lookup.code_match, rows=[rows[0], {"answer": "1"}])
  # the same rows drawn either way, seeded
  a, b = spec.make_rows(50, seed=9), spec.make_rows(50, seed=9)
  assert a == b and len({r["question"] for r in a}) == 5
  assert np.all([isinstance(r, dict) for r in a])


def test_reward_only_fields_are_declared_per_task(old_style_module, tmp_path):
  from agentfly_jax.data.row_fields import REWARD_ONLY_FIELDS

  # a built-in task's own set; the default where a task declares none
  assert task_spec(get_task("webshop"), name="webshop").reward_only_fields == (*REWARD_ONLY_FIELDS, "goal")
  assert task_spec(get_task("multihop_qa")).reward_only_fields[-2:] == ("hops", "supporting_titles")
  assert task_spec(get_task("lookup")).reward_only_fields == REWARD_ONLY_FIELDS and "answer" in REWARD_ONLY_FIELDS
  # a user module's global, the config field over it, a Task's argument
  (tmp_path / "old_style_task.py").write_text(OLD_STYLE_MODULE + '\nREWARD_ONLY_FIELDS = ("answer", "gold")\n')
  assert build_task(set_custom_task(default_config(), module=old_style_module)).reward_only_fields == ("answer", "gold")
  flagged = set_custom_task(default_config(), module=old_style_module, reward_only_fields="answer, hint")
  assert build_task(flagged).reward_only_fields == ("answer", "hint")
  rows = [{"question": "q", "answer": "a"}]
  task = Task(reward=lambda prediction, answer: 1.0, rows=rows, reward_only_fields=["answer", "path"])
  assert task.spec().reward_only_fields == ("answer", "path")

  async def agent_fn(client, row):
    return ""

  # what a black-box agent is given is part of what the task trains on
  split = task_fingerprint(Task(reward=task.reward, rows=rows, agent_fn=agent_fn, reward_only_fields=["path"]))
  assert split != task_fingerprint(Task(reward=task.reward, rows=rows, agent_fn=agent_fn))
  with pytest.raises(ValueError, match="Task.reward_only_fields: 'question' cannot be reward-only"):
    Task(reward=task.reward, rows=rows, reward_only_fields=["question"])
  bad = set_custom_task(default_config(), module=old_style_module, reward_only_fields="answer,question")
  with pytest.raises(ValueError, match="config.task.reward_only_fields='answer,question': 'question' cannot"):
    build_task(bad)

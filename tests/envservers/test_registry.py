"""Tools and rewards by name: built-ins, `module:function`, and the errors that name what is wrong."""

import sys
import textwrap

import pytest

from agentfly_jax.rewards import Reward, exact_match, get_reward, list_rewards
from agentfly_jax.tools import Tool, calculator, get_tool, list_tools


def test_builtins_by_name():
  assert get_tool("calculator") is calculator
  assert get_reward("exact_match") is exact_match
  assert {"calculator", "answer", "code_interpreter"} <= set(list_tools())
  assert "exact_match" in list_rewards()
  for name in list_tools():
    assert isinstance(get_tool(name), Tool), name
  for name in list_rewards():
    assert isinstance(get_reward(name), Reward), name


def test_user_module_functions(tmp_path, monkeypatch):
  (tmp_path / "my_reg_task.py").write_text(
    textwrap.dedent('''
      from agentfly_jax import tool
      @tool
      def shout(text: str) -> str:
        """Shouts.

        Args:
          text: what to shout.
        """
        return text.upper()
      def plain_reward(prediction, answer):
        return float(prediction == answer)
      NOT_A_TOOL = 3
  ''')
  )
  monkeypatch.syspath_prepend(str(tmp_path))
  t = get_tool("my_reg_task:shout")
  assert isinstance(t, Tool) and t.name == "shout"
  assert get_tool("my_reg_task.shout") is t
  r = get_reward("my_reg_task:plain_reward")
  assert isinstance(r, Reward) and r.fn(prediction="a", answer="a") == 1.0
  with pytest.raises(ValueError, match="not a @tool"):
    get_tool("my_reg_task:NOT_A_TOOL")
  with pytest.raises(ValueError, match="has no attribute 'missing'"):
    get_tool("my_reg_task:missing")
  sys.modules.pop("my_reg_task", None)


def test_errors_name_the_input(tmp_path, monkeypatch):
  with pytest.raises(ValueError, match=r"unknown tool 'nope'.*calculator"):
    get_tool("nope")
  with pytest.raises(ValueError, match=r"unknown reward 'nope'.*exact_match"):
    get_reward("nope")
  (tmp_path / "broken_reg_mod.py").write_text("import does_not_exist_xyz\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  with pytest.raises(ValueError, match=r"module 'broken_reg_mod' does not import: ModuleNotFoundError"):
    get_reward("broken_reg_mod:f")
  with pytest.raises(ValueError, match="non-empty"):
    get_tool("")

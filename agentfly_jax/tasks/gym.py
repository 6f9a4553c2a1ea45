"""Any Gymnasium environment as a task: the `gymnasium` env type on the env servers.

  --config=configs/gym_grpo.py --config.task.row_defaults.gym_id=CliffWalking-v1   # or "my_module:MyEnv-v0"

Rows: {"question", "gym_id", "seed"} (`config.task.row_defaults.gym_id` fills a row's missing id; generated
rows are seeds 0..n-1, eval rows other seeds). The env's reset observation opens the chat (text;
non-text observations as JSON). Tool: `act` (one action as text: a Text action as is, a Discrete
one an integer, others JSON); its StepResult ends the chain when the episode ends. Reward: the
episode's summed env reward. `check_rows` makes each named env once here (gymnasium must be
importable) and names a gym id that does not exist before training.
"""

from __future__ import annotations

from agentfly_jax.envs.base import StepResult
from agentfly_jax.rewards import reward
from agentfly_jax.tasks.worlds import seeded_rows, tool_call_text, world_agent
from agentfly_jax.tools import tool

ENV = "gymnasium"
QUESTION = "Reach the goal of the environment below with as much reward as you can."
SYSTEM_PROMPT = (
  "You act in an environment. Send one action per turn with the act tool; its reply is the next observation."
)


@tool(name="act", env=ENV)
async def act(action: str, env) -> StepResult:
  """Takes one action in the environment.

  Args:
    action: the action as text (e.g. a command, or an integer for a discrete action space).
  """
  return await env.step(action)  # a StepResult: its `done` (the episode over) ends the chain


@reward(name="gym_return", env=ENV)
async def episode_return(env) -> dict:
  """The episode's summed env reward, with its steps."""
  return await env.compute_reward("return")


TOOLS = (act,)
REWARD = episode_return


def make_rows(n: int, seed: int) -> list[dict]:
  """n rows, env seeds seed*100000 + 0..n-1 (the id comes from config.task.row_defaults.gym_id)."""
  return seeded_rows(QUESTION, n, seed, split="train")


def make_eval_rows(n: int, seed: int) -> list[dict]:
  return seeded_rows(QUESTION, n, seed, split="test")


def check_gym_id(gym_id: str, where: str) -> None:
  """ValueError naming `gym_id` (and `where`) unless Gymnasium can make it here."""
  import gymnasium

  if not isinstance(gym_id, str) or not gym_id:
    raise ValueError(
      f"{where}: no gym id: set config.task.row_defaults.gym_id (e.g. CliffWalking-v1 or my_module:MyEnv-v0)"
    )
  try:
    gymnasium.make(gym_id).close()
  except (gymnasium.error.Error, ImportError, AttributeError) as e:
    raise ValueError(
      f"{where}: config.task.row_defaults.gym_id={gym_id!r} (or the rows' field 'gym_id') is not a registered "
      f"Gymnasium environment: {e}"
    ) from None


def check_rows(rows: list[dict], source: str) -> list[dict]:
  for gym_id in dict.fromkeys(r.get("gym_id") for r in rows):
    check_gym_id(gym_id, source)
  return rows


def make_agent(tokenizer, system_prompt: str = SYSTEM_PROMPT):
  return world_agent(tokenizer, TOOLS, REWARD, system_prompt, ENV)


def tokenizer_corpus() -> list[str]:
  texts = [SYSTEM_PROMPT, QUESTION] * 5
  texts += [tool_call_text("act", action=str(a)) for a in range(10)] * 3
  texts += ["Error: the action must be an integer", "the episode is over"] * 3
  return texts

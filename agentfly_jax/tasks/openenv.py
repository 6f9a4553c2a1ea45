"""Any OpenEnv environment server as a task: the `openenv` env type on the env servers.

  --config=configs/openenv_grpo.py --config.task.row_defaults.openenv_url=http://host:port
  ... --config.task.row_defaults.openenv_app=my_module:app    # or: an openenv-core FastAPI app, started per pool

Rows: {"question", "openenv_url" | "openenv_app", "seed"} (`config.task.row_defaults.openenv_url` /
`openenv_app` fill a row's missing server; generated rows are seeds 0..n-1, eval rows other
seeds). The server's reset observation opens the chat (as JSON). Tool: `act` (one action: a JSON
object of the action's fields, or text for an action with one field); its StepResult ends the
chain when OpenEnv says done. Reward: the episode's summed OpenEnv reward. `check_rows` probes
each URL (GET /health) and imports each app before training, naming the field and what failed.
"""

from __future__ import annotations

import importlib
import json
import urllib.request

from agentfly_jax.envs.base import StepResult
from agentfly_jax.rewards import reward
from agentfly_jax.tasks.worlds import seeded_rows, tool_call_text, world_agent
from agentfly_jax.tools import tool

ENV = "openenv"
QUESTION = "Reach the goal of the environment below with as much reward as you can."
SYSTEM_PROMPT = (
  "You act in an environment. Send one action per turn with the act tool; its reply is the next observation."
)
PROBE_TIMEOUT_S = 5.0


@tool(name="act", env=ENV)
async def act(action: str, env) -> StepResult:
  """Takes one action in the environment.

  Args:
    action: the action: a JSON object of its fields, or text for an action with one field.
  """
  return await env.step(action)  # a StepResult: its `done` (the episode over) ends the chain


@reward(name="openenv_return", env=ENV)
async def episode_return(env) -> dict:
  """The episode's summed OpenEnv reward, with its steps."""
  return await env.compute_reward("return")


TOOLS = (act,)
REWARD = episode_return


def make_rows(n: int, seed: int) -> list[dict]:
  """n rows, env seeds seed*100000 + 0..n-1 (the server comes from config.task.row_defaults)."""
  return seeded_rows(QUESTION, n, seed, split="train")


def make_eval_rows(n: int, seed: int) -> list[dict]:
  return seeded_rows(QUESTION, n, seed, split="test")


def check_url(url, where: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
  """ValueError naming config.task.row_defaults.openenv_url and `url` unless an OpenEnv server answers there."""
  if not isinstance(url, str) or not url.startswith(("http://", "https://")):
    raise ValueError(
      f"{where}: config.task.row_defaults.openenv_url must be an http(s) URL (http://host:port), got {url!r}"
    )
  try:
    with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=timeout_s) as reply:
      json.loads(reply.read())
  except (OSError, ValueError) as e:
    raise ValueError(
      f"{where}: config.task.row_defaults.openenv_url={url!r}: no OpenEnv server answers there (GET /health: {e})"
    ) from None


def check_app(app, where: str) -> None:
  """ValueError naming config.task.row_defaults.openenv_app unless `module:attr` imports here."""
  if not isinstance(app, str) or ":" not in app:
    raise ValueError(f"{where}: config.task.row_defaults.openenv_app must be 'module:attr', got {app!r}")
  module, _, attr = app.partition(":")
  try:
    getattr(importlib.import_module(module), attr)
  except (ImportError, AttributeError) as e:
    raise ValueError(f"{where}: config.task.row_defaults.openenv_app={app!r} does not import: {e}") from None


def check_rows(rows: list[dict], source: str) -> list[dict]:
  for url, app in dict.fromkeys((r.get("openenv_url"), r.get("openenv_app")) for r in rows):
    if url and app:
      raise ValueError(
        f"{source}: a row names both openenv_url and openenv_app (config.task.row_defaults gives both of its "
        "fields to a row that names neither); set one"
      )
    if app:
      check_app(app, source)
    elif url:
      check_url(url, source)
    else:
      raise ValueError(
        f"{source}: no OpenEnv server: set config.task.row_defaults.openenv_url (http://host:port) or openenv_app"
      )
  return rows


def make_agent(tokenizer, system_prompt: str = SYSTEM_PROMPT):
  return world_agent(tokenizer, TOOLS, REWARD, system_prompt, ENV)


def tokenizer_corpus() -> list[str]:
  texts = [SYSTEM_PROMPT, QUESTION] * 5
  texts += [tool_call_text("act", action=str(a)) for a in range(10)] * 3
  texts += ['{"message": "Guess a number", "done": false, "reward": 0.0}', "Error: the episode is over"] * 3
  return texts

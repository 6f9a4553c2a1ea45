"""`RolloutAgent`: what a rollout asks of an agent, as a `Protocol`.

The rollout (`agents/rollout.py`) drives any object with these members; `agents.base.Agent` is the
one the package builds. The type lives here, below both, so the rollout needs no import of
`agents/base.py` (whose `Agent.rollout` reaches the rollout through `agents/standalone.py`): no import cycle,
counting annotation-only imports.
"""

from __future__ import annotations

from typing import Protocol

from agentfly_jax.agents.parsers import ParsedTurn, ToolCall
from agentfly_jax.agents.tokenizer import AgentTokenizer
from agentfly_jax.rewards.reward import Reward
from agentfly_jax.tools.tool import Tool, ToolOutput


class RolloutAgent(Protocol):
  """The agent members a rollout uses (see `agents.base.Agent` for their meaning)."""

  tokenizer: AgentTokenizer
  reward_fn: Reward | None
  task_env: str | None
  stop_token_ids: tuple[int, ...]

  def render(self, messages: list[dict], template_tools: list[dict] | None, add_generation_prompt: bool) -> str: ...

  def observation_text(
    self, before: list[dict], new_messages: list[dict], template_tools: list[dict] | None, model_end_text: str
  ) -> str: ...

  def tools_for_row(self, row: dict) -> list[Tool]: ...

  def template_tools(self, tools: list[Tool]) -> list[dict] | None: ...

  def initial_messages(
    self, row: dict, tools: list[Tool], first_observation: str | list[dict] | None = None
  ) -> list[dict]: ...

  def parse(self, text: str) -> ParsedTurn: ...

  def assistant_message(self, text: str, parsed: ParsedTurn) -> dict: ...

  def resolve(self, call: ToolCall, tools: dict[str, Tool]) -> tuple[Tool | None, dict, str | None]: ...

  def observation_messages(self, results: list[tuple[ToolCall, ToolOutput]], errors: list[str]) -> list[dict]: ...

"""The lookup task's agent written with the OpenAI Agents SDK (`openai-agents`): an `Agent` with a
`function_tool`, run by `Runner.run`, its model pointed at the trainer's endpoint through
`OpenAIChatCompletionsModel` and the chain's client. Nothing here knows about agentfly_jax's agents:

  experiments/train.py --config=configs/lookup_endpoint_grpo.py \\
    --config.task.agent=agentfly_jax.tasks.lookup_agents_sdk:run

The SDK runs on asyncio (its tool calls, guardrails and hooks are asyncio tasks): the chain runs in
the rollout's asyncio loop thread (agents/agent_loops.py); the tool awaits the task's `lookup`
Tool, which runs back in the trio run. Tracing is off (it would send the traces to OpenAI).
"""

from __future__ import annotations

from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

from agentfly_jax.tasks.lookup import SYSTEM_PROMPT, lookup

set_tracing_disabled(True)


@function_tool(name_override="lookup", description_override="Looks up the secret code of a key.")
async def lookup_tool(key: str) -> str:
  return await lookup.acall(key=key)


async def run(client, row: dict, *, model: str = "policy", max_agent_turns: int = 8) -> str:
  """Runs the SDK agent on the row's question; its final output is the answer. `max_agent_turns`: the
  SDK's own loop cap (`Runner.run(max_turns=)`); the run's `rollout.max_turns` caps the requests."""
  agent = Agent(
    name="lookup",
    instructions=SYSTEM_PROMPT,
    tools=[lookup_tool],
    model=OpenAIChatCompletionsModel(model=model, openai_client=client),
    model_settings=ModelSettings(),
  )
  result = await Runner.run(agent, row["question"], max_turns=max_agent_turns)
  return str(result.final_output or "")

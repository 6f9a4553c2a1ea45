"""Agents: chat templates, tool-call parsers, the multi-chain multi-turn rollout, `Trajectory`.

from agentfly_jax.agents import ToolCallAgent, run_rollout, pad_batch
agent = ToolCallAgent(tokenizer_dir, tools=[calculator, answer], reward_fn=exact_match)
trajectories = run_rollout(agent, rows, sampler=sampler, num_chains=4, max_turns=4)
batch = pad_batch(trajectories)
result = ToolCallAgent.from_pretrained(hf_folder, tools=["calculator"]).rollout("What is 6*7?")
trajectories = run_endpoint_rollout(agent, rows, my_openai_agent, sampler=sampler)  # any agent
"""

from agentfly_jax.agents.agents import CodeAgent, ReactAgent, ToolCallAgent
from agentfly_jax.agents.base import Agent, TemplatePrefixError
from agentfly_jax.agents.chat_template import ChatTemplate, load_chat_template
from agentfly_jax.agents.display import format_trajectory, mask_segments
from agentfly_jax.agents.endpoint import ChatEndpoint, EndpointError, serve_endpoint
from agentfly_jax.agents.endpoint_rollout import endpoint_rollout, run_endpoint_rollout
from agentfly_jax.agents.parsers import ParsedTurn, ToolCall, parse_code_blocks, parse_hermes_tool_calls, parse_react
from agentfly_jax.agents.rollout import rollout, run_rollout, validate_rows
from agentfly_jax.agents.standalone import RolloutResult
from agentfly_jax.agents.tokenizer import AgentTokenizer, load_tokenizer
from agentfly_jax.agents.trajectory import Trajectory, pad_batch

__all__ = [
  "Agent",
  "ToolCallAgent",
  "ReactAgent",
  "CodeAgent",
  "TemplatePrefixError",
  "ChatTemplate",
  "load_chat_template",
  "AgentTokenizer",
  "load_tokenizer",
  "ParsedTurn",
  "ToolCall",
  "parse_hermes_tool_calls",
  "parse_react",
  "parse_code_blocks",
  "rollout",
  "run_rollout",
  "validate_rows",
  "Trajectory",
  "pad_batch",
  "format_trajectory",
  "mask_segments",
  "RolloutResult",
  "ChatEndpoint",
  "EndpointError",
  "serve_endpoint",
  "endpoint_rollout",
  "run_endpoint_rollout",
]

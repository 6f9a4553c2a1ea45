"""Prototyping without the trainer: `agent.rollout(...)` and `Agent.from_pretrained(folder, ...)`.

  agent = ToolCallAgent.from_pretrained("path/to/hf_folder", tools=["calculator"],
                                        reward="exact_match")      # JAX sampler (vllm=True: vLLM)
  result = agent.rollout([{"question": "What is 6*7?", "answer": "42"}], num_chains=4, max_turns=3)
  result.rewards            # [B * num_chains] floats
  print(result.transcripts[0])   # the chain's text; model-written (trained-on) tokens in ⟦ ⟧
  result.trajectories       # the Trajectory objects the trainer would train on

`rows_or_messages` is a question string, a row dict, a list of rows ({"question": ..., fields the
reward reads}), or one chat conversation (a list of {"role", "content"} messages: the rollout
starts from those messages; the last user message is the row's question).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from agentfly_jax.agents.display import format_trajectory
from agentfly_jax.agents.standalone_limits import STANDALONE
from agentfly_jax.agents.trajectory import Trajectory


@dataclasses.dataclass
class RolloutResult:
  """What `agent.rollout` returns: one entry per chain, row-major (row 0's chains first)."""

  trajectories: list[Trajectory]
  rewards: list[float]
  transcripts: list[str]

  def __len__(self) -> int:
    return len(self.trajectories)

  def __str__(self) -> str:
    return "\n\n".join(self.transcripts)


def as_rows(rows_or_messages: Any) -> list[dict]:
  """The rows of `agent.rollout`'s first argument (see the module docstring); TypeError otherwise."""
  x = rows_or_messages
  if isinstance(x, str):
    return [{"question": x}]
  if isinstance(x, dict):
    return [x]
  if isinstance(x, Sequence) and x and all(isinstance(m, dict) for m in x):
    if all("role" in m and "question" not in m for m in x):  # one conversation
      users = [m for m in x if m["role"] == "user" and isinstance(m.get("content"), str)]
      if not users:
        raise ValueError("agent.rollout: a conversation needs a user message with string content")
      return [{"question": users[-1]["content"], "messages": [dict(m) for m in x]}]
    return list(x)
  raise TypeError(
    "agent.rollout: expected a question string, a row dict, a list of rows or a list of "
    f"chat messages, got {type(x).__name__} {x!r:.80}"
  )


def standalone_rollout(
  agent,
  rows_or_messages: Any,
  *,
  num_chains: int = STANDALONE.num_chains,
  max_turns: int = STANDALONE.max_turns,
  sampler: Any = None,
  sampling_params: Any = None,
  temperature: float = 1.0,
  max_tokens_per_turn: int = STANDALONE.max_tokens_per_turn,
  max_total_tokens: int = STANDALONE.max_total_tokens,
  seed: int | None = 0,
  env_provider: Any = None,
  color: bool = False,
  chain_timeout_s: float = STANDALONE.chain_timeout_s,
) -> RolloutResult:
  """Rolls `agent` out on the rows (see `Agent.rollout`)."""
  from agentfly_jax.agents.rollout import run_rollout
  from agentfly_jax.sampling.protocol import SamplingParams

  sampler = sampler if sampler is not None else getattr(agent, "sampler", None)
  if sampler is None:
    raise ValueError(
      "agent.rollout: no sampler: pass sampler=... (a JaxSampler, VllmSampler, ...) or "
      "build the agent with Agent.from_pretrained(folder, ...)"
    )
  trajs = run_rollout(
    agent,
    as_rows(rows_or_messages),
    sampler=sampler,
    num_chains=num_chains,
    max_turns=max_turns,
    sampling_params=sampling_params or SamplingParams(temperature=temperature),
    max_tokens_per_turn=max_tokens_per_turn,
    max_total_tokens=max_total_tokens,
    seed=seed,
    env_provider=env_provider,
    chain_timeout_s=chain_timeout_s,
  )
  return RolloutResult(
    trajectories=trajs,
    rewards=[t.reward for t in trajs],
    transcripts=[format_trajectory(t, agent.tokenizer, color=color) for t in trajs],
  )


def load_sampler(
  folder: str,
  *,
  vllm: bool = False,
  max_len: int = 2048,
  max_batch_size: int = STANDALONE.max_batch_size,
  seed: int = 0,
  **sampler_kwargs,
):
  """A sampler over the HF model folder: the JAX KV-cache sampler, or vLLM (`vllm=True`)."""
  if vllm:
    from agentfly_jax.sampling import VllmSampler

    return VllmSampler(folder, max_model_len=max_len, max_batch_size=max_batch_size, seed=seed, **sampler_kwargs)
  from agentfly_jax.models import from_pretrained
  from agentfly_jax.sampling import JaxSampler

  return JaxSampler(
    from_pretrained(folder, seed=seed), max_batch_size=max_batch_size, max_len=max_len, seed=seed, **sampler_kwargs
  )


def agent_from_pretrained(
  cls,
  folder: str,
  *,
  tools: Sequence = (),
  reward: Any = None,
  vllm: bool = False,
  sampler_kwargs: dict | None = None,
  **agent_kwargs,
):
  """`cls(tokenizer=folder, tools, reward)` with a sampler over the folder's model attached;
  tools and the reward may be given by name (built-ins, or 'module:function')."""
  from agentfly_jax.rewards.registry import get_reward
  from agentfly_jax.tools.registry import get_tool

  tools = [get_tool(t) if isinstance(t, str) else t for t in tools]
  reward = get_reward(reward) if isinstance(reward, str) else reward
  agent = cls(folder, tools=tools, reward_fn=reward, **agent_kwargs)
  agent.sampler = load_sampler(folder, vllm=vllm, **(sampler_kwargs or {}))
  return agent

"""`Agent`: the tokenizer + chat template, tools, reward and tool-call format of one agent.

An agent does not generate; the rollout (`agentfly_jax.agents.rollout`) drives it:
initial messages -> prompt text; model text -> `ParsedTurn`; tool outputs -> observation
messages; and it builds the observation *text* appended after a model turn as the difference
between two renderings of the conversation (with and without the new messages), so that only
new, non-model text is ever tokenized.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from agentfly_jax.agents.parsers import ParsedTurn, ToolCall
from agentfly_jax.agents.standalone_limits import STANDALONE
from agentfly_jax.agents.tokenizer import AgentTokenizer, load_tokenizer
from agentfly_jax.rewards.reward import Reward, reward as make_reward
from agentfly_jax.tools.tool import Tool, ToolOutput, tool as make_tool
from agentfly_jax.vision.content import normalize_content

_SENTINEL = "\u2063AGENTFLY_SENTINEL\u2063"


def observation_content(out: ToolOutput) -> str | list[dict]:
  """What the model reads of a tool output: its content parts when it has images, else its text."""
  return out.observation if out.content is None else out.content


def _joined(content: str | list[dict], observation: str | list[dict]) -> str | list[dict]:
  """`content` then a blank line then `observation`; a content list when either is one."""
  if isinstance(content, str) and isinstance(observation, str):
    return f"{content}\n\n{observation}"
  head = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
  tail = [{"type": "text", "text": observation}] if isinstance(observation, str) else list(observation)
  return head + [{"type": "text", "text": "\n\n"}] + tail


class TemplatePrefixError(ValueError):
  """The chat template re-renders earlier turns differently once messages are appended, so new
  tokens cannot be appended to the old ones (token-in/token-out would break)."""


class Agent:
  """Base class. Subclasses set `parse` and how tools and observations are presented.

  Args:
    tokenizer: an HF tokenizer folder path, an HF tokenizer object, or an `AgentTokenizer`.
    tools: `Tool`s (plain functions are wrapped with `@tool`).
    reward_fn: a `Reward` (plain functions are wrapped with `@reward`), or None (reward 0).
    system_prompt: system message text (agents may add tool instructions to it).
    template_kwargs: extra chat-template variables (e.g. {"date_string": "01 Jan 2025"}).
    env_provider: EnvProvider for stateful tools / env-bound rewards when the rollout is given
      none (default: `agentfly_jax.envs.default_provider()`).
    task_env: name of an environment whose `reset(row)` text (e.g. a text world's opening
      description) is appended to the first user message; None = no such environment.
  """

  observation_role = "tool"
  sampler = None  # set by `from_pretrained`; `run` uses it when given no sampler
  # A vision model's image processor (agentfly_jax.vision.processor.VisionProcessor); None: the model reads text
  # only and an image part in a chain is an error naming it. Set on the agent (`agent.vision = VisionProcessor()`)
  # with a tokenizer whose chat template renders image parts (e.g. QWEN25_VL_CHAT_TEMPLATE).
  vision = None

  def __init__(
    self,
    tokenizer: Any,
    tools: Sequence[Tool | Callable] = (),
    reward_fn: Reward | Callable | None = None,
    system_prompt: str | None = None,
    template_kwargs: dict | None = None,
    env_provider: Any = None,
    task_env: str | None = None,
  ):
    self.env_provider = env_provider
    self.task_env = task_env
    self.tokenizer: AgentTokenizer = load_tokenizer(tokenizer)
    self.tools: dict[str, Tool] = {}
    for t in tools:
      t = t if isinstance(t, Tool) else make_tool(t)
      if t.name in self.tools:
        raise ValueError(f"{type(self).__name__}: two tools are named {t.name!r}")
      self.tools[t.name] = t
    if reward_fn is not None and not isinstance(reward_fn, Reward):
      reward_fn = make_reward(reward_fn)
    self.reward_fn = reward_fn
    self.system_prompt = system_prompt
    self.template_kwargs = dict(template_kwargs or {})
    self.end_of_turn_text = self._find_end_of_turn_text()
    self.stop_token_ids = self._find_stop_token_ids()
    self.check_prefix_stable()

  # -- prototyping without the trainer (agents/standalone.py) ---------------------------------
  @classmethod
  def from_pretrained(
    cls,
    folder: str,
    *,
    tools: Sequence = (),
    reward: Any = None,
    vllm: bool = False,
    sampler_kwargs: dict | None = None,
    **agent_kwargs,
  ):
    """The agent over an HF model folder (its tokenizer + chat template), with a sampler of the
    folder's model attached: the JAX sampler, or vLLM with `vllm=True`. Tools and the reward may
    be objects or names (built-ins, or 'module:function')."""
    from agentfly_jax.agents.standalone import agent_from_pretrained

    return agent_from_pretrained(
      cls, folder, tools=tools, reward=reward, vllm=vllm, sampler_kwargs=sampler_kwargs, **agent_kwargs
    )

  def rollout(
    self,
    rows_or_messages: Any,
    *,
    num_chains: int = STANDALONE.num_chains,
    max_turns: int = STANDALONE.max_turns,
    sampler: Any = None,
    **kwargs,
  ):
    """Rolls the agent out: `rows_or_messages` is a question, a row, a list of rows or a chat
    conversation; returns a `RolloutResult` (trajectories, rewards, and a transcript per chain with
    the model-written, trained-on tokens in ⟦ ⟧). Other keywords: temperature, sampling_params,
    max_tokens_per_turn, max_total_tokens, seed, env_provider, color (ANSI instead of ⟦ ⟧), chain_timeout_s."""
    from agentfly_jax.agents.standalone import standalone_rollout

    return standalone_rollout(
      self, rows_or_messages, num_chains=num_chains, max_turns=max_turns, sampler=sampler, **kwargs
    )

  # -- template --------------------------------------------------------------------------------
  def render(self, messages: list[dict], template_tools: list[dict] | None, add_generation_prompt: bool) -> str:
    return self.tokenizer.render(
      messages, tools=template_tools, add_generation_prompt=add_generation_prompt, **self.template_kwargs
    )

  def _find_end_of_turn_text(self) -> str:
    """What the template writes after an assistant message's content (e.g. "<|im_end|>\\n")."""
    text = self.render([{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL}], None, False)
    at = text.rfind(_SENTINEL)
    if at < 0:
      raise TemplatePrefixError("the chat template does not write the assistant's content verbatim")
    return text[at + len(_SENTINEL) :]

  def _find_stop_token_ids(self) -> tuple[int, ...]:
    ids = []
    tail_ids = self.tokenizer.encode(self.end_of_turn_text) if self.end_of_turn_text else []
    if tail_ids:
      ids.append(tail_ids[0])
    eos = self.tokenizer.eos_token_id
    if eos is not None:
      ids.append(eos)
    return tuple(dict.fromkeys(ids))

  def observation_text(
    self, before: list[dict], new_messages: list[dict], template_tools: list[dict] | None, model_end_text: str
  ) -> str:
    """Non-model text to append after a model turn.

    Args:
      before: the conversation up to and including the new assistant message.
      new_messages: observation messages to append (may be empty).
      template_tools: tool schemas given to the template.
      model_end_text: the decoded stop token the model emitted ('' if it was cut off).

    Returns:
      The rest of the assistant turn's end marker the model did not write (e.g. "\\n" after
      "<|im_end|>"), then the rendering of `new_messages` and the generation prompt.

    Raises:
      TemplatePrefixError if the template is not prefix-stable for this conversation.
    """
    base = self.render(before, template_tools, add_generation_prompt=False)
    full = self.render(before + new_messages, template_tools, add_generation_prompt=True)
    if not full.startswith(base):
      at = next((i for i, (a, b) in enumerate(zip(base, full)) if a != b), min(len(base), len(full)))
      raise TemplatePrefixError(
        f"{type(self).__name__}: the chat template is not prefix-stable: appending "
        f"{len(new_messages)} message(s) changes the earlier text at character {at} "
        f"({base[at : at + 40]!r} -> {full[at : at + 40]!r}); the rollout cannot append tokens"
      )
    tail = self.end_of_turn_text
    if model_end_text and tail.startswith(model_end_text):
      tail = tail[len(model_end_text) :]
    return tail + full[len(base) :]

  def check_prefix_stable(self) -> None:
    """Checks on a small conversation that appending tool results / user turns only extends the
    rendered text (raises `TemplatePrefixError` otherwise)."""
    tools = list(self.tools.values())
    first = {"question": "What is 1 + 1?"}
    messages = self.initial_messages(first, tools)
    template_tools = self.template_tools(tools)
    name = tools[0].name if tools else "tool"
    call = ToolCall(name=name, arguments={})
    parsed = ParsedTurn(content="thinking", tool_calls=[call])
    assistant = self.assistant_message("thinking", parsed)
    observations = self.observation_messages([(call, ToolOutput("2"))], [])
    self.observation_text(messages + [assistant], observations, template_tools, "")

  # -- per-agent behaviour ---------------------------------------------------------------------
  def tools_for_row(self, row: dict) -> list[Tool]:
    """The agent's tools, restricted to `row["tools"]` (a list of names) when the row has it."""
    allowed = row.get("tools") if isinstance(row, dict) else None
    if allowed is None:
      return list(self.tools.values())
    if isinstance(allowed, str) or not all(isinstance(n, str) for n in allowed):
      raise ValueError(f"row field 'tools' must be a list of tool names, got {allowed!r}")
    unknown = [n for n in allowed if n not in self.tools]
    if unknown:
      raise ValueError(f"row field 'tools' names unknown tool(s) {unknown}; the agent has {sorted(self.tools)}")
    return [self.tools[n] for n in allowed]

  def template_tools(self, tools: list[Tool]) -> list[dict] | None:
    """Tool schemas passed to the chat template (None: tools are described in the prompt)."""
    return [t.schema for t in tools] if tools else None

  def system_text(self, tools: list[Tool]) -> str | None:
    return self.system_prompt

  def initial_messages(
    self, row: dict, tools: list[Tool], first_observation: str | list[dict] | None = None
  ) -> list[dict]:
    """System message (if any) + the row's question (+ the task env's first observation: text, or content
    parts with images, which make the user message a content list)."""
    if not isinstance(row, dict) or not isinstance(row.get("question"), str):
      raise ValueError(f"{type(self).__name__}: a row needs a string field 'question', got {row!r:.120}")
    if row.get("messages"):  # a conversation given to agent.rollout: start from it
      messages = [dict(m) for m in row["messages"]]
      for i, m in enumerate(messages):
        if not isinstance(m.get("content"), str) and m.get("content") is not None:
          m["content"] = normalize_content(m["content"], f"row.messages[{i}].content")
      if first_observation:
        messages[-1]["content"] = _joined(messages[-1]["content"], first_observation)
      return messages
    messages = []
    system = self.system_text(tools)
    if system is not None:
      messages.append({"role": "system", "content": system})
    question = row["question"]
    if first_observation:
      question = _joined(question, first_observation)
    messages.append({"role": "user", "content": question})
    return messages

  def parse(self, text: str) -> ParsedTurn:
    raise NotImplementedError

  def assistant_message(self, text: str, parsed: ParsedTurn) -> dict:
    return {"role": "assistant", "content": text}

  def resolve(self, call: ToolCall, tools: dict[str, Tool]) -> tuple[Tool | None, dict, str | None]:
    """(tool, arguments, error) for a parsed call against the row's tools."""
    found = tools.get(call.name)
    if found is None:
      return None, {}, (f"unknown tool '{call.name}'; available tools: {', '.join(sorted(tools)) or 'none'}")
    arguments = call.arguments
    if call.raw_arguments is not None:  # free text: fits a tool with exactly one parameter
      props = list(found.parameters["properties"])
      if len(props) != 1:
        return (
          found,
          {},
          (
            f"the input of tool '{call.name}' must be a JSON object with "
            f"arguments {props}, got {call.raw_arguments[:80]!r}"
          ),
        )
      arguments = {props[0]: call.raw_arguments}
    return found, arguments, None

  def observation_messages(self, results: list[tuple[ToolCall, ToolOutput]], errors: list[str]) -> list[dict]:
    """Chat messages showing tool outputs (and parse errors) to the model."""
    messages = [{"role": "tool", "name": call.name, "content": observation_content(out)} for call, out in results]
    messages += [{"role": "tool", "name": "error", "content": f"Error: {e}"} for e in errors]
    return messages

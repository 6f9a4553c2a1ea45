"""What the OpenAI-compatible endpoint keeps per chain: token segments built from the sampler's ids.

A chain's requests are matched to its *segments*. A segment is one growing token sequence, kept
the way the built-in rollout keeps a chain (`rollout._ChainBuilder`): prompt ids (action mask
False), then per turn the sampler's ids verbatim (mask True, their log-probs), then the ids of
the new, non-model text the next request adds (mask False). A request continues a segment when
its messages are that segment's last request + the assistant message the endpoint returned
(compared by role, text and tool calls) + new messages, with the same tools: only the new
messages' text is tokenized (`Agent.observation_text`, the rollout's own rule), so the prompt the
sampler sees extends the previous prompt + completion token-exactly. Anything else (an edited or
truncated history, other tools) starts a new segment from a fresh rendering. A request on a
segment whose tip another request of the chain has already extended (parallel requests, or the
choices 2..n of one request) forks: a new segment that copies the shared prefix.

Every segment becomes one `Trajectory` (same group_id / chain_id / reward; `segment` numbers
them), so the trainer learns from exactly the tokens the model wrote, in the contexts it saw.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import numpy as np

from agentfly_jax.agents.chain_images import encode_with_images
from agentfly_jax.agents.trajectory import Trajectory
from agentfly_jax.sampling.protocol import PromptImages
from agentfly_jax.vision.processor import check_text_only


def message_content(content: Any, where: str) -> str | list[dict]:
  """An OpenAI message `content` in template form: a string (None, a string, or text parts joined), or, with
  image parts ({"type": "image_url", "image_url": {"url": "data:image/...;base64,..."}}), the list of text and
  image_url parts (decoded later, by the agent's processor). ValueError naming `where` for other parts (audio,
  files) and malformed ones."""
  if content is None:
    return ""
  if isinstance(content, str):
    return content
  if not isinstance(content, list):
    raise ValueError(
      f"{where} must be a string, null or a list of text / image_url parts, got {type(content).__name__}"
    )
  parts = []
  for j, part in enumerate(content):
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text" and isinstance(part.get("text"), str):
      parts.append({"type": "text", "text": part["text"]})
    elif kind == "image_url":
      url = part.get("image_url")
      url = url.get("url") if isinstance(url, dict) else url
      if not isinstance(url, str) or not url:
        raise ValueError(f"{where}[{j}].image_url.url must be a data URL ('data:image/png;base64,...'), got {url!r}")
      parts.append({"type": "image_url", "image_url": {"url": url}})
    else:
      raise ValueError(
        f"{where}[{j}]: only text and image_url parts are supported "
        f"({{'type': 'text', 'text': ...}}, {{'type': 'image_url', 'image_url': {{'url': ...}}}}), got {str(part)[:80]!r}"
      )
  if all(p["type"] == "text" for p in parts):
    return "".join(p["text"] for p in parts)
  return parts


def message_text(content: Any, where: str) -> str:
  """`content` as text: its text parts, each image as "<image>" (tool results, transcripts)."""
  content = message_content(content, where)
  if isinstance(content, str):
    return content
  return "".join(p["text"] if p["type"] == "text" else "<image>" for p in content)


def template_message(message: Any, i: int) -> dict:
  """One request message in the form the chat template renders (content as text, tool-call
  arguments as objects, as the built-in agents write them). ValueError names `messages[i]`."""
  where = f"messages[{i}]"
  if not isinstance(message, dict):
    raise ValueError(f"{where} must be an object, got {type(message).__name__}")
  role = message.get("role")
  if not isinstance(role, str) or not role:
    raise ValueError(
      f"{where}.role must be a string (system, user, assistant, tool, or another "
      f"role the chat template knows), got {role!r}"
    )
  out = {"role": role, "content": message_content(message.get("content"), f"{where}.content")}
  for field in ("name", "tool_call_id"):
    if message.get(field) is not None and not isinstance(message[field], str):
      raise ValueError(f"{where}.{field} must be a string, got {type(message[field]).__name__}")
  if role == "tool":
    if message.get("name"):
      out["name"] = message["name"]
  calls = message.get("tool_calls")
  if role == "assistant" and calls:
    if not isinstance(calls, list):
      raise ValueError(f"{where}.tool_calls must be a list, got {type(calls).__name__}")
    out["tool_calls"] = [_template_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
  return out


def _template_call(call: Any, where: str) -> dict:
  fn = call.get("function") if isinstance(call, dict) else None
  if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
    raise ValueError(
      f"{where} must be {{'type': 'function', 'function': {{'name': ..., 'arguments': ...}}}}, got {str(call)[:120]!r}"
    )
  if call.get("id") is not None and not isinstance(call["id"], str):
    raise ValueError(f"{where}.id must be a string, got {type(call['id']).__name__}")
  arguments = fn.get("arguments", {})
  if not isinstance(arguments, (str, dict)):
    raise ValueError(f"{where}.function.arguments must be a JSON string or an object, got {type(arguments).__name__}")
  if isinstance(arguments, str):
    try:
      arguments = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
      pass  # kept as the string the model wrote
  return {"type": "function", "function": {"name": fn["name"], "arguments": arguments}}


def _content_key(content: Any) -> Any:
  if isinstance(content, list):  # an image by the sha256 of its URL: no megabytes of base64 in every key
    return [
      p["text"] if p["type"] == "text" else "image:" + hashlib.sha256(p["image_url"]["url"].encode()).hexdigest()
      for p in content
    ]
  return content or ""


def message_key(message: dict) -> str:
  """What decides a message's rendering (role, text and images, name, tool calls): equal keys render equal."""
  calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or ()]
  return json.dumps(
    [message["role"], _content_key(message.get("content")), message.get("name"), calls],
    sort_keys=True,
    ensure_ascii=False,
    default=str,
  )


@dataclasses.dataclass
class Segment:
  """One token sequence of a chain (see the module docstring)."""

  ids: list[int]
  mask: list[bool]
  logps: list[float]
  prompt_length: int
  tools_key: str
  version: int = 0  # bumped by every completion appended
  num_turns: int = 0
  request_keys: list[str] = dataclasses.field(default_factory=list)  # the last request's messages
  messages: list[dict] = dataclasses.field(default_factory=list)  # ... as rendered, + the reply
  reply_key: str | None = None  # the assistant message returned (as the agent echoes it)
  model_end_text: str = ""
  images: list = dataclasses.field(default_factory=list)  # the images among ids, in order (RGB PIL)
  grids: list = dataclasses.field(default_factory=list)  # their image_grid_thw, int32[n, 3] per added piece
  pixels: list = dataclasses.field(default_factory=list)  # their patches, float32[p, patch_dim] per added piece
  # a mixture-of-experts sampler's routes of the first n ids, int[n, Lm, k] (None: not recorded): a token keeps
  # those of the request that first fed it to the model (Trajectory.routed_experts)
  routes: np.ndarray | None = None

  def copy_prefix(self) -> "Segment":
    return dataclasses.replace(
      self,
      ids=list(self.ids),
      mask=list(self.mask),
      logps=list(self.logps),
      request_keys=list(self.request_keys),
      messages=list(self.messages),
      images=list(self.images),
      grids=list(self.grids),
      pixels=list(self.pixels),
    )

  def add_prompt_piece(self, ids: list[int], images: list, grid: np.ndarray, pixels: np.ndarray | None) -> None:
    """Non-model ids (never trained on) and the images whose tokens are among them."""
    self.ids += ids
    self.mask += [False] * len(ids)
    self.logps += [0.0] * len(ids)
    if images:
      self.images += list(images)
      self.grids.append(np.asarray(grid, np.int32).reshape(-1, 3))
      self.pixels.append(np.asarray(pixels, np.float32))

  def prompt_images(self) -> PromptImages | None:
    """The segment's images for the sampler; None: text only."""
    if not self.images:
      return None
    return PromptImages(np.concatenate(self.pixels), np.concatenate(self.grids))

  def image_grid_thw(self) -> np.ndarray:
    return np.concatenate(self.grids) if self.grids else np.zeros((0, 3), np.int32)


@dataclasses.dataclass
class RequestPrompt:
  """A request's prompt: the ids sent to the sampler, and where they came from."""

  prompt_ids: list[int]
  segment: Segment | None  # the segment continued (None: a new one)
  base: Segment  # state of the segment the completion extends (a copy)
  base_version: int
  messages: list[dict]  # the request's messages, template form
  request_keys: list[str]
  template_tools: list[dict] | None


class ChainRecord:
  """One chain's segments, tool calls and turn count (the endpoint fills it, request by request)."""

  def __init__(self, key: str, group_id: int = 0, chain_id: int = 0, row: dict | None = None):
    self.key, self.group_id, self.chain_id, self.row = key, group_id, chain_id, row or {}
    self.segments: list[Segment] = []
    self.num_requests = 0
    self.tool_calls: dict[str, dict] = {}  # call id -> {"turn", "name", "arguments", ...}
    self.last_text: str | None = None  # the last completion's text (a fallback prediction)
    self.limit_hit: str | None = None  # "max_turns" / "max_total_tokens" once refused for it
    self.clamped_requests = 0  # requests whose max_tokens was clamped to the run's per-turn limit
    self.client_host: str | None = None  # set: the key is taken only from this address (a harness's sandbox)

  def request_prompt(
    self, agent, messages: list[dict], tools_key: str, template_tools: list[dict] | None
  ) -> RequestPrompt:
    """The prompt ids of a request (template-form `messages`): continues the segment whose
    last request + reply these messages extend, else renders a new segment."""
    if getattr(agent, "vision", None) is None:  # an image part for a text-only model: named before rendering
      check_text_only(messages, f"{type(agent).__name__}'s model")
    keys = [message_key(m) for m in messages]
    for seg in reversed(self.segments):
      n = len(seg.request_keys)
      if (
        seg.reply_key is None
        or seg.tools_key != tools_key
        or len(keys) < n + 1
        or keys[:n] != seg.request_keys
        or keys[n] != seg.reply_key
      ):
        continue
      suffix = agent.observation_text(seg.messages, messages[n + 1 :], template_tools, seg.model_end_text)
      base = seg.copy_prefix()
      base.add_prompt_piece(*encode_with_images(agent, suffix, messages[n + 1 :], None, n + 1))
      return RequestPrompt(list(base.ids), seg, base, seg.version, messages, keys, template_tools)
    text = agent.render(messages, template_tools, add_generation_prompt=True)
    base = Segment(ids=[], mask=[], logps=[], prompt_length=0, tools_key=tools_key)
    base.add_prompt_piece(*encode_with_images(agent, text, messages))
    base.prompt_length = len(base.ids)
    return RequestPrompt(list(base.ids), None, base, 0, messages, keys, template_tools)

  def record(
    self,
    prompt: RequestPrompt,
    generated: list[int],
    logprobs: list[float],
    assistant_message: dict,
    reply_key: str,
    model_end_text: str,
    routes=None,
  ) -> Segment:
    """Appends one completion to the segment `prompt` continues (or to a new / forked one); `routes`: the
    sampler's SampleResult.routed_experts (the prompt's ids and the new ones but the last; None: not recorded)."""
    if not generated or len(logprobs) != len(generated):
      raise ValueError(f"sampler returned {len(generated)} token ids and {len(logprobs)} log-probs (need equal, >= 1)")
    fed = len(prompt.prompt_ids) + len(generated) - 1
    if routes is not None and len(routes) != fed:
      raise ValueError(
        f"sampler returned routes of {len(routes)} tokens for a prompt of {len(prompt.prompt_ids)} and "
        f"{len(generated)} new tokens (SampleResult.routed_experts: prompt + new - 1)"
      )
    seg = prompt.segment
    if seg is not None and seg.version == prompt.base_version:
      base = prompt.base
      seg.ids, seg.mask, seg.logps = base.ids, base.mask, base.logps
      seg.images, seg.grids, seg.pixels, seg.routes = base.images, base.grids, base.pixels, base.routes
      prompt.base = prompt.base.copy_prefix()  # later choices of this request fork from here
    else:
      seg = prompt.base.copy_prefix()
      seg.version = -1
      self.segments.append(seg)
    if routes is not None:
      routes = np.asarray(routes)
      seg.routes = routes if seg.routes is None else np.concatenate([seg.routes, routes[len(seg.routes) :]])
    seg.ids += [int(t) for t in generated]
    seg.mask += [True] * len(generated)
    seg.logps += [float(x) for x in logprobs]
    seg.version += 1
    seg.num_turns += 1
    seg.request_keys = list(prompt.request_keys)
    seg.messages = [*prompt.messages, assistant_message]
    seg.reply_key = reply_key
    seg.model_end_text = model_end_text
    return seg

  def note_tool_calls(self, turn: int, calls: list[tuple[str, str, dict]]) -> None:
    """The tool calls one completion made, (call id, name, arguments), to pair with their
    results when the agent sends them."""
    for call_id, name, arguments in calls:
      self.tool_calls[call_id] = {"turn": turn, "name": name, "arguments": arguments, "observation": None, "ok": True}

  def note_tool_results(self, raw_messages: list) -> None:
    """Pairs `tool` messages (by tool_call_id) with the calls they answer; ok = not 'Error...'."""
    for m in raw_messages:
      if isinstance(m, dict) and m.get("role") == "tool" and isinstance(m.get("tool_call_id"), str):
        record = self.tool_calls.get(m["tool_call_id"])
        if record is not None and record["observation"] is None:
          try:
            text = message_text(m.get("content"), "content")
          except ValueError:
            text = str(m.get("content"))
          record["observation"] = text
          record["ok"] = not text.lstrip().startswith("Error")

  def trajectories(
    self,
    *,
    reward: float,
    metrics: dict,
    finish_reason: str,
    prediction: str | None,
    error: str | None = None,
    error_frame: str | None = None,
  ) -> list[Trajectory]:
    """One Trajectory per segment (the chain's reward on each); [] if the chain made no request."""
    calls = sorted(self.tool_calls.values(), key=lambda c: c["turn"])
    return [
      Trajectory(
        token_ids=s.ids,
        action_mask=s.mask,
        sampler_logprobs=s.logps,
        reward=reward,
        reward_metrics=dict(metrics),
        group_id=self.group_id,
        chain_id=self.chain_id,
        messages=list(s.messages),
        num_turns=s.num_turns,
        tool_calls=calls if i == len(self.segments) - 1 else [],
        finish_reason=finish_reason,
        prompt_length=s.prompt_length,
        row=self.row,
        prediction=prediction,
        error=error,
        error_frame=error_frame,
        segment=i,
        clamped_requests=self.clamped_requests if i == len(self.segments) - 1 else 0,
        images=list(s.images),
        image_grid_thw=s.image_grid_thw(),
        routed_experts=s.routes,
      )
      for i, s in enumerate(self.segments)
    ]

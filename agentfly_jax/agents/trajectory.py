"""`Trajectory`: one chain's tokens, action mask, sampler log-probs and reward; `pad_batch`.

Token-in/token-out: `token_ids` are the prompt ids, then per turn the sampler's ids verbatim
(`action_mask` True, `sampler_logprobs` = the sampler's log-probs) and the observation/template
ids the rollout appended (`action_mask` False, log-probs 0).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np


@dataclasses.dataclass
class Trajectory:
  """One chain of a rollout.

  Attributes:
    token_ids: int32[T] prompt + all turns.
    action_mask: bool[T], True exactly on sampler-generated tokens.
    sampler_logprobs: float32[T], the sampler's log-probs where `action_mask`, else 0.
    reward: the chain's scalar reward (0 if the chain failed).
    reward_metrics: extra numbers the reward returned (dict keys other than "reward").
    group_id: index of the dataset row in the rollout batch (chains of one row share it).
    chain_id: index of the chain within its group, 0..num_chains-1.
    messages: the conversation as chat messages (assistant text decoded from the ids).
    num_turns: number of model turns generated.
    tool_calls: one dict per executed tool call: turn, name, arguments, observation, ok.
    finish_reason: why the chain stopped: "finish_tool", "no_tool_call", "max_turns",
      "max_tokens_per_turn", "max_total_tokens" or "error".
    prompt_length: number of tokens of the first prompt (before the first model turn).
    row: the dataset row this chain answered.
    prediction: the final answer given to the reward: the finish tool's output, the
      `Final Answer:` text, else the last assistant message's text ("" if there was no turn;
      None only if the chain failed before its end).
    error: the exception text when `finish_reason == "error"`, else None.
    error_frame: where it was raised: the last frame of its traceback, "file.py:12 in function".
    env_names: the environments (by name) the chain acquired, in order.
    policy_versions: the trainer's policy version that wrote each turn (asynchronous
      training; empty when not recorded).
    segment: 0, or for a chain served through the OpenAI-compatible endpoint whose agent edited
      its history, which of the chain's token sequences this is (agents/endpoint_records.py;
      all segments of a chain share its group_id, chain_id and reward).
    turn_rewards: one reward per model turn, aligned to the assistant turns (the sum of the rewards
      of the environment `StepResult`s the turn's tool calls returned; 0 for a turn without one);
      empty when not recorded. The chain's outcome is `reward`, not part of these
      (rl/core/turn_advantages.py adds it to the last turn).
    clamped_requests: requests through the endpoint whose `max_tokens` was above the run's
      per-turn limit and was clamped to it (counted on a chain's last segment).
    images: the chain's images (RGB PIL images), in the order their image tokens appear in `token_ids`
      (never under `action_mask`); `VisionProcessor.process(images)` rebuilds their pixel values.
    image_grid_thw: int32[N, 3], each image's (t, h, w) patch grid (N = len(images); [0, 3] without images).
    routed_experts: a mixture-of-experts policy on a sampler that records routes: int[n, Lm, k], n < T, the
      experts each of the Lm sparse layers sent each of the first n tokens to when the sampler computed it
      (the tokens after n were never fed to it: at least the last); None: not recorded. Router replay
      (`model.router_replay=rollout`) trains on them; left out of `to_json_dict`.
  """

  token_ids: np.ndarray
  action_mask: np.ndarray
  sampler_logprobs: np.ndarray
  reward: float = 0.0
  reward_metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
  group_id: int = 0
  chain_id: int = 0
  messages: list[dict] = dataclasses.field(default_factory=list)
  num_turns: int = 0
  tool_calls: list[dict] = dataclasses.field(default_factory=list)
  finish_reason: str = ""
  prompt_length: int = 0
  row: dict = dataclasses.field(default_factory=dict)
  prediction: str | None = None
  error: str | None = None
  error_frame: str | None = None
  env_names: list[str] = dataclasses.field(default_factory=list)
  policy_versions: list[int] = dataclasses.field(default_factory=list)
  segment: int = 0
  turn_rewards: list[float] = dataclasses.field(default_factory=list)
  clamped_requests: int = 0
  images: list = dataclasses.field(default_factory=list)
  image_grid_thw: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 3), np.int32))
  routed_experts: np.ndarray | None = None

  def __post_init__(self):
    self.image_grid_thw = np.asarray(self.image_grid_thw, dtype=np.int32).reshape(-1, 3)
    if any(isinstance(im, str) for im in self.images):  # data URLs from `to_json_dict`
      from agentfly_jax.vision.decode import decode_image

      self.images = [decode_image(im, f"Trajectory.images[{i}]") for i, im in enumerate(self.images)]
    if len(self.images) != self.image_grid_thw.shape[0]:
      raise ValueError(
        f"Trajectory(group {self.group_id}, chain {self.chain_id}): {len(self.images)} images but "
        f"{self.image_grid_thw.shape[0]} rows of image_grid_thw"
      )
    self.token_ids = np.asarray(self.token_ids, dtype=np.int32).reshape(-1)
    self.action_mask = np.asarray(self.action_mask, dtype=bool).reshape(-1)
    self.sampler_logprobs = np.asarray(self.sampler_logprobs, dtype=np.float32).reshape(-1)
    n = self.token_ids.shape[0]
    if self.action_mask.shape[0] != n or self.sampler_logprobs.shape[0] != n:
      raise ValueError(
        f"Trajectory(group {self.group_id}, chain {self.chain_id}): token_ids, action_mask and "
        f"sampler_logprobs must have one length; got {n}, {self.action_mask.shape[0]}, "
        f"{self.sampler_logprobs.shape[0]}"
      )
    if self.routed_experts is not None:
      self.routed_experts = np.asarray(self.routed_experts)
      if self.routed_experts.ndim != 3 or len(self.routed_experts) >= max(n, 1):
        raise ValueError(
          f"Trajectory(group {self.group_id}, chain {self.chain_id}): routed_experts must be [n < {n}, Lm, k] "
          f"(the routes of the tokens the sampler fed the model), got shape {self.routed_experts.shape}"
        )

  def __len__(self) -> int:
    return int(self.token_ids.shape[0])

  def to_json_dict(self) -> dict:
    """Plain-Python form (lists, not arrays) for JSON logs; `Trajectory(**d)` rebuilds it (without
    `routed_experts`: Lm x k ids per token, for training, not for logs)."""
    out = dataclasses.asdict(
      dataclasses.replace(self, images=[], image_grid_thw=np.zeros((0, 3), np.int32), routed_experts=None)
    )
    if self.images:
      from agentfly_jax.vision.decode import image_data_url

      out["images"] = [image_data_url(im) for im in self.images]
    out["image_grid_thw"] = self.image_grid_thw.tolist()
    out["token_ids"] = self.token_ids.tolist()
    out["action_mask"] = self.action_mask.tolist()
    out["sampler_logprobs"] = self.sampler_logprobs.tolist()
    return out

  @property
  def generated_token_ids(self) -> np.ndarray:
    """int32[N]: the sampler's ids, in order (the masked-in tokens)."""
    return self.token_ids[self.action_mask]


def pad_batch(trajectories: Sequence[Trajectory], max_len: int | None = None, pad_id: int = 0) -> dict[str, np.ndarray]:
  """Right-pads trajectories into `[B, T]` arrays for the trainer.

  Args:
    trajectories: B trajectories.
    max_len: T; default the longest trajectory. A longer trajectory is an error (nothing is
      silently cut).
    pad_id: id written into padded positions of `token_ids`.

  Returns:
    {"token_ids": int32[B, T], "action_mask": bool[B, T], "sampler_logprobs": float32[B, T],
     "attention_mask": bool[B, T], "rewards": float32[B], "group_ids": int32[B]}; padded
    positions have attention_mask/action_mask False and log-prob 0.
  """
  if not trajectories:
    raise ValueError("pad_batch: got no trajectories")
  for i, t in enumerate(trajectories):
    if not isinstance(t, Trajectory):
      raise TypeError(f"pad_batch: trajectories[{i}] is a {type(t).__name__}, not a Trajectory")
  lengths = [len(t) for t in trajectories]
  width = max(lengths) if max_len is None else int(max_len)
  for i, n in enumerate(lengths):
    if n > width:
      raise ValueError(
        f"pad_batch: trajectories[{i}] (group {trajectories[i].group_id}, chain "
        f"{trajectories[i].chain_id}) has {n} tokens > max_len={width}"
      )
  b = len(trajectories)
  token_ids = np.full((b, width), pad_id, dtype=np.int32)
  action_mask = np.zeros((b, width), dtype=bool)
  logprobs = np.zeros((b, width), dtype=np.float32)
  attention = np.zeros((b, width), dtype=bool)
  for i, t in enumerate(trajectories):
    n = lengths[i]
    token_ids[i, :n] = t.token_ids
    action_mask[i, :n] = t.action_mask
    logprobs[i, :n] = np.where(t.action_mask, t.sampler_logprobs, 0.0)
    attention[i, :n] = True
  return {
    "token_ids": token_ids,
    "action_mask": action_mask,
    "sampler_logprobs": logprobs,
    "attention_mask": attention,
    "rewards": np.asarray([t.reward for t in trajectories], dtype=np.float32),
    "group_ids": np.asarray([t.group_id for t in trajectories], dtype=np.int32),
  }


def last_frame(e: BaseException) -> str | None:
  """Where `e` was raised: its traceback's last frame as "file.py:12 in function" (None: no traceback)."""
  import os
  import traceback

  frames = traceback.extract_tb(e.__traceback__)
  if not frames:
    return None
  f = frames[-1]
  return f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}"

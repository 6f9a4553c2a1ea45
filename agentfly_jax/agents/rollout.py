"""The multi-chain, multi-turn rollout: rows -> `Trajectory`s, all chains concurrent under trio.

  trajectories = run_rollout(agent, rows, sampler=sampler, num_chains=4, max_turns=4,
                             sampling_params=SamplingParams(temperature=1.0),
                             max_tokens_per_turn=256, max_total_tokens=2048)

Each chain: render the prompt with the chat template -> `sampler.agenerate(ids)` -> keep the
returned ids verbatim (action_mask True, log-probs stored) -> decode them only to parse tool
calls -> run this turn's calls concurrently -> append the observation tokens, built by
tokenizing only the new template text -> repeat. A chain stops with a `finish_reason`:
  "finish_tool"          a finish tool (e.g. `answer`) ran successfully; its output is the prediction
  "env_done"             a tool's environment step said the episode is over (`StepResult.done`)
  "final_answer"         the model wrote `Final Answer:` (ReAct / Code agents)
  "no_tool_call"         the model answered without calling a tool
  "max_turns"            `max_turns` model turns were generated
  "max_tokens_per_turn"  a turn hit `max_tokens_per_turn` without ending
  "max_total_tokens"     the context reached `max_total_tokens`
  "timeout"              the chain ran past `chain_timeout_s` (its turn or tool call cancelled; scored on the
                         prediction so far, counted as a failed chain by rl/chain_failures.py)
  "error"                an exception (logged; reward 0, `Trajectory.error` holds it)
The reward is computed inside the chain as soon as it finishes (overlapping other chains). One
chain failing never stops the others.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import uuid
from typing import Any, Sequence

import numpy as np
import trio

from agentfly_jax.agents.agent_interface import RolloutAgent
from agentfly_jax.agents.busy_clock import ENV_CLOCK, SAMPLER_CLOCK
from agentfly_jax.agents.chain_images import aencode_with_images
from agentfly_jax.agents.group_rewards import group_scorer
from agentfly_jax.agents.rollout_driver import check_chain_args, drive_chains
from agentfly_jax.data.dataset import validate_row
from agentfly_jax.data.row_fields import REWARD_ONLY_FIELDS, agent_view, check_reward_only
from agentfly_jax.agents.standalone_limits import STANDALONE
from agentfly_jax.agents.trajectory import Trajectory, last_frame
from agentfly_jax.sampling.protocol import PromptImages, SamplingParams, agenerate_with_images
from agentfly_jax.tools.tool import ToolOutput, get_env_provider

log = logging.getLogger(__name__)


class _ChainEnvs:
  """The chain's environment instances, acquired lazily (reset with the row), released at end."""

  def __init__(self, provider_getter, chain_key: str, row: dict):
    self._provider_getter = provider_getter
    self._provider = None
    self._key = chain_key
    self._row = row
    self._envs: dict[str, Any] = {}
    self.first_observations: dict[str, str] = {}
    self._lock = trio.Lock()

  async def get(self, env_name: str):
    async with self._lock:
      if env_name not in self._envs:
        if self._provider is None:
          self._provider = self._provider_getter()
        with ENV_CLOCK:
          env = await self._provider.acquire(env_name, self._key)
          self._envs[env_name] = env
          self.first_observations[env_name] = await env.reset(self._row)
      return self._envs[env_name]

  def names(self) -> list[str]:
    """The environments this chain acquired, by name."""
    return list(self._envs)

  async def release_all(self):
    for name in list(self._envs):
      try:
        await self._provider.release(name, self._key)
      except Exception:  # a failing release must not hide the chain's result
        log.warning("releasing env %r of chain %s failed", name, self._key, exc_info=True)
      self._envs.pop(name, None)


@dataclasses.dataclass
class _Config:
  sampler: Any
  max_turns: int
  sampling_params: SamplingParams
  max_tokens_per_turn: int
  max_total_tokens: int
  seed: int | None
  provider_getter: Any
  run_id: str
  thread_limiter: trio.CapacityLimiter
  shared_turns: int = 0
  chain_timeout_s: float = STANDALONE.chain_timeout_s
  reward_only_fields: tuple[str, ...] = REWARD_ONLY_FIELDS  # never in the agent's prompt (data/row_fields.py)


def check_chain_timeout(caller: str, chain_timeout_s) -> None:
  """`chain_timeout_s` must be a finite number of seconds > 0 (every chain has a limit)."""
  ok = isinstance(chain_timeout_s, (int, float)) and not isinstance(chain_timeout_s, bool)
  if not ok or not 0 < chain_timeout_s < math.inf:
    raise ValueError(f"{caller}: chain_timeout_s must be a finite number of seconds > 0, got {chain_timeout_s!r}")


def shared_chain_id(chain_id: int, turn: int, shared_turns: int) -> int:
  """The chain id a turn's request seed is drawn for: chain 0's for the first `shared_turns`
  turns (every chain of a group samples them with the same seeds), the chain's own after."""
  return chain_id if turn >= shared_turns else 0


def _request_seed(seed: int | None, group_id: int, chain_id: int, turn: int, fallback: int | None) -> int | None:
  if seed is None:
    return fallback
  state = np.random.SeedSequence([int(seed) % 2**32, group_id, chain_id, turn]).generate_state(1)
  return int(state[0]) % 2**31


async def _run_tool(cfg: _Config, envs: _ChainEnvs, the_tool, arguments) -> ToolOutput:
  env = None
  if the_tool.stateful:
    try:
      env = await envs.get(the_tool.env_name)
    except Exception as e:
      error = f"environment '{the_tool.env_name}' for tool '{the_tool.name}' is unavailable: {e}"
      return ToolOutput(f"Error: {error}", ok=False, error=error)
  return await the_tool.run(arguments, env=env, thread_limiter=cfg.thread_limiter)


async def _run_turn_tools(cfg, envs, agent: RolloutAgent, parsed, tool_map) -> list[ToolOutput]:
  """Runs one turn's tool calls concurrently; returns their outputs in call order."""
  outputs: list[ToolOutput | None] = [None] * len(parsed.tool_calls)

  async def run_one(i, the_tool, arguments):
    outputs[i] = await _run_tool(cfg, envs, the_tool, arguments)

  with ENV_CLOCK:
    async with trio.open_nursery() as nursery:
      for i, call in enumerate(parsed.tool_calls):
        the_tool, arguments, error = agent.resolve(call, tool_map)
        if error is not None:
          outputs[i] = ToolOutput(f"Error: {error}", ok=False, error=error)
        else:
          nursery.start_soon(run_one, i, the_tool, arguments)
  return outputs


class _ChainBuilder:
  """One chain's growing record. The token-in/token-out rule lives here only: `token_ids`,
  `action_mask` and `sampler_logprobs` grow together, the model's ids verbatim with its
  log-probs (mask True), everything else (prompt, observations) with mask False, log-prob 0."""

  def __init__(self, group_id: int, chain_id: int, row: dict):
    self.group_id, self.chain_id, self.row = group_id, chain_id, row
    self.ids: list[int] = []
    self.mask: list[bool] = []
    self.logps: list[float] = []
    self.messages: list[dict] = []
    self.tool_records: list[dict] = []
    self.env_names: list[str] = []
    self.turn_rewards: list[float] = []  # one per model turn: its tool calls' env step rewards
    self.versions: list = []  # one per model turn: the sampler result's `policy_version` (partial rollouts)
    self.routes = None  # int[n, Lm, k]: the sampler's recorded experts of the first n ids (mixture of experts)
    self.images: list = []  # the images of the prompt and observations, in token order
    self.grids: list[np.ndarray] = []  # their image_grid_thw rows, int32[n, 3] per added piece
    self.pixels: list[np.ndarray] = []  # their processed patches, float32[p, patch_dim] per added piece
    self._prompt_images: PromptImages | None = None  # prompt_images() of the images so far
    self.num_turns = 0
    self.prompt_length = 0
    self.prediction: str | None = None
    self.finish_reason: str | None = None

  def __len__(self) -> int:
    return len(self.ids)

  def add_prompt(self, ids: Sequence[int], images: Sequence = (), grid=None, pixels=None) -> None:
    self.add_observation(ids, images, grid, pixels)
    self.prompt_length = len(self.ids)

  def add_model_tokens(self, ids: Sequence[int], logprobs: Sequence[float], version=None, routes=None) -> None:
    """The sampler's ids of one turn, verbatim, with their log-probs (one each, >= 1 id), the
    policy version that wrote them (None: not known) and the turn's SampleResult.routed_experts (the
    routes of the chain's ids so far and the new ones but the last; None: not recorded). A token keeps
    the routes of the turn that first fed it to the model: the ones its turn's log-probs were computed with."""
    if not ids or len(logprobs) != len(ids):
      raise ValueError(f"sampler returned {len(ids)} token ids and {len(logprobs)} log-probs (need equal, >= 1)")
    if routes is not None:
      routes = np.asarray(routes)
      if len(routes) != len(self.ids) + len(ids) - 1:
        raise ValueError(
          f"sampler returned routes of {len(routes)} tokens for a prompt of {len(self.ids)} and {len(ids)} new "
          f"tokens (SampleResult.routed_experts: prompt + new - 1)"
        )
      self.routes = routes if self.routes is None else np.concatenate([self.routes, routes[len(self.routes) :]])
    self.ids += [int(t) for t in ids]
    self.mask += [True] * len(ids)
    self.logps += [float(x) for x in logprobs]
    self.num_turns += 1
    self.turn_rewards.append(0.0)
    self.versions.append(version)

  def add_observation(self, ids: Sequence[int], images: Sequence = (), grid=None, pixels=None) -> None:
    """Non-model ids (prompt, tool observations, template text, image tokens): never trained on; `images`
    (with their `grid` rows and processed `pixels`) are the images whose tokens are among `ids`."""
    if images:
      self.images += list(images)
      self.grids.append(np.asarray(grid, np.int32).reshape(-1, 3))
      self.pixels.append(np.asarray(pixels, np.float32))
    self.ids += [int(t) for t in ids]
    self.mask += [False] * len(ids)
    self.logps += [0.0] * len(ids)

  def prompt_images(self) -> PromptImages | None:
    """The chain's images so far for the sampler (the pixels its image tokens stand for), None: text only;
    built once per added image piece, not per turn."""
    if not self.images:
      return None
    if self._prompt_images is None or len(self._prompt_images.image_grid_thw) != len(self.images):
      self._prompt_images = PromptImages(np.concatenate(self.pixels), np.concatenate(self.grids))
    return self._prompt_images

  def finish(self, reason: str, prediction: str | None = None) -> None:
    self.finish_reason = reason
    if prediction is not None:
      self.prediction = prediction

  def trajectory(self, reward: float, metrics: dict, error: str | None = None, frame: str | None = None) -> Trajectory:
    return Trajectory(
      token_ids=self.ids,
      action_mask=self.mask,
      sampler_logprobs=self.logps,
      reward=reward,
      reward_metrics=metrics,
      group_id=self.group_id,
      chain_id=self.chain_id,
      messages=self.messages,
      num_turns=self.num_turns,
      tool_calls=self.tool_records,
      finish_reason=self.finish_reason or "max_turns",
      prompt_length=self.prompt_length,
      row=self.row,
      prediction=self.prediction,
      error=error,
      error_frame=frame,
      env_names=list(self.env_names),
      turn_rewards=list(self.turn_rewards),
      policy_versions=[int(v) for v in self.versions] if self.versions and None not in self.versions else [],
      images=list(self.images),
      image_grid_thw=np.concatenate(self.grids) if self.grids else np.zeros((0, 3), np.int32),
      routed_experts=self.routes,
    )


async def _play_turns(agent: RolloutAgent, chain: _ChainBuilder, envs: _ChainEnvs, cfg: _Config) -> None:
  """Model turns and tool calls until the chain finishes (sets `chain.finish_reason`)."""
  tok, row = agent.tokenizer, agent_view(chain.row, cfg.reward_only_fields)  # the env's reset gets the whole row
  stop_ids = tuple(dict.fromkeys([*cfg.sampling_params.stop_token_ids, *agent.stop_token_ids]))
  tools = agent.tools_for_row(row)
  tool_map = {t.name: t for t in tools}
  template_tools = agent.template_tools(tools)
  first_observation = None
  if agent.task_env:
    await envs.get(agent.task_env)
    first_observation = envs.first_observations.get(agent.task_env)
  chain.messages = agent.initial_messages(row, tools, first_observation)
  prompt_text = agent.render(chain.messages, template_tools, add_generation_prompt=True)
  chain.add_prompt(*await aencode_with_images(agent, prompt_text, chain.messages, cfg.max_total_tokens))
  for turn in range(cfg.max_turns):
    room = cfg.max_total_tokens - len(chain)
    if room <= 0:
      return chain.finish("max_total_tokens")
    budget = min(cfg.max_tokens_per_turn, room)
    params = dataclasses.replace(
      cfg.sampling_params,
      max_new_tokens=budget,
      stop_token_ids=stop_ids,
      seed=_request_seed(
        cfg.seed,
        chain.group_id,
        shared_chain_id(chain.chain_id, turn, cfg.shared_turns),
        turn,
        cfg.sampling_params.seed,
      ),
    )
    with SAMPLER_CLOCK:
      result = await agenerate_with_images(cfg.sampler, list(chain.ids), params, chain.prompt_images(), chain.routes)
    generated = [int(t) for t in result.token_ids]
    chain.add_model_tokens(
      generated,
      result.logprobs,
      getattr(result, "policy_version", None),
      getattr(result, "routed_experts", None),
    )
    ended = generated[-1] in stop_ids
    text = tok.decode(generated[:-1] if ended else generated)
    parsed = agent.parse(text)
    chain.messages.append(agent.assistant_message(text, parsed))
    chain.prediction = parsed.content if parsed.final_answer is None else parsed.final_answer
    if not ended and len(generated) >= budget:
      return chain.finish("max_tokens_per_turn" if budget == cfg.max_tokens_per_turn else "max_total_tokens")
    if not parsed.tool_calls and not parsed.errors:
      return chain.finish("final_answer" if parsed.final_answer is not None else "no_tool_call")
    outputs = await _run_turn_tools(cfg, envs, agent, parsed, tool_map)
    chain.turn_rewards[-1] += sum(out.reward for out in outputs if out.ok and out.reward is not None)
    for call, out in zip(parsed.tool_calls, outputs):
      chain.tool_records.append(
        {"turn": turn, "name": call.name, "arguments": call.arguments, "observation": out.observation, "ok": out.ok}
      )
    finished = [out for out in outputs if out.finished and out.ok]
    if finished:
      return chain.finish("finish_tool", finished[0].observation)
    new_messages = agent.observation_messages(list(zip(parsed.tool_calls, outputs)), parsed.errors)
    if any(out.episode_done and out.ok for out in outputs):
      chain.messages += new_messages  # the last observation, for transcripts; no tokens follow it
      return chain.finish("env_done")
    if turn == cfg.max_turns - 1:
      chain.messages += new_messages
      return chain.finish("max_turns")
    model_end_text = tok.decode(generated[-1:]) if ended else ""
    obs_text = agent.observation_text(chain.messages, new_messages, template_tools, model_end_text)
    obs_ids, obs_images, obs_grid, obs_pixels = await aencode_with_images(
      agent, obs_text, new_messages, None, len(chain.messages)
    )
    chain.messages += new_messages
    if len(chain) + len(obs_ids) >= cfg.max_total_tokens:
      return chain.finish("max_total_tokens")
    chain.add_observation(obs_ids, obs_images, obs_grid, obs_pixels)
  chain.finish("max_turns")


async def _run_chain(agent: RolloutAgent, row: dict, group_id: int, chain_id: int, cfg: _Config) -> Trajectory:
  chain = _ChainBuilder(group_id, chain_id, row)
  envs = _ChainEnvs(cfg.provider_getter, f"{cfg.run_id}-g{group_id}-c{chain_id}", row)
  reward, metrics, error, frame = 0.0, {}, None, None
  try:
    with trio.move_on_after(cfg.chain_timeout_s) as deadline:
      await _play_turns(agent, chain, envs, cfg)
    if deadline.cancelled_caught:  # the token record stays whole: a turn's ids, mask, log-probs are appended at once
      log.warning("rollout chain (group %d, chain %d) timed out after %.1f s", group_id, chain_id, cfg.chain_timeout_s)
      chain.finish("timeout")
    if chain.prediction is None:  # no model turn at all (the prompt filled the context)
      chain.prediction = ""
    if agent.reward_fn is not None and not agent.reward_fn.group:  # a group reward: after the group (group_rewards.py)
      env = await envs.get(agent.reward_fn.env_name) if agent.reward_fn.env_name else None
      with ENV_CLOCK:
        metrics = await agent.reward_fn.compute(
          chain.prediction, chain.messages, row, env, thread_limiter=cfg.thread_limiter
        )
      reward = float(metrics.pop("reward"))
  except Exception as e:  # one chain's failure never stops the others
    log.warning("rollout chain (group %d, chain %d) failed", group_id, chain_id, exc_info=True)
    chain.finish("error")
    reward, metrics, error, frame = 0.0, {}, f"{type(e).__name__}: {e}", last_frame(e)
  finally:
    chain.env_names = envs.names()
    with trio.CancelScope(shield=True):
      await envs.release_all()
  return chain.trajectory(reward, metrics, error, frame)


def check_shared_turns(caller: str, shared_turns, seed) -> None:
  """`shared_turns` must be an int >= 0, and > 0 only with a base `seed` (shared seeds)."""
  if not isinstance(shared_turns, int) or isinstance(shared_turns, bool) or shared_turns < 0:
    raise ValueError(f"{caller}: shared_turns must be an int >= 0, got {shared_turns!r}")
  if shared_turns and seed is None:
    raise ValueError(f"{caller}: shared_turns={shared_turns} needs a base seed (the chains share seeds), got seed=None")


def validate_rows(agent: RolloutAgent, rows: Sequence[dict], reward_only: Sequence[str] = REWARD_ONLY_FIELDS) -> None:
  """Checks every row before anything runs: the row's shape by the one row rule (data/dataset.validate_row:
  a non-empty string `question`, `tools` a list of names), then what this agent needs: the row's tools
  among its own (the agent is shown the row without its `reward_only` fields, as in its chains) and the
  dataset fields its reward reads. Raises ValueError naming the row index and field."""
  if isinstance(rows, dict) or not isinstance(rows, Sequence):
    raise TypeError(f"rollout: rows must be a list of dicts, got {type(rows).__name__}")
  for i, row in enumerate(rows):
    validate_row(row, i, "rollout")
    try:
      agent.tools_for_row(agent_view(row, reward_only))
      if agent.reward_fn is not None:
        agent.reward_fn.bind(None, [], row, None)
    except (ValueError, KeyError) as e:
      raise ValueError(f"rollout: row {i}: {e}") from None


def make_config(
  agent: RolloutAgent,
  *,
  sampler,
  max_turns: int,
  sampling_params: SamplingParams,
  max_tokens_per_turn: int,
  max_total_tokens: int,
  env_provider,
  seed: int | None,
  tool_threads: int,
  shared_turns: int = 0,
  chain_timeout_s: float = STANDALONE.chain_timeout_s,
  reward_only_fields: Sequence[str] = REWARD_ONLY_FIELDS,
) -> _Config:
  """The built-in chains' shared settings for one run (`rollout`, `stream_rollout.stream_groups`): the
  env provider made on first use, a run id for the chains' env keys, the tool-thread limiter."""

  def provider_getter():
    return get_env_provider(env_provider, getattr(agent, "env_provider", None))

  return _Config(
    sampler=sampler,
    max_turns=max_turns,
    sampling_params=sampling_params,
    max_tokens_per_turn=max_tokens_per_turn,
    max_total_tokens=max_total_tokens,
    seed=seed,
    provider_getter=functools.lru_cache(maxsize=1)(provider_getter),
    run_id=uuid.uuid4().hex[:10],
    thread_limiter=trio.CapacityLimiter(tool_threads),
    shared_turns=shared_turns,
    chain_timeout_s=chain_timeout_s,
    reward_only_fields=check_reward_only(reward_only_fields, "rollout: reward_only_fields"),
  )


async def rollout(
  agent: RolloutAgent,
  rows: Sequence[dict],
  *,
  sampler,
  num_chains: int = STANDALONE.num_chains,
  max_turns: int = STANDALONE.max_turns,
  sampling_params: SamplingParams | None = None,
  max_tokens_per_turn: int = STANDALONE.max_tokens_per_turn,
  max_total_tokens: int = STANDALONE.max_total_tokens,
  concurrency: int = 256,
  env_provider=None,
  seed: int | None = 0,
  tool_threads: int = 128,
  group_offset: int = 0,
  shared_turns: int = 0,
  chain_timeout_s: float = STANDALONE.chain_timeout_s,
  reward_only_fields: Sequence[str] = REWARD_ONLY_FIELDS,
) -> list[Trajectory]:
  """Runs `num_chains` chains per row concurrently; returns trajectories row-major
  (`[row0 chain0, row0 chain1, ..., row1 chain0, ...]`), group_id = group_offset + row index.

  Args:
    agent: a ToolCallAgent / ReactAgent / CodeAgent.
    rows: dataset rows (dicts with 'question' and optional fields, e.g. 'answer', 'tools').
    sampler: anything with `async agenerate(prompt_ids, params) -> SampleResult`.
    num_chains: chains per row (they share the row's group_id).
    max_turns: model turns per chain.
    sampling_params: temperature etc.; `max_new_tokens` is replaced per turn by the remaining
      budget, the agent's end-of-turn ids are added to `stop_token_ids`.
    max_tokens_per_turn: cap on tokens generated per turn.
    max_total_tokens: cap on a chain's whole context (prompt + turns + observations).
    concurrency: how many chains run at once.
    env_provider: EnvProvider for stateful tools / env rewards (default: the agent's
      `env_provider`, else `agentfly_jax.envs.default_provider()`; only created if a chain
      needs an environment).
    seed: base seed; each request gets a seed derived from (seed, group, chain, turn). None
      keeps `sampling_params.seed`.
    tool_threads: worker threads for synchronous tool and reward functions.
    group_offset: added to every group id (and so to the request seeds): a process rolling out
      rows k.. of a larger batch gets the trajectories a single rollout of the batch would.
    shared_turns: the chains of a group draw their first `shared_turns` turns with the same
      seeds (chain 0's): with a deterministic environment and sampler they share that opening
      and branch after it, so the group's reward spread comes from the later turns (e.g. the
      decision on a page the opening reaches); needs `seed`. 0 = every chain its own.
    chain_timeout_s: wall-clock seconds per chain (> 0); a chain past it ends with finish "timeout".
    reward_only_fields: row fields the agent's prompt and per-row tools never see (the reward and the
      env's reset get the whole row; data/row_fields.py).
  """
  check_chain_args(
    "rollout",
    num_chains=num_chains,
    max_turns=max_turns,
    max_tokens_per_turn=max_tokens_per_turn,
    max_total_tokens=max_total_tokens,
    concurrency=concurrency,
    tool_threads=tool_threads,
  )
  check_shared_turns("rollout", shared_turns, seed)
  check_chain_timeout("rollout", chain_timeout_s)
  check_reward_only(reward_only_fields, "rollout: reward_only_fields")
  validate_rows(agent, rows, reward_only_fields)
  cfg = make_config(
    agent,
    sampler=sampler,
    max_turns=max_turns,
    sampling_params=sampling_params or SamplingParams(),
    max_tokens_per_turn=max_tokens_per_turn,
    max_total_tokens=max_total_tokens,
    env_provider=env_provider,
    seed=seed,
    tool_threads=tool_threads,
    shared_turns=shared_turns,
    chain_timeout_s=chain_timeout_s,
    reward_only_fields=reward_only_fields,
  )

  async def run_chain(row, group_id, chain_id):
    return await _run_chain(agent, row, group_id, chain_id, cfg)

  on_group = group_scorer(agent.reward_fn)
  return await drive_chains(
    rows, num_chains, run_chain, concurrency=concurrency, group_offset=group_offset, on_group=on_group
  )


def run_rollout(agent: RolloutAgent, rows: Sequence[dict], **kwargs) -> list[Trajectory]:
  """Synchronous `rollout` (runs its own trio loop); same arguments."""
  return trio.run(functools.partial(rollout, agent, rows, **kwargs))

"""Supervised warm start on scripted demonstrations, produced by the real rollout.

`ScriptedPolicySampler` is a Sampler whose "model" is a Python policy over the rendered prompt
text: it returns the demonstration's assistant message as token ids (+ the end-of-turn token).
Running the normal agent rollout with it yields real trajectories (same template, same tool
execution, same observation tokens, same action mask) — the SFT loss then trains on exactly the
masked-in tokens, as RL later does.

A policy returns either the message text, or its pieces `[(text, learn), ...]`: pieces with
`learn=False` are generated (they are part of the conversation) but left out of the SFT loss
(`loss_mask`). The lookup demo uses this for a guessed answer word: the warm start learns the
decision to answer without the tool, but not a guess it could only memorise.
"""

from __future__ import annotations

from typing import Callable, Sequence, Union

import jax
import numpy as np

from agentfly_jax.sampling.protocol import SampleResult, SamplingParams

DemoTurn = Union[str, Sequence[tuple]]


class ScriptedPolicySampler:
  """Sampler protocol over `policy(prompt_text, rng) -> text | [(text, learn), ...]`."""

  def __init__(
    self, tokenizer, policy: Callable[[str, np.random.Generator], DemoTurn], end_of_turn_id: int, seed: int = 0
  ):
    self.tokenizer = tokenizer
    self.policy = policy
    self.end_of_turn_id = int(end_of_turn_id)
    self._rng = np.random.default_rng(seed)
    # prompt ids + generated ids -> positions (within the generated ids) left out of the loss
    self._unlearned: dict[tuple, list[int]] = {}

  def _encode(self, turn: DemoTurn) -> tuple[list[int], list[int]]:
    """Token ids of a demo turn and the indices (into them) of its `learn=False` pieces."""
    if isinstance(turn, str):
      return list(self.tokenizer.encode(turn)), []
    ids, unlearned = [], []
    for i, piece in enumerate(turn):
      if not (isinstance(piece, (tuple, list)) and len(piece) == 2 and isinstance(piece[0], str)):
        raise TypeError(f"scripted policy: piece {i} of a demo turn must be (text, learn), got {piece!r:.80}")
      piece_ids = list(self.tokenizer.encode(piece[0]))
      if not piece[1]:
        unlearned += range(len(ids), len(ids) + len(piece_ids))
      ids += piece_ids
    return ids, unlearned

  def _one(self, prompt: Sequence[int], params: SamplingParams) -> SampleResult:
    text = self.tokenizer.decode(list(prompt))
    rng = np.random.default_rng(params.seed) if params.seed is not None else self._rng
    ids, unlearned = self._encode(self.policy(text, rng))
    ids = ids[: params.max_new_tokens - 1] + [self.end_of_turn_id]
    unlearned = [i for i in unlearned if i < len(ids) - 1]
    if unlearned:
      self._unlearned[tuple(prompt) + tuple(ids)] = unlearned
    return SampleResult(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop")

  def generate(self, prompts, params, images=None):  # a script writes from the text; images change nothing
    return [self._one(p, params) for p in prompts]

  async def agenerate(self, prompt, params, images=None):
    return self._one(prompt, params)

  def update_weights(self, params) -> None:  # a script has no weights
    return None

  def loss_mask(self, token_ids: np.ndarray, action_mask: np.ndarray) -> np.ndarray:
    """bool[T]: `action_mask` without the tokens of `learn=False` pieces this sampler produced.

    A model turn is a maximal run of `action_mask`; it is looked up by the ids up to its end
    (the rollout keeps the sampler's ids verbatim). A turn the rollout cut short keeps its mask.
    """
    token_ids = np.asarray(token_ids).reshape(-1)
    mask = np.asarray(action_mask, dtype=bool).reshape(-1).copy()
    T = mask.shape[0]
    ends = [e for e in range(1, T + 1) if mask[e - 1] and (e == T or not mask[e])]
    for e in ends:
      s = e
      while s > 0 and mask[s - 1]:
        s -= 1
      unlearned = self._unlearned.get(tuple(int(t) for t in token_ids[:e]))
      for i in unlearned or ():
        mask[s + i] = False
    return mask

  def clear(self) -> None:
    """Forgets the recorded turns (call after their loss masks were taken)."""
    self._unlearned.clear()


def sft_loss_mask(trajs: Sequence, demo, width: int) -> np.ndarray:
  """bool[B, width]: target-aligned SFT loss mask (as `train_arrays`' action_mask: position t
  is token t+1) — each trajectory's action mask without the demo's `learn=False` pieces."""
  out = np.zeros((len(trajs), width + 1), dtype=bool)
  for i, t in enumerate(trajs):
    mask = demo.loss_mask(t.token_ids, t.action_mask) if demo is not None else t.action_mask
    out[i, : len(mask)] = mask[: width + 1]
  if demo is not None:
    demo.clear()
  return out[:, 1:]


class SftProgram:
  """Supervised steps on trajectories: `program.step(state, trajs) -> (state, device metrics)`.

  graphdef / rest: the policy's halves (rest: LoRA's frozen base, an argument of the step);
  optimizer: the SFT optimizer; states: the run's `programs.TrainStates` (places a state on the
  mesh); loss_cfg: its log-prob chunking; pad_id / micro_batch_size: the batch layout; vision: a
  vision-language policy's (image processor, ModelConfig, patch multiple) (rl/run.vision_arrays_of):
  each row's images go into the batch as the RL step's do. `program.new_state(params)` makes the state.
  """

  def __init__(
    self,
    graphdef,
    rest,
    optimizer,
    *,
    states,
    loss_cfg,
    mesh,
    rules,
    pad_id: int,
    micro_batch_size: int,
    vision: tuple | None = None,
  ):
    from agentfly_jax.rl.programs import sft_step_program

    self.optimizer, self.states, self.rest = optimizer, states, rest
    self.pad_id, self.micro_batch_size, self.vision = pad_id, micro_batch_size, vision
    self.state_sharding = states.sharding_for(optimizer)
    self._step, self.batch_sharding = sft_step_program(
      graphdef, rest, optimizer, loss_cfg, mesh, rules, self.state_sharding, frozen=rest, vision=vision is not None
    )

  def new_state(self, params):
    return self.states.new(params, self.optimizer, sharding=self.state_sharding)

  def step(self, state, trajs, demo: "ScriptedPolicySampler | None" = None):
    """`demo`: the sampler that produced `trajs`; its `learn=False` pieces stay out of the loss."""
    from agentfly_jax.rl.batching import to_microbatches, train_arrays
    from agentfly_jax.rl.update import put_global

    arr = train_arrays(trajs, pad_id=self.pad_id)
    arr["action_mask"] = sft_loss_mask(trajs, demo, arr["action_mask"].shape[1])
    if self.vision is not None:
      from agentfly_jax.rl.vision_batch import image_arrays

      processor, model_cfg, patch_multiple = self.vision
      length = arr["input_ids"].shape[1]
      arr.update(image_arrays(trajs, processor, model_cfg, length=length, patch_multiple=patch_multiple))
    batch = {k: arr[k] for k in self.batch_sharding}
    mb = to_microbatches(batch, np.arange(len(trajs)), self.micro_batch_size)
    mb = {k: put_global(v, self.batch_sharding[k]) for k, v in mb.items()}
    return self._step(state, mb, self.rest)  # the rest (LoRA: the base) as an argument


def check_demos(trajs, step: int) -> None:
  """RuntimeError when every demonstration chain of SFT step `step` failed (nothing to learn from), naming the
  first failure; a share of failed demos trains on the rest (a failed chain's tokens are its prompt only)."""
  failed = [t for t in trajs if t.finish_reason == "error"]
  if trajs and len(failed) == len(trajs):
    first = failed[0]
    raise RuntimeError(
      f"SFT step {step}: every demonstration chain failed ({len(trajs)} of {len(trajs)}); the first: "
      f"{first.error} (at {first.error_frame}) (the demo policy: the task's scripted_response; the chains' "
      "limits: config.rollout.max_total_tokens / max_tokens_per_turn)"
    )


def takes_row(policy) -> bool:
  """A demonstration policy that reads the row it demonstrates (`scripted_response(..., row=)`: a task whose answer
  is not in the prompt text, e.g. in a picture): the demos run one row at a time."""
  import inspect

  try:
    return "row" in inspect.signature(policy).parameters
  except (TypeError, ValueError):
    return False


def train_on_demos(
  program: SftProgram,
  params,
  *,
  task,
  tokenizer,
  end_of_turn_id: int,
  sft,
  seed: int,
  rollout: Callable,
  progress: bool = False,
  after_step: Callable[[int, object], None] | None = None,
) -> tuple[object, list[float]]:
  """The warm start phase of `sft` (rl/spec.SftSection): scripted demonstrations of `task`
  (its `scripted_response`; given `row=` the row too when it takes one: `takes_row`) rolled out by the real
  agent through `rollout(rows, sampler=, num_chains=, seed=)`, SFT steps on them from `params`.
  `after_step(steps_done, params)` is called after each step (the lr is constant and step i's demos depend on i
  only, so the params after k steps are those of a k-step SFT). Returns (params, per-step NLL)."""
  state = program.new_state(params)
  p_tool, script = sft.tool_use_prob, task.scripted_response
  current = {"row": None}  # a policy that reads its row (`row=`): the row of the chain being demonstrated
  if takes_row(script):
    policy = lambda text, rng: script(text, rng.random() < p_tool, rng, row=current["row"])  # noqa: E731
  else:
    policy = lambda text, rng: script(text, rng.random() < p_tool, rng)  # noqa: E731
  demo = ScriptedPolicySampler(tokenizer, policy, end_of_turn_id, seed=seed)
  from tqdm.auto import tqdm

  bar = tqdm(total=sft.steps, desc="sft", disable=not progress, dynamic_ncols=True)
  nll = []
  for i in range(sft.steps):
    rows = task.make_rows(sft.rows_per_step, seed=10_000_000 + seed * 100_003 + i)
    if takes_row(script):  # one row at a time, so the policy knows whose chain it writes
      trajs = []
      for j, row in enumerate(rows):
        current["row"] = row
        trajs += rollout([row], sampler=demo, num_chains=1, seed=(seed * 7919 + i) * 1_000_003 + j)
    else:
      trajs = rollout(rows, sampler=demo, num_chains=1, seed=seed * 7919 + i)
    check_demos(trajs, i)
    state, m = program.step(state, trajs, demo)
    nll.append(m["sft/nll"])
    bar.update(1)
    if after_step is not None:
      after_step(i + 1, state.params)
  bar.close()
  return state.params, [float(x) for x in jax.device_get(nll)]

"""Supervised warm start on scripted demonstrations, produced by the real rollout.

`ScriptedPolicySampler` is a Sampler whose "model" is a Python policy over the rendered prompt
text: it returns the demonstration's assistant message as token ids (+ the end-of-turn token).
Running the normal agent rollout with it yields real trajectories (same template, same tool
execution, same observation tokens, same action mask) — the SFT loss then trains on exactly the
masked-in tokens, as RL later does.
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import numpy as np

from agentfly_jax.sampling.protocol import SampleResult, SamplingParams


class ScriptedPolicySampler:
  """Sampler protocol over `policy(prompt_text, rng) -> assistant_text`."""

  def __init__(self, tokenizer, policy: Callable[[str, np.random.Generator], str], end_of_turn_id: int,
               seed: int = 0):
    self.tokenizer = tokenizer
    self.policy = policy
    self.end_of_turn_id = int(end_of_turn_id)
    self._rng = np.random.default_rng(seed)

  def _one(self, prompt: Sequence[int], params: SamplingParams) -> SampleResult:
    text = self.tokenizer.decode(list(prompt))
    rng = np.random.default_rng(params.seed) if params.seed is not None else self._rng
    ids = list(self.tokenizer.encode(self.policy(text, rng)))[: params.max_new_tokens - 1]
    ids.append(self.end_of_turn_id)
    return SampleResult(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop")

  def generate(self, prompts, params):
    return [self._one(p, params) for p in prompts]

  async def agenerate(self, prompt, params):
    return self._one(prompt, params)

  def update_weights(self, params) -> None:  # a script has no weights
    return None


class SftRunner:
  """Supervised steps on trajectories: `runner.step(state, trajs) -> (state, device metrics)`.

  trainer: a `Trainer` (its mesh, graphdef/rest, tokenizer and micro-batch size); optimizer: the
  SFT optimizer (it lives here, not on the trainer). `runner.new_state(params)` makes the state.
  """

  def __init__(self, trainer, optimizer):
    from agentfly_jax.rl.train_step import batch_sharding, jit_step, make_sft_step
    self.trainer, self.optimizer = trainer, optimizer
    self.state_sharding = trainer.state_sharding_for(optimizer)
    keys = dict.fromkeys(("input_ids", "target_ids", "attention_mask", "action_mask"))
    self.batch_sharding = batch_sharding(trainer.mesh, keys)
    self._step = jit_step(make_sft_step(trainer.graphdef, trainer.rest, optimizer),
                          self.state_sharding, self.batch_sharding)

  def new_state(self, params):
    return self.trainer.new_state(params, self.optimizer, state_sharding=self.state_sharding)

  def step(self, state, trajs):
    from agentfly_jax.rl.batching import to_microbatches, train_arrays
    from agentfly_jax.rl.update import put_global
    arr = train_arrays(trajs, pad_id=self.trainer.tokenizer.pad_token_id)
    batch = {k: arr[k] for k in self.batch_sharding}
    mb = to_microbatches(batch, np.arange(len(trajs)), self.trainer.config.train.micro_batch_size)
    mb = {k: put_global(v, self.batch_sharding[k]) for k, v in mb.items()}
    return self._step(state, mb)


def run_sft(trainer) -> tuple[object, list[float]]:
  """The warm start phase of `config.sft`: scripted demonstrations of `trainer.task` rolled out by
  the real agent, SFT steps on them. Returns (params, per-step NLL)."""
  from agentfly_jax.rl.train_state import make_optimizer
  c = trainer.config
  runner = SftRunner(trainer, make_optimizer(lr=c.sft.lr, max_grad_norm=c.train.max_grad_norm))
  state = runner.new_state(trainer.init_params)
  p_tool = c.sft.tool_use_prob
  demo = ScriptedPolicySampler(
      trainer.tokenizer, lambda text, rng: trainer.task.scripted_response(text, rng.random() < p_tool, rng),
      trainer.end_of_turn_id, seed=c.seed)
  from tqdm.auto import tqdm
  bar = tqdm(total=c.sft.steps, desc="sft", disable=not c.log.progress, dynamic_ncols=True)
  nll = []
  for i in range(c.sft.steps):
    rows = trainer.task.make_rows(c.sft.rows_per_step, seed=10_000_000 + c.seed * 100_003 + i)
    trajs = trainer.rollout(rows, sampler=demo, num_chains=1, seed=c.seed * 7919 + i)
    state, m = runner.step(state, trajs)
    nll.append(m["sft/nll"])
    bar.update(1)
  bar.close()
  return state.params, [float(x) for x in jax.device_get(nll)]

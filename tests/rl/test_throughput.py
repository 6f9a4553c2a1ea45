"""Throughput metrics of every step (rl/throughput.py): token counts equal the trajectories' and the
batch's action tokens, the trainer's time parts fit in the step's wall, the rollout's busy clocks
count overlapping chains once and never exceed the wall they were measured over."""

import threading
import time

import numpy as np
import pytest
import trio

from agent_testlib import hermes_call, tokenizer_dir
from agentfly_jax import tool
from agentfly_jax.agents import ToolCallAgent, run_rollout
from agentfly_jax.agents.busy_clock import ENV_CLOCK, SAMPLER_CLOCK, BusyClock
from agentfly_jax.agents.trajectory import Trajectory
from agentfly_jax.rl import throughput
from agentfly_jax.rl.batching import train_arrays
from agentfly_jax.sampling.scripted import ScriptedSampler


def test_busy_clock_counts_overlapping_holders_once():
  clock = BusyClock("x")
  t0, b0 = time.perf_counter(), clock.busy_s()

  def hold(delay, length):
    time.sleep(delay)
    with clock:
      with clock:  # re-entrant: nesting adds nothing
        time.sleep(length)

  threads = [threading.Thread(target=hold, args=(d, 0.15)) for d in (0.0, 0.05)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  busy, wall = clock.busy_s() - b0, time.perf_counter() - t0
  assert 0.2 - 0.01 <= busy <= wall  # the union [0, 0.2], not the sum 0.3
  assert busy < 0.29


def _traj(n_prompt, turns, obs=3):
  ids, mask = list(range(n_prompt)), [False] * n_prompt
  for k in turns:
    ids += [7] * k + [1] * obs
    mask += [True] * k + [False] * obs
  return Trajectory(token_ids=ids, action_mask=mask, sampler_logprobs=np.zeros(len(ids)), reward=1.0)


def test_step_metrics_count_tokens_and_split_the_wall():
  trajs = [_traj(5, [4, 2]), _traj(3, [1]), _traj(6, [5, 5, 5])]
  arrays = train_arrays(trajs[:2], pad_id=0)
  meter = throughput.StepMeter(num_devices=4)
  step = {
    "time/rollout_s": 1.0,
    "time/step_arrays_s": 0.1,
    "time/prepare_s": 0.4,
    "time/train_s": 2.0,
    "time/sync_s": 0.25,
    "time/eval_s": 0.5,
    "time/step_s": 3.9,
  }
  m = meter.step_metrics(trajs, arrays, step)
  assert m["throughput/sampled_tokens"] == 4 + 2 + 1 + 15 == sum(int(t.action_mask.sum()) for t in trajs)
  assert m["throughput/trained_tokens"] == 7 == arrays["action_mask"].sum()  # the shifted arrays keep every action
  assert m["time/sampled_tok_per_s_per_device"] == pytest.approx(22 / 3.9 / 4)
  assert m["time/trained_tok_per_s_per_device"] == pytest.approx(7 / 3.9 / 4)
  parts = {p: m[f"time/split/{p}_s"] for p in throughput.SPLIT_PARTS}
  assert parts == pytest.approx({"rollout_wait": 1.0, "prepare": 0.5, "train": 1.5, "sync": 0.25, "eval": 0.5})
  assert sum(parts.values()) <= step["time/step_s"] + 1e-9
  assert m["time/trainer_idle_frac"] == pytest.approx(1.0 / 3.9)
  # nothing was rolled out since the meter was made: the busy clocks add (almost) nothing
  assert 0 <= m["time/split/sampler_s"] < 0.05 and 0 <= m["time/split/env_s"] < 0.05
  # DAPO dropped everything: nothing trained
  assert meter.step_metrics(trajs, None, step)["throughput/trained_tokens"] == 0
  bar = throughput.postfix({**step, **m})
  assert bar["idle"] == "26%" and bar["tok/s/dev"] == "1/0"
  assert throughput.postfix({}) == {}


@tool
async def slow_lookup(key: str) -> str:
  """Looks a key up, slowly.

  Args:
    key: the key.
  """
  await trio.sleep(0.05)
  return key.upper()


class _SlowSampler(ScriptedSampler):
  async def agenerate(self, prompt, params):
    await trio.sleep(0.04)
    return await super().agenerate(prompt, params)


def test_rollout_busy_clocks_and_sampled_tokens():
  agent = ToolCallAgent(tokenizer_dir("qwen2.5"), tools=[slow_lookup])
  tok = agent.tokenizer
  replies = [hermes_call("slow_lookup", {"key": "ab"}) + "<|im_end|>", "AB<|im_end|>"]

  def script(prompt_ids):
    k = tok.decode(prompt_ids).count("<|im_start|>assistant") - 1
    return tok.encode(replies[min(k, 1)])

  meter = throughput.StepMeter()
  t0, s0, e0 = time.perf_counter(), SAMPLER_CLOCK.busy_s(), ENV_CLOCK.busy_s()
  trajs = run_rollout(agent, [{"question": "a"}, {"question": "b"}], sampler=_SlowSampler(script), num_chains=2)
  wall = time.perf_counter() - t0
  sampler_s, env_s = SAMPLER_CLOCK.busy_s() - s0, ENV_CLOCK.busy_s() - e0
  assert all(t.num_turns == 2 for t in trajs)
  # 4 concurrent chains, 2 sampler calls and 1 tool call each: about 2 x 0.04 s and 0.05 s of busy wall
  assert 0.08 - 0.01 <= sampler_s <= wall and 0.05 - 0.01 <= env_s <= wall
  assert sampler_s < 4 * 2 * 0.04  # overlapping calls counted once
  m = meter.step_metrics(trajs, None, {"time/step_s": wall, "time/rollout_s": wall})
  assert m["throughput/sampled_tokens"] == sum(len(t.generated_token_ids) for t in trajs)
  assert m["time/split/sampler_s"] <= wall + 0.05 and m["time/split/sampler_s"] >= sampler_s
  assert m["time/trainer_idle_frac"] == 1.0


def test_plot_throughput_writes_two_panels(tmp_path):
  records = [
    {"step": s, "time/sampled_tok_per_s_per_device": 10.0 * s, "time/trained_tok_per_s_per_device": 5.0 * s}
    | {f"time/split/{p}_s": 0.1 for p in (*throughput.SPLIT_PARTS, "sampler", "env")}
    for s in (1, 2, 3)
  ]
  path = throughput.plot_throughput(records, str(tmp_path / "t.png"), title="x")
  assert path and (tmp_path / "t.png").stat().st_size > 1000
  assert throughput.plot_throughput([{"step": 1}], str(tmp_path / "none.png")) is None
  assert not (tmp_path / "none.png").exists()

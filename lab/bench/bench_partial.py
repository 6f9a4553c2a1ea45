"""Partial rollouts vs async (whole batches) vs sync on heavy-tailed chain lengths: steps/s.

  .venv/bin/python lab/bench/bench_partial.py --steps=12 --repeats=2
  -> lab/results/bench_partial.{json,md}

The task: rows whose chains take 2 turns (90 %) or 20 turns (10 %), each turn a tool call, so one
long group holds a whole-batch rollout for 20 turns. The three loops run the project's own code: sync
(`agents.run_rollout` of the step's rows, then the update), async (`rl.async_rollout.RolloutProducer`,
max_staleness 1: the next batch rolls out during the update), partial (`rl.partial_rollout.
PartialRolloutProducer` over `agents.stream_rollout.stream_groups`, max_staleness k (--partial_staleness): a step takes
the first groups to finish, long ones carry over and continue under the new weights). The model is
emulated, so that only scheduling differs: a sampler whose batches go through the project's
`BatchingScheduler` and cost `--batch_s + --row_s * rows` seconds each (a decode-bound engine: one
long chain alone costs nearly a full batch), a scripted policy (equal reward in every mode by
construction: every chain ends with the same answer), and an update of `--update_s` seconds
(time.sleep, the trainer thread's share). Reported: steps/s over all steps, each mode's ratio to
sync, the share of 20-turn chains among the trained ones (partial reorders the stream: long groups
arrive later), turns' staleness and the share past the bound (a training run leaves those turns out of
the loss: rl/partial_rollout.mask_stale_segments), chains that span several policy versions.
"""

import json
import os
import time

import numpy as np
import trio
from absl import app, flags
from bench_common import load_note
from bench_machine import machine, write_results

_STEPS = flags.DEFINE_integer("steps", 12, "Steps per run.")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Runs per mode (interleaved: sync, async, partial, sync, ...).")
_ROWS = flags.DEFINE_integer("rows", 8, "Rows (groups) per step.")
_CHAINS = flags.DEFINE_integer("chains", 4, "Chains per row.")
_LONG_FRAC = flags.DEFINE_float("long_frac", 0.1, "Share of rows whose chains take --long_turns turns.")
_LONG = flags.DEFINE_integer("long_turns", 20, "Turns of a long chain (the others take 2).")
_BATCH_S = flags.DEFINE_float("batch_s", 0.03, "Emulated sampler: seconds per batch (one turn of every row in it).")
_ROW_S = flags.DEFINE_float("row_s", 0.0005, "Emulated sampler: extra seconds per row of a batch.")
_UPDATE_S = flags.DEFINE_float("update_s", 0.3, "Emulated update (prepare + train + sync) seconds per step.")
_PARTIAL_K = flags.DEFINE_list("partial_staleness", ["1", "4"], "max_staleness of the partial runs (one mode each).")
_OUT = flags.DEFINE_string("out", "lab/results/bench_partial", "Output path (no extension).")


class EmulatedSampler:
  """Scripted replies through the project's BatchingScheduler; a batch of n rows costs batch_s + row_s * n."""

  def __init__(self, script, batch_s, row_s, max_batch=256):
    from agentfly_jax.sampling.batching import BatchingScheduler
    from agentfly_jax.sampling.scripted import ScriptedSampler

    self._scripted = ScriptedSampler(script)
    self.batch_s, self.row_s = batch_s, row_s
    self.scheduler = BatchingScheduler(self._run_batch, max_batch_size=max_batch)

  def _run_batch(self, prompts, params_list):
    time.sleep(self.batch_s + self.row_s * len(prompts))
    return [self._scripted._sample(p, q) for p, q in zip(prompts, params_list)]

  async def agenerate(self, prompt, params):
    return await self.scheduler.submit(prompt, params)

  def update_weights(self, params):
    return None


def _tokenizer_dir() -> str:
  """A tiny HF tokenizer folder (qwen2.5 chat template), trained on a few calculator lines."""
  import tempfile

  from agentfly_jax.data import build_tiny_tokenizer

  corpus = ["What is 2 + 3? The answer is 5.", "Compute (7 * 6) - 2 with the calculator.", "row 1: long", "done"] * 4
  out = os.path.join(tempfile.mkdtemp(prefix="bench_partial_tok_"), "tok")
  return build_tiny_tokenizer(out, corpus, vocab_size=600, template="qwen2.5")


def _hermes_call(name: str, arguments: dict) -> str:
  return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def _task():
  from agentfly_jax.agents import ToolCallAgent
  from agentfly_jax.tools import calculator

  agent = ToolCallAgent(_tokenizer_dir(), tools=[calculator])
  tok = agent.tokenizer

  def script(prompt_ids):
    text = tok.decode(prompt_ids)
    k = text.count("<|im_start|>assistant") - 1
    turns = _LONG.value if "long" in text else 2
    reply = _hermes_call("calculator", {"expression": f"{k}+1"}) if k < turns - 1 else "done"
    return tok.encode(reply + "<|im_end|>")

  rng = np.random.default_rng(0)
  kinds = ["long" if x < _LONG_FRAC.value else "short" for x in rng.random(10_000)]

  def row_at(k):
    return {"question": f"row {k}: {kinds[k]}"}

  return agent, script, row_at


def _rollout_kwargs():
  from agentfly_jax.sampling import SamplingParams

  return dict(
    num_chains=_CHAINS.value,
    max_turns=_LONG.value,
    sampling_params=SamplingParams(temperature=1.0),
    max_tokens_per_turn=64,
    max_total_tokens=16384,
  )


def _versions(trajs, version):
  for t in trajs:
    if not t.policy_versions:
      t.policy_versions = [version] * max(1, t.num_turns)


def _run(mode: str, k: int = 1) -> dict:
  from agentfly_jax.agents import run_rollout
  from agentfly_jax.agents.stream_rollout import stream_groups
  from agentfly_jax.rl.async_rollout import RolloutProducer
  from agentfly_jax.rl.partial_rollout import PartialRolloutProducer
  from agentfly_jax.rl.stages import SamplerWeights

  agent, script, row_at = _task()
  sampler = EmulatedSampler(script, _BATCH_S.value, _ROW_S.value)
  weights = SamplerWeights(sampler)
  weights.load({"v": np.int32(0)})
  r, steps = _ROWS.value, _STEPS.value

  def batch_rows(step):
    return [row_at((step - 1) * r + i) for i in range(r)]

  def rollout_batch(step):
    return run_rollout(agent, batch_rows(step), sampler=sampler, seed=step, **_rollout_kwargs())

  def run_stream(s, next_group, on_group, may_start, stopped):
    trio.run(lambda: stream_groups(agent, next_group, on_group, may_start, stopped, sampler=s, **_rollout_kwargs()))

  producer = None
  if mode == "async":
    producer = RolloutProducer(rollout_batch, weights, first_step=1, last_step=steps, max_staleness=1, start_version=0)
  elif mode == "partial":
    producer = PartialRolloutProducer(run_stream, row_at, weights, rows_per_step=r, max_staleness=k, start_version=0)
  if producer is not None:
    producer.start()
  trained, staleness, spanning, waits = [], [], [], 0.0
  t0 = time.perf_counter()
  try:
    for step in range(1, steps + 1):
      tw = time.perf_counter()
      if producer is None:
        trajs = rollout_batch(step)
        _versions(trajs, step - 1)
      else:
        trajs = producer.get(step).trajectories
      waits += time.perf_counter() - tw
      trained += trajs
      staleness += [step - 1 - v for t in trajs for v in t.policy_versions]
      spanning += [len(set(t.policy_versions)) > 1 for t in trajs]
      time.sleep(_UPDATE_S.value)  # the update
      if producer is not None:
        producer.publish(step, {"v": np.int32(step)})
  finally:
    if producer is not None:
      producer.close()
  wall = time.perf_counter() - t0
  rewards_equal = len({t.prediction for t in trained}) == 1
  return {
    "mode": mode if mode != "partial" else f"partial k={k}",
    "wall_s": wall,
    "steps_per_s": steps / wall,
    "trainer_idle_frac": waits / wall,
    "long_share_trained": float(np.mean(["long" in t.row["question"] for t in trained])),
    "turns_mean": float(np.mean([t.num_turns for t in trained])),
    "staleness_max": int(max(staleness)),
    "staleness_mean": float(np.mean(staleness)),
    "turns_past_bound": float(np.mean([x > k for x in staleness])),  # a run masks these out of the loss
    "trained_turns_per_s": sum(x <= k for x in staleness) / wall,  # turns within the bound: what the loss sees
    "chains_spanning_versions": float(np.mean(spanning)),
    "same_outcome_every_chain": rewards_equal,
  }


def main(_):
  load0 = os.getloadavg()[0]
  runs = []
  for rep in range(_REPEATS.value):
    for mode, k in [("sync", 1), ("async", 1)] + [("partial", int(x)) for x in _PARTIAL_K.value]:
      res = _run(mode, k)
      res["repeat"] = rep
      runs.append(res)
      print(json.dumps(res))
  modes = {}
  for mode in dict.fromkeys(x["mode"] for x in runs):
    mine = [x for x in runs if x["mode"] == mode]
    modes[mode] = {k: float(np.mean([x[k] for x in mine])) for k in mine[0] if k not in ("mode", "repeat")}
  ref = modes["sync"]["steps_per_s"]
  for m in modes.values():
    m["vs_sync"] = m["steps_per_s"] / ref
    m["trained_turns_vs_sync"] = m["trained_turns_per_s"] / modes["sync"]["trained_turns_per_s"]
  result = {
    "machine": machine(),
    "load": load_note(load0),
    "settings": {
      k: f.value
      for k, f in [
        ("steps", _STEPS),
        ("repeats", _REPEATS),
        ("rows", _ROWS),
        ("chains", _CHAINS),
        ("long_frac", _LONG_FRAC),
        ("long_turns", _LONG),
        ("batch_s", _BATCH_S),
        ("row_s", _ROW_S),
        ("update_s", _UPDATE_S),
      ]
    },
    "modes": modes,
    "runs": runs,
  }
  lines = [
    "# Partial rollouts vs async vs sync: heavy-tailed chains (bench_partial.py)",
    "",
    f"Machine: {result['machine']}; {result['load']}. Emulated sampler ({_BATCH_S.value} s per batch + "
    f"{_ROW_S.value} s per row) and update ({_UPDATE_S.value} s); {_ROWS.value} rows x {_CHAINS.value} chains "
    f"per step, {100 * _LONG_FRAC.value:.0f} % of rows {_LONG.value} turns, else 2; max_staleness 1 (async; partial: k); "
    f"{_STEPS.value} steps x {_REPEATS.value} repeats (interleaved). Every chain ends with the same outcome "
    "(scripted policy), so reward is equal by construction; learning with partial rollouts is "
    "tests/e2e/test_partial_learning.py.",
    "",
    "| mode | steps/s | vs sync | trainer idle | 20-turn share of trained chains | turns/chain | staleness mean / max "
    "| turns past the bound (masked) | trained turns/s vs sync | chains spanning versions |",
    "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for mode, m in modes.items():
    lines.append(
      f"| {mode} | {m['steps_per_s']:.3f} | {m['vs_sync']:.2f}x | {100 * m['trainer_idle_frac']:.0f} % | "
      f"{100 * m['long_share_trained']:.1f} % | {m['turns_mean']:.2f} | {m['staleness_mean']:.2f} / "
      f"{m['staleness_max']:.0f} | {100 * m['turns_past_bound']:.1f} % | {m['trained_turns_vs_sync']:.2f}x | "
      f"{100 * m['chains_spanning_versions']:.1f} % |"
    )
  write_results(_OUT.value, result, "\n".join(lines) + "\n")


if __name__ == "__main__":
  app.run(main)

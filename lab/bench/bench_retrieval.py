"""BM25 retrieval bench: a ~100,000-passage generated corpus; index build time, load-from-cache
time, query latency in-process and through a real env server (`retrieval` env), with the same
server's `echo` round trip as the protocol-floor reference.

  .venv/bin/python lab/bench/bench_retrieval.py [--scale=19.2] [--queries=400]

Writes lab/results/bench_retrieval.{json,md}. Goals: query p50 <= 5 ms in-process,
<= 10 ms through the server; load from cache <= 1 s.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time


import numpy as np  # noqa: E402
import trio  # noqa: E402
from absl import app, flags  # noqa: E402

from agentfly_jax.envs.local_server import LocalEnvServer  # noqa: E402
from agentfly_jax.tasks.multihop_kb import generate_kb, write_corpus  # noqa: E402
from envservers.client import Connection  # noqa: E402
from envservers.envs import retrieval  # noqa: E402
from bench_common import RESULTS_DIR  # this folder is on sys.path: the script's own

_SCALE = flags.DEFINE_float("scale", 19.2, "KB scale (19.2: ~100,000 passages).")
_QUERIES = flags.DEFINE_integer("queries", 400, "Queries per measurement.")
_OUT = flags.DEFINE_string("out", os.path.join(RESULTS_DIR, "bench_retrieval"), "Output path stem.")


def _percentiles(seconds: list[float]) -> dict:
  ms = np.array(seconds) * 1000
  return {
    "p50_ms": float(np.percentile(ms, 50)),
    "p99_ms": float(np.percentile(ms, 99)),
    "mean_ms": float(ms.mean()),
    "n": len(ms),
  }


async def _server_latencies(address: str, queries: list[str], k: int) -> tuple[list, list]:
  conn = await Connection.open(address)
  await conn.call("acquire", {"env": "retrieval", "chain_id": "bench"})
  await conn.call("acquire", {"env": "echo", "chain_id": "bench-echo"})
  search, echo = [], []
  for q in queries:  # interleaved, so both see the same machine load
    start = time.perf_counter()
    await conn.call("step", {"env": "retrieval", "chain_id": "bench", "action": {"query": q, "k": k}})
    search.append(time.perf_counter() - start)
    start = time.perf_counter()
    await conn.call("step", {"env": "echo", "chain_id": "bench-echo", "action": q})
    echo.append(time.perf_counter() - start)
  await conn.aclose()
  return search, echo


def main(argv):
  del argv
  work = tempfile.mkdtemp(prefix="bench_retrieval_")
  corpus, cache = os.path.join(work, "corpus.jsonl"), os.path.join(work, "cache")
  t = time.perf_counter()
  kb = generate_kb(seed=7, scale=_SCALE.value)
  generate_s = time.perf_counter() - t
  write_corpus(kb.passages, corpus)
  rng = np.random.default_rng(0)
  picks = rng.choice(len(kb.passages), size=_QUERIES.value, replace=False)
  name_queries = [kb.passages[int(i)]["title"] for i in picks]
  questions = [r["question"] for r in kb.questions["test"]]
  question_queries = [questions[int(i)] for i in rng.choice(len(questions), size=_QUERIES.value)]

  t = time.perf_counter()
  index = retrieval.shared_index(corpus, cache)  # load + validate + tokenize + index + save
  build_s = time.perf_counter() - t
  assert index.source == "built"
  loads = []
  for _ in range(3):
    retrieval._indexes.clear()
    t = time.perf_counter()
    index = retrieval.shared_index(corpus, cache)
    loads.append(time.perf_counter() - t)
    assert index.source == "cache"
  in_process = {}
  for label, queries in (("name", name_queries), ("question", question_queries)):
    times = []
    for q in queries:
      t = time.perf_counter()
      index.search(q, 3)
      times.append(time.perf_counter() - t)
    in_process[label] = _percentiles(times)
  hits = sum(index.search(q, 1)[0][0]["title"] == q for q in name_queries[:200])

  server = LocalEnvServer(["retrieval=2:1", "echo=2:1"], [f"retrieval.corpus={corpus}", f"retrieval.cache_dir={cache}"])
  try:
    server_search, server_echo = trio.run(_server_latencies, server.address, name_queries, 3)
    server_q, _ = trio.run(_server_latencies, server.address, question_queries, 3)
  finally:
    server.stop()
  through_server = {
    "name": _percentiles(server_search),
    "question": _percentiles(server_q),
    "echo_reference": _percentiles(server_echo),
  }
  result = {
    "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs "
    f"(2-core CPU shared with other jobs)",
    "num_passages": len(kb.passages),
    "generate_s": generate_s,
    "build_s": build_s,
    "load_from_cache_s": min(loads),
    "load_from_cache_all_s": loads,
    "top1_title_hit_rate_name_queries": hits / 200,
    "in_process": in_process,
    "through_server": through_server,
    "server_over_echo_p50": through_server["name"]["p50_ms"] / through_server["echo_reference"]["p50_ms"],
    "goals": {"in_process_p50_ms": 5, "server_p50_ms": 10, "load_s": 1},
  }
  result["goals_met"] = {
    "in_process_p50": max(v["p50_ms"] for v in in_process.values()) <= 5,
    "server_p50": max(through_server[k]["p50_ms"] for k in ("name", "question")) <= 10,
    "load": result["load_from_cache_s"] <= 1,
  }
  os.makedirs(os.path.dirname(_OUT.value), exist_ok=True)
  with open(_OUT.value + ".json", "w") as f:
    json.dump(result, f, indent=1)
  lines = [
    f"# BM25 retrieval bench ({result['num_passages']:,} passages; {result['machine']})",
    "",
    f"- generate KB: {generate_s:.1f} s; build index (read + check + tokenize + index + "
    f"save): {build_s:.1f} s; load from cache: {min(loads):.2f} s (goal <= 1 s)",
    f"- top-1 title hit rate for name queries: {hits / 200:.2f}",
    f"- server p50 / echo p50 (protocol floor, same server, interleaved): {result['server_over_echo_p50']:.2f}x",
    "",
    "| queries | where | p50 ms | p99 ms | goal p50 |",
    "|---|---|---|---|---|",
  ]
  for label in ("name", "question"):
    lines.append(
      f"| {label} | in-process | {in_process[label]['p50_ms']:.2f} | {in_process[label]['p99_ms']:.2f} | 5 |"
    )
    lines.append(
      f"| {label} | env server | {through_server[label]['p50_ms']:.2f} | {through_server[label]['p99_ms']:.2f} | 10 |"
    )
  echo = through_server["echo_reference"]
  lines.append(f"| (echo) | env server | {echo['p50_ms']:.2f} | {echo['p99_ms']:.2f} | reference |")
  with open(_OUT.value + ".md", "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  app.run(main)

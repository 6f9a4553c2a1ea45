"""Interactive worlds on the env server: step latency, reset time, instances per GiB.

    .venv/bin/python lab/bench/bench_envservers_worlds.py [--worlds=webshop,textworld,scienceworld]

Per world, one local env server (a subprocess on loopback) and, from this process through
EnvManager (the trainer's path):
- reset: the first reset of a fresh instance (instance start + loading the task) and later
  resets of the same task on the warm instance (p50);
- step latency: sequential cheap steps (p50 / p99);
- memory: resident memory of the server's process tree (server, workers, JVMs) idle, with one
  and with `instances` loaded instances -> MiB of the first and of each further instance ->
  instances per GiB.
Writes JSON and a markdown table to --out_dir/bench_envservers_worlds.{json,md}.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time

from absl import app, flags


import numpy as np  # noqa: E402
import trio  # noqa: E402

from agentfly_jax.envs import EnvManager, LocalEnvServer  # noqa: E402
from envservers.envs.webshop_catalog import generate_catalog, make_goals  # noqa: E402
from bench_common import cpu_name, load_note  # noqa: E402
from bench_common import RESULTS_DIR  # this folder is on sys.path: the script's own

FLAGS = flags.FLAGS
flags.DEFINE_list("worlds", ["webshop", "textworld", "scienceworld"], "worlds to measure")
flags.DEFINE_integer("num_steps", 200, "sequential steps timed per world (scienceworld: / 4)")
flags.DEFINE_integer("num_resets", 10, "warm resets timed per world")
flags.DEFINE_string("out_dir", RESULTS_DIR, "where bench_envservers_worlds.{json,md} go")

# world -> (instances for the memory measurement, a row, cheap actions cycled in the step test)
INSTANCES = {"webshop": 8, "textworld": 4, "scienceworld": 2}


def _world_setup(world: str, cache: str) -> tuple[dict, list]:
  if world == "webshop":
    goal = make_goals(generate_catalog(1000, 0), 1, seed=0)[0]
    return {"goal": goal}, [f"search[{goal['query']}]", "click[back to search]"]
  if world == "textworld":
    from envservers.envs.textworld_games import game_file

    return ({"game_file": game_file("treasure_hunter", "easy", 1, cache_dir=cache)}, ["look", "inventory"])
  return {"task_name": "find-animal", "variation": 0}, ["look around", "inventory"]


def _percentiles(samples_s: list[float]) -> dict[str, float]:
  ms = np.asarray(samples_s) * 1e3
  return {
    "p50_ms": float(np.percentile(ms, 50)),
    "p99_ms": float(np.percentile(ms, 99)),
    "mean_ms": float(ms.mean()),
    "n": int(ms.size),
  }


def _tree_rss_mib(pid: int) -> float:
  """Resident memory of `pid` and all its descendants (MiB)."""
  children: dict[int, list[int]] = {}
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        with open(f"/proc/{entry}/stat") as f:
          ppid = int(f.read().rsplit(")", 1)[1].split()[1])
      except OSError:
        continue
      children.setdefault(ppid, []).append(int(entry))
  total, stack = 0, [pid]
  while stack:
    p = stack.pop()
    stack += children.get(p, [])
    try:
      with open(f"/proc/{p}/status") as f:
        total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
      pass
  return total / 1024


async def _bench_world(world: str, server: LocalEnvServer, row: dict, actions: list) -> dict:
  manager = EnvManager([server.address], acquire_timeout_s=900)
  rss_idle = _tree_rss_mib(server.process.pid)
  t0 = time.perf_counter()
  env = await manager.acquire(world, "bench-0")  # starts the instance (lazy pool)
  await env.reset(row)
  first_reset_s = time.perf_counter() - t0
  rss_one = _tree_rss_mib(server.process.pid)
  resets = []
  for _ in range(FLAGS.num_resets):
    t0 = time.perf_counter()
    await env.reset(row)
    resets.append(time.perf_counter() - t0)
  steps = []
  n = FLAGS.num_steps // (4 if world == "scienceworld" else 1)
  for i in range(n):
    if i % 20 == 0:
      await env.reset(row)  # stay clear of step limits / episode ends
    t0 = time.perf_counter()
    result = await env.step(actions[i % len(actions)])
    steps.append(time.perf_counter() - t0)
    assert "error" not in result.info, result
  envs = [env]  # memory: hold `instances` instances, each with a loaded episode
  for k in range(1, INSTANCES[world]):
    other = await manager.acquire(world, f"bench-{k}")
    await other.reset(row)
    envs.append(other)
  rss_loaded = _tree_rss_mib(server.process.pid)
  for k in range(len(envs)):
    await manager.release(world, f"bench-{k}")
  await manager.aclose()
  per_instance = max(rss_loaded - rss_one, 0.0) / (len(envs) - 1)
  return {
    "first_reset_s": first_reset_s,
    "reset": _percentiles(resets),
    "step": _percentiles(steps),
    "instances": len(envs),
    "rss_idle_mib": rss_idle,
    "rss_one_mib": rss_one,
    "rss_loaded_mib": rss_loaded,
    "mib_first_instance": rss_one - rss_idle,
    "mib_per_instance": per_instance,
    "instances_per_gib": 1024 / per_instance if per_instance > 0 else float("inf"),
  }


def _markdown(report: dict) -> str:
  lines = [
    f"# bench_envservers_worlds ({report['date']})",
    "",
    f"Machine: {report['machine']}, Python {report['python']}",
    "",
    "| world | first reset (start + load) | warm reset p50 | step p50 / p99 | MiB first "
    "instance | MiB each further | instances per GiB |",
    "|---|---|---|---|---|---|---|",
  ]
  for world, r in report["worlds"].items():
    lines.append(
      f"| {world} | {r['first_reset_s']:.2f} s | {r['reset']['p50_ms']:.1f} ms | "
      f"{r['step']['p50_ms']:.2f} / {r['step']['p99_ms']:.2f} ms | "
      f"{r['mib_first_instance']:.1f} | {r['mib_per_instance']:.1f} | "
      f"{r['instances_per_gib']:.1f} |"
    )
  lines += [
    "",
    "Memory: resident memory of the server's process tree (server, workers, JVMs). "
    "'First instance' = with one instance loaded minus the idle server (includes what "
    "instances share: webshop's catalog + BM25 index); 'each further' = the growth per "
    "extra loaded instance, which gives instances per GiB. textworld and scienceworld "
    "run a worker process per instance, scienceworld with its own JVM.",
    "",
    "Latencies on a machine shared with other jobs are upper bounds; compare worlds only within one run.",
  ]
  return "\n".join(lines) + "\n"


def main(argv):
  del argv
  load_start = os.getloadavg()[0]
  report = {
    "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    "machine": f"{platform.machine()}, {cpu_name()}",
    "python": platform.python_version(),
    "worlds": {},
  }
  with tempfile.TemporaryDirectory() as cache:
    for world in FLAGS.worlds:
      row, actions = _world_setup(world, cache)
      server = LocalEnvServer([f"{world}={INSTANCES[world]}:0"], start_timeout_s=120)
      try:
        report["worlds"][world] = trio.run(_bench_world, world, server, row, actions)
      finally:
        server.stop()
      print(world, json.dumps(report["worlds"][world]), flush=True)
  report["load_average"] = os.getloadavg()[0]
  report["machine"] += f", {load_note(load_start)}"
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  with open(os.path.join(FLAGS.out_dir, "bench_envservers_worlds.json"), "w") as f:
    json.dump(report, f, indent=1)
  with open(os.path.join(FLAGS.out_dir, "bench_envservers_worlds.md"), "w") as f:
    f.write(_markdown(report))
  print(_markdown(report))


if __name__ == "__main__":
  app.run(main)

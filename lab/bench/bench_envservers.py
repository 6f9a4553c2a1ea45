"""Env-server benchmark: no-op call latency, 1,024 concurrent I/O-bound chains, sandbox calls.

    .venv/bin/python lab/bench/bench_envservers.py [--num_chains=1024 --io_call_s=0.1]

Starts one local env server (a subprocess on loopback) and measures, from this process:
- no-op latency: sequential `echo` steps on one connection (p50/p99), raw client and through
  EnvManager (the trainer's path);
- concurrency: `num_chains` chains (EnvManager, one connection) each doing one `sleep` step of
  `io_call_s` at once; goal wall <= 2x one call;
- sandbox: sequential `python_sandbox` steps running a small statement (p50/p99; goal p50 <=
  50 ms), and the start time of a fresh sandbox instance (bwrap + interpreter).
Writes JSON and a markdown table to --out_dir.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import sys
import time

from absl import app, flags


import trio  # noqa: E402

from agentfly_jax.envs import EnvManager, LocalEnvServer  # noqa: E402
from bench_common import cpu_name, load_note  # noqa: E402
from envservers.client import Connection  # noqa: E402
from bench_common import RESULTS_DIR  # this folder is on sys.path: the script's own

FLAGS = flags.FLAGS
flags.DEFINE_integer("num_noop_calls", 2000, "sequential no-op calls")
flags.DEFINE_integer("num_chains", 1024, "concurrent chains for the I/O-bound test")
flags.DEFINE_float("io_call_s", 0.1, "duration of each I/O-bound call")
flags.DEFINE_integer("io_rounds", 5, "repetitions of the concurrent round (best and median reported)")
flags.DEFINE_integer("num_sandbox_calls", 300, "sequential sandbox calls")
flags.DEFINE_integer("num_sandbox_starts", 8, "fresh sandbox instances timed")
flags.DEFINE_string("out_dir", RESULTS_DIR, "where bench_envservers.{json,md} go")


def _percentiles(samples_s: list[float]) -> dict[str, float]:
  ordered = sorted(samples_s)

  def pct(p):
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))] * 1e3

  return {"p50_ms": pct(50), "p99_ms": pct(99), "mean_ms": statistics.fmean(ordered) * 1e3, "n": len(ordered)}


def _process_cpu_s(pid: int) -> float:
  """user + system CPU seconds of another process (from /proc)."""
  with open(f"/proc/{pid}/stat") as f:
    fields = f.read().rsplit(")", 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


async def _bench(address: str, server_pid: int) -> dict:
  results = {}
  # 1. no-op latency, raw client.
  conn = await Connection.open(address)
  args = {"env": "echo", "chain_id": "noop"}
  await conn.call("acquire", args)
  for _ in range(50):
    await conn.call("step", {**args, "action": ""})
  samples = []
  for _ in range(FLAGS.num_noop_calls):
    start = time.perf_counter()
    await conn.call("step", {**args, "action": ""})
    samples.append(time.perf_counter() - start)
  results["noop_raw"] = _percentiles(samples)
  # 1b. through EnvManager / RemoteEnv.step.
  manager = EnvManager([address], acquire_wait_s=5.0)
  env = await manager.acquire("echo", "noop-manager")
  samples = []
  for _ in range(FLAGS.num_noop_calls):
    start = time.perf_counter()
    await env.step("")
    samples.append(time.perf_counter() - start)
  results["noop_manager"] = _percentiles(samples)
  # 2. concurrent I/O-bound chains.
  n = FLAGS.num_chains
  start = time.perf_counter()
  envs = [None] * n

  async def acquire(i):
    envs[i] = await manager.acquire("sleep", f"io-{i}")

  async with trio.open_nursery() as nursery:
    for i in range(n):
      nursery.start_soon(acquire, i)
  acquire_wall = time.perf_counter() - start
  walls, server_cpu, client_cpu = [], [], []
  for _ in range(FLAGS.io_rounds):
    server_before, client_before = _process_cpu_s(server_pid), _own_cpu_s()
    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
      for e in envs:
        nursery.start_soon(e.step, {"sleep_s": FLAGS.io_call_s})
    walls.append(time.perf_counter() - start)
    server_cpu.append(_process_cpu_s(server_pid) - server_before)
    client_cpu.append(_own_cpu_s() - client_before)
  results["concurrent_io"] = {
    "chains": n,
    "call_s": FLAGS.io_call_s,
    "acquire_all_wall_s": acquire_wall,
    "wall_s_best": min(walls),
    "wall_s_median": statistics.median(walls),
    "wall_over_call_best": min(walls) / FLAGS.io_call_s,
    "wall_over_call_median": statistics.median(walls) / FLAGS.io_call_s,
    "server_cpu_us_per_call": statistics.median(server_cpu) / n * 1e6,
    "client_cpu_us_per_call": statistics.median(client_cpu) / n * 1e6,
    "goal": "wall <= 2x one call",
  }
  async with trio.open_nursery() as nursery:
    for i in range(n):
      nursery.start_soon(manager.release, "sleep", f"io-{i}")
  # 3. sandbox calls.
  sandbox = await manager.acquire("python_sandbox", "bench")
  await sandbox.step("x = 0")
  samples = []
  for _ in range(FLAGS.num_sandbox_calls):
    start = time.perf_counter()
    result = await sandbox.step("x += 1")
    samples.append(time.perf_counter() - start)
    assert result.observation == "", result.observation
  assert (await sandbox.step("print(x)")).observation == f"{FLAGS.num_sandbox_calls}\n"
  results["sandbox_call"] = {**_percentiles(samples), "goal": "p50 <= 50 ms"}
  results["server_stats"] = (await manager.server_stats())[address]["pools"]
  await manager.aclose()
  await conn.aclose()
  return results


async def _trio_floor() -> dict:
  """Context for the concurrency goal: the same number of tasks each sleeping io_call_s inside a
  cancel scope, in this process, no server, no network (what trio itself costs here)."""

  async def one():
    with trio.move_on_after(60):
      await trio.sleep(FLAGS.io_call_s)

  walls = []
  for _ in range(FLAGS.io_rounds):
    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
      for _ in range(FLAGS.num_chains):
        nursery.start_soon(one)
    walls.append(time.perf_counter() - start)
  return {"wall_s_best": min(walls), "wall_s_median": statistics.median(walls)}


async def _sandbox_starts() -> dict:
  from envservers.envs.python_sandbox import PythonSandbox

  samples = []
  for _ in range(FLAGS.num_sandbox_starts):
    env = PythonSandbox()
    start = time.perf_counter()
    await env.start()
    samples.append(time.perf_counter() - start)
    await env.close()
  return _percentiles(samples)


def _markdown(report: dict) -> str:
  r = report["results"]
  io = r["concurrent_io"]
  rows = [
    (
      "no-op call latency, raw client (p50 / p99)",
      f"{r['noop_raw']['p50_ms']:.3f} / {r['noop_raw']['p99_ms']:.3f} ms",
      "—",
    ),
    (
      "no-op call latency, EnvManager (p50 / p99)",
      f"{r['noop_manager']['p50_ms']:.3f} / {r['noop_manager']['p99_ms']:.3f} ms",
      "—",
    ),
    (
      f"{io['chains']} concurrent chains x {io['call_s'] * 1e3:.0f} ms I/O call: wall (best / median)",
      f"{io['wall_s_best'] * 1e3:.0f} / {io['wall_s_median'] * 1e3:.0f} ms "
      f"({io['wall_over_call_best']:.2f}x / {io['wall_over_call_median']:.2f}x one call)",
      "≤ 2x one call",
    ),
    (
      f"context: {io['chains']} bare trio tasks sleeping {io['call_s'] * 1e3:.0f} ms, no server (best / median)",
      f"{r['trio_floor']['wall_s_best'] * 1e3:.0f} / {r['trio_floor']['wall_s_median'] * 1e3:.0f} ms",
      "—",
    ),
    (
      "CPU per concurrent call: server / client (median round)",
      f"{io['server_cpu_us_per_call']:.0f} / {io['client_cpu_us_per_call']:.0f} µs",
      "—",
    ),
    (f"acquire {io['chains']} envs (lazy scale-up)", f"{io['acquire_all_wall_s'] * 1e3:.0f} ms", "—"),
    (
      "sandbox call `x += 1` (p50 / p99)",
      f"{r['sandbox_call']['p50_ms']:.2f} / {r['sandbox_call']['p99_ms']:.2f} ms",
      "p50 ≤ 50 ms",
    ),
    ("fresh sandbox start, bwrap + interpreter (p50)", f"{r['sandbox_start']['p50_ms']:.0f} ms", "—"),
  ]
  lines = [
    f"# bench_envservers ({report['date']})",
    "",
    f"Machine: {report['machine']}",
    "",
    "| measurement | result | goal |",
    "|---|---|---|",
  ]
  lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
  return "\n".join(lines) + "\n"


def main(argv):
  load_start = os.getloadavg()[0]
  del argv
  server = LocalEnvServer(["echo=4:2", f"sleep={FLAGS.num_chains}:0", "python_sandbox=2:1"])
  try:
    results = trio.run(_bench, server.address, server.process.pid)
  finally:
    server.stop()
  results["sandbox_start"] = trio.run(_sandbox_starts)
  results["trio_floor"] = trio.run(_trio_floor)
  report = {
    "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    "machine": f"{platform.machine()}, {cpu_name()}, {load_note(load_start)}, Python {platform.python_version()}",
    "flags": {
      k: FLAGS[k].value for k in ("num_noop_calls", "num_chains", "io_call_s", "io_rounds", "num_sandbox_calls")
    },
    "results": results,
  }
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  with open(os.path.join(FLAGS.out_dir, "bench_envservers.json"), "w") as f:
    json.dump(report, f, indent=2)
  markdown = _markdown(report)
  with open(os.path.join(FLAGS.out_dir, "bench_envservers.md"), "w") as f:
    f.write(markdown)
  print(markdown)


if __name__ == "__main__":
  app.run(main)

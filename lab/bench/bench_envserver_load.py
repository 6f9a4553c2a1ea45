"""Load run of one env server: many concurrent chains on a capped sandbox pool.

    .venv/bin/python lab/bench/bench_envserver_load.py [--num_chains=1024 --cap=16 \
        --duration_s=120]

Starts `python -m envservers --env python_sandbox=CAP:2` and runs `num_chains` chains at once
through one EnvManager for `duration_s`: each chain repeatedly acquires a sandbox (waiting,
backing off while all CAP are in use), resets it, runs two statements that depend on each other
(checking the printed result), and releases it; at the end, chains still waiting for a sandbox
cancel their acquire (which must not leak what the server binds late). Checks and reports:
- no deadlock: every chain finishes, and episodes complete in every 10 s window;
- no leaks: the server's processes and pool instances after the run equal those before it, and
  nothing stays bound;
- stats consistent: acquires == releases, live <= cap at every sample;
- server memory: RSS sampled every second (first, last, peak; VmHWM as the kernel's peak).
Writes bench_envserver_load.{json,md} to --out_dir.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time

from absl import app, flags


import trio  # noqa: E402

from agentfly_jax.envs import EnvManager, LocalEnvServer  # noqa: E402
from bench_common import RESULTS_DIR  # this folder is on sys.path: the script's own

FLAGS = flags.FLAGS
flags.DEFINE_integer("num_chains", 1024, "chains running at once")
flags.DEFINE_float("sample_s", 1.0, "seconds between the monitor's samples of the pool and the server's RSS")
flags.DEFINE_integer("cap", 16, "python_sandbox instances the server may run at once")
flags.DEFINE_float("duration_s", 120.0, "how long chains keep starting episodes")
flags.DEFINE_string("machine", "2-core CPU shared with other jobs", "what ran it (goes into the report)")
flags.DEFINE_string("out_dir", RESULTS_DIR, "where bench_envserver_load.{json,md} go")


def _descendants(pid: int) -> list[int]:
  """Every process below `pid` (children, grandchildren, ...), from /proc."""
  parents = {}
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        with open(f"/proc/{entry}/stat") as f:
          parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
      except (OSError, IndexError, ValueError):
        pass
  found, frontier = [], [pid]
  while frontier:
    parent = frontier.pop()
    children = [p for p, pp in parents.items() if pp == parent]
    found += children
    frontier += children
  return found


def _memory_kib(pid: int) -> dict[str, int]:
  with open(f"/proc/{pid}/status") as f:
    fields = dict(line.split(":", 1) for line in f if ":" in line)
  return {key: int(fields[key].split()[0]) for key in ("VmRSS", "VmHWM")}


async def _settled_stats(manager: EnvManager, address: str, warm: int) -> dict:
  """The pool's stats once released instances have been replaced (at most 60 s)."""
  with trio.move_on_after(60):
    while True:
      stats = (await manager.server_stats())[address]
      pool = stats["pools"]["python_sandbox"]
      if pool["in_use"] == 0 and pool["chains"] == 0 and pool["starting"] == 0 and pool["live"] == pool["idle"] == warm:
        return stats
      await trio.sleep(0.5)
  return stats


async def _load(address: str, server_pid: int, warm: int) -> dict:
  manager = EnvManager([address], token=None, acquire_timeout_s=3600, acquire_wait_s=0.5)
  before = await _settled_stats(manager, address, warm)
  processes_before = len(_descendants(server_pid))
  memory, samples, episodes, wrong, errors = [], [], [0], [0], []
  windows: list[int] = []
  rss_per_window: list[int] = []
  deadline = time.monotonic() + FLAGS.duration_s
  trio_deadline = trio.current_time() + FLAGS.duration_s

  async def chain(i: int) -> None:
    n = 0
    while time.monotonic() < deadline:
      chain_id = f"load{i}-{n}"
      with trio.move_on_at(trio_deadline):  # stop waiting at the end (nothing may leak)
        env = await manager.acquire("python_sandbox", chain_id)
      if time.monotonic() >= deadline:
        await manager.release("python_sandbox", chain_id)
        return
      try:
        await env.reset(None)
        first = await env.step(f"x = {i} + {n}")
        second = await env.step("print(x * 2)")
        if "Error" in first.observation or "Error" in second.observation:
          errors.append(second.observation[:200])
        elif second.observation.strip() != str((i + n) * 2):
          wrong[0] += 1
      finally:
        await manager.release("python_sandbox", chain_id)
      episodes[0] += 1
      n += 1

  async def monitor(done: trio.Event) -> None:
    last, window_end = 0, time.monotonic() + 10
    while not done.is_set():
      memory.append(_memory_kib(server_pid)["VmRSS"])
      if time.monotonic() >= window_end:  # a 10 s window ended: episodes in it, RSS at its end
        windows.append(episodes[0] - last)
        rss_per_window.append(memory[-1])
        last, window_end = episodes[0], window_end + 10
      stats = (await manager.server_stats())[address]["pools"]["python_sandbox"]
      samples.append({k: stats[k] for k in ("live", "in_use", "idle", "starting")})
      with trio.move_on_after(FLAGS.sample_s):
        await done.wait()

  start = time.monotonic()
  done = trio.Event()
  async with trio.open_nursery() as outer:
    outer.start_soon(monitor, done)
    with trio.fail_after(FLAGS.duration_s + 600):  # a deadlock fails here
      async with trio.open_nursery() as chains:
        for i in range(FLAGS.num_chains):
          chains.start_soon(chain, i)
    wall = time.monotonic() - start
    done.set()
  after = await _settled_stats(manager, address, warm)
  processes_after = len(_descendants(server_pid))
  await manager.aclose()
  pool_before, pool_after = before["pools"]["python_sandbox"], after["pools"]["python_sandbox"]
  return {
    "num_chains": FLAGS.num_chains,
    "cap": FLAGS.cap,
    "duration_s": FLAGS.duration_s,
    "wall_s": wall,
    "episodes": episodes[0],
    "episodes_per_s": episodes[0] / wall,
    "episodes_per_10s_window": windows,
    "wrong_results": wrong[0],
    "error_observations": len(errors),
    "error_examples": errors[:3],
    "max_live": max(s["live"] for s in samples),
    "max_in_use": max(s["in_use"] for s in samples),
    "processes_before": processes_before,
    "processes_after": processes_after,
    "instances_before": pool_before["live"],
    "instances_after": pool_after["live"],
    "acquires": pool_after["acquires"] - pool_before["acquires"],
    "releases": pool_after["releases"] - pool_before["releases"],
    "bound_after": pool_after["chains"],
    "peak_live": pool_after["peak_live"],
    "server_errors": {k: after[k] for k in ("connection_errors", "internal_errors", "bad_frames")},
    "pool_counters": {k: pool_after[k] for k in ("crashes", "timeouts", "start_failures", "exhausted")},
    "rss_kib": {
      "first": memory[0],
      "last": memory[-1],
      "peak_sampled": max(memory),
      "second_half_peak": max(memory[len(memory) // 2 :]),
      "VmHWM": _memory_kib(server_pid)["VmHWM"],
      "every_10s": rss_per_window,
    },
    "manager": {k: v for k, v in manager.metrics().items() if not k.startswith("envs/alloc")},
  }


def _checks(r: dict) -> dict[str, bool]:
  return {
    "every chain finished (no deadlock)": r["wall_s"] < r["duration_s"] + 600,
    "episodes in every 10 s window": all(n > 0 for n in r["episodes_per_10s_window"]),
    "live <= cap at every sample": r["max_live"] <= r["cap"] and r["peak_live"] <= r["cap"],
    "pool saturated (in_use reached cap)": r["max_in_use"] == r["cap"],
    "acquires == releases": r["acquires"] == r["releases"] and r["bound_after"] == 0,
    "no leaked processes": r["processes_after"] == r["processes_before"],
    "no leaked instances": r["instances_after"] == r["instances_before"],
    "all results right": r["wrong_results"] == 0 and r["error_observations"] == 0,
    "no server errors": not any(r["server_errors"].values()),
  }


def _markdown(r: dict) -> str:
  rss = r["rss_kib"]
  lines = [
    "# Env-server load run",
    "",
    f"Machine: {r['machine']} ({r['platform']}, {r['cpus']} CPUs). One server "
    f"(`python_sandbox={r['cap']}:2`), {r['num_chains']} concurrent chains through one "
    f"EnvManager for {r['duration_s']:g} s; each episode = acquire, reset, 2 dependent "
    f"statements (result checked), release (a released sandbox is closed and replaced).",
    "",
    "| measure | value |",
    "|---|---|",
    f"| wall | {r['wall_s']:.1f} s |",
    f"| episodes | {r['episodes']} ({r['episodes_per_s']:.1f}/s) |",
    f"| episodes per 10 s window (min / max) | {min(r['episodes_per_10s_window'] or [0])} / "
    f"{max(r['episodes_per_10s_window'] or [0])} |",
    f"| acquires / releases | {r['acquires']} / {r['releases']} (of which "
    f"{r['manager']['envs/abandoned_acquires']:.0f} cancelled at the end, bound late, "
    f"released) |",
    f"| max live / in use (cap) | {r['max_live']} / {r['max_in_use']} ({r['cap']}) |",
    f"| server processes before / after | {r['processes_before']} / {r['processes_after']} |",
    f"| pool instances before / after | {r['instances_before']} / {r['instances_after']} |",
    f"| server RSS first / last / sampled peak | {rss['first'] / 1024:.1f} / "
    f"{rss['last'] / 1024:.1f} / {rss['peak_sampled'] / 1024:.1f} MiB |",
    f"| server RSS peak, second half / VmHWM | {rss['second_half_peak'] / 1024:.1f} / {rss['VmHWM'] / 1024:.1f} MiB |",
    f"| server RSS at the end of each 10 s window | {' '.join(f'{k / 1024:.1f}' for k in rss['every_10s'])} MiB |",
    f"| wrong results / error observations | {r['wrong_results']} / {r['error_observations']} |",
    f"| manager back-off total | {r['manager']['envs/backoff_s']:.0f} s over "
    f"{r['manager']['envs/acquire_retries']:.0f} retries |",
    "",
    "| check | held |",
    "|---|---|",
    *[f"| {name} | {'yes' if held else '**no**'} |" for name, held in r["checks"].items()],
  ]
  return "\n".join(lines) + "\n"


def main(argv):
  del argv
  warm = min(FLAGS.cap, 2)
  server = LocalEnvServer([f"python_sandbox={FLAGS.cap}:{warm}"])
  try:
    report = trio.run(_load, server.address, server.process.pid, warm)
  finally:
    server.stop()
  report.update(
    machine=FLAGS.machine,
    platform=platform.platform(),
    cpus=os.cpu_count(),
    date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    load_average_at_end=os.getloadavg()[0],
  )
  report["checks"] = _checks(report)
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  text = _markdown(report)
  for suffix, content in (("json", json.dumps(report, indent=2)), ("md", text)):
    with open(os.path.join(FLAGS.out_dir, f"bench_envserver_load.{suffix}"), "w") as f:
      f.write(content)
  print(text)
  return 0 if all(report["checks"].values()) else 1


if __name__ == "__main__":
  app.run(main)

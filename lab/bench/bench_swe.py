"""The `swe` env: episode start, hidden-test grading, and 64 concurrent episodes on one server.

    .venv/bin/python lab/bench/bench_swe.py [--episodes=40] [--concurrent=64]

One local env server (a subprocess on loopback), driven from this process through EnvManager
(the trainer's path), on the shipped test split:
- episode start: acquire + reset of a fresh chain (the repository copied into a sandbox the
  pool started ahead), p50 / p90; also a cold sandbox start (bwrap + driver) in this process.
  Reference in the same run: `cp -a --reflink=auto` of the same repository to a tmpfs folder.
- hidden-test reward: `submit` after the expert's fix (archive out, grading sandbox, pytest),
  p50 / p90 over the tasks. Reference: the same pytest command on the host, no sandbox.
- 64 concurrent episodes: 64 chains each hold an instance with its repository loaded and run a
  command; peak PSS / RSS of the server's process tree (server + every sandbox) and the memory
  cgroups' usage (tmpfs files included) where the server makes them.
Writes --out.json and --out.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

from absl import app, flags

import numpy as np
import trio

from agentfly_jax.envs.local_server import LocalEnvServer
from agentfly_jax.envs.manager import EnvManager
from envservers.envs import memory_cgroup, swe_policies, swe_tasks
from envservers.envs.swe import SweEnv
from bench_common import load_note  # this folder is on sys.path: the script's own
from bench_machine import machine, write_results

FLAGS = flags.FLAGS
flags.DEFINE_integer("episodes", 40, "episode starts timed")
flags.DEFINE_integer("concurrent", 64, "concurrent episodes on one server")
flags.DEFINE_integer("tasks", 0, "test-split tasks graded (the first N; 0 = all)")
flags.DEFINE_integer("cold_starts", 10, "cold sandbox starts timed in this process")
flags.DEFINE_string("out", "lab/results/bench_swe", "output path without extension")


def _pct(xs) -> dict:
  return {"p50_ms": 1000 * float(np.percentile(xs, 50)), "p90_ms": 1000 * float(np.percentile(xs, 90)), "n": len(xs)}


def _tree(pid: int) -> list[int]:
  return memory_cgroup.process_tree(pid)


def _tree_memory_mib(pid: int) -> dict:
  """Sum of PSS and of RSS over the process tree (MiB)."""
  pss = rss = 0
  for p in _tree(pid):
    try:
      with open(f"/proc/{p}/smaps_rollup") as f:
        for line in f:
          if line.startswith("Pss:"):
            pss += int(line.split()[1])
          elif line.startswith("Rss:"):
            rss += int(line.split()[1])
    except OSError:
      pass
  return {"pss_mib": pss / 1024, "rss_mib": rss / 1024, "processes": len(_tree(pid))}


def _cgroups_mib(server_pid: int) -> float | None:
  parent = memory_cgroup._parent_dir()
  if parent is None:
    return None
  total = 0
  for name in os.listdir(parent):
    if name.startswith(f"agentfly-sandbox-{server_pid}-"):
      try:
        with open(os.path.join(parent, name, "memory.usage_in_bytes")) as f:
          total += int(f.read())
      except OSError:
        pass
  return total / (1 << 20)


def reference_copy(repo: str, n: int) -> list[float]:
  """`cp -a --reflink=auto` of the repository to a fresh /dev/shm folder, n times."""
  times = []
  with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as tmp:
    for i in range(n):
      started = time.perf_counter()
      subprocess.run(["cp", "-a", "--reflink=auto", repo, os.path.join(tmp, str(i))], check=True)
      times.append(time.perf_counter() - started)
  return times


def reference_pytest(task_id: str) -> float:
  """The grading pytest command on the host (the fixed repository, i.e. the clean one, copied;
  the task's hidden tests; no sandbox): seconds."""
  task = swe_tasks.resolve_row({"task_id": task_id})
  with tempfile.TemporaryDirectory() as tmp:
    repo = os.path.join(tmp, "repo")
    subprocess.run(["cp", "-a", task.repo, repo], check=True)
    env = dict(os.environ, PYTHONPATH=repo, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", PYTHONDONTWRITEBYTECODE="1")
    tests = [os.path.join(task.hidden_tests, node) for node in task.selected_tests]
    started = time.perf_counter()
    subprocess.run(
      [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-c",
        os.devnull,
        "--rootdir",
        repo,
        "--import-mode=importlib",
        f"--junitxml={tmp}/junit.xml",
        *(tests or [task.hidden_tests]),
      ],
      cwd=repo,
      env=env,
      capture_output=True,
      check=False,
    )
    return time.perf_counter() - started


async def episode_starts(manager: EnvManager, task_ids: list[str], n: int) -> list[float]:
  times = []
  for i in range(n):
    chain = f"start-{i}"
    started = time.perf_counter()
    env = await manager.acquire("swe", chain)
    await env.reset({"task_id": task_ids[i % len(task_ids)]})
    times.append(time.perf_counter() - started)
    await manager.release("swe", chain)
    await trio.sleep(0.05)  # the pool starts the next warm sandbox meanwhile, as in training
  return times


async def grading(manager: EnvManager, task_ids: list[str]) -> tuple[list[float], list[float]]:
  times, rewards = [], []
  for task_id in task_ids:
    chain = f"grade-{task_id}"
    env = await manager.acquire("swe", chain)
    await env.reset({"task_id": task_id})
    expert = swe_policies.ScriptedExpert(swe_tasks.shipped_task_meta(task_id))
    observation = ""
    for _ in range(4):
      observation = (await env.step(expert.act(observation))).observation
    started = time.perf_counter()
    out = await env.step(expert.act(observation))
    times.append(time.perf_counter() - started)
    rewards.append(out.reward)
    await manager.release("swe", chain)
  return times, rewards


async def concurrent_episodes(manager: EnvManager, server: LocalEnvServer, task_ids: list[str], n: int) -> dict:
  peak = {"pss_mib": 0.0, "rss_mib": 0.0, "processes": 0}
  peak_cgroups = [0.0]
  done = trio.Event()
  outputs = []

  async def sample():
    while not done.is_set():
      now = _tree_memory_mib(server.process.pid)
      for key in peak:
        peak[key] = max(peak[key], now[key])
      cg = _cgroups_mib(server.process.pid)
      if cg is not None:
        peak_cgroups[0] = max(peak_cgroups[0], cg)
      await trio.sleep(0.2)

  held = trio.Semaphore(0)

  async def chain(i):
    env = await manager.acquire("swe", f"conc-{i}")
    await env.reset({"task_id": task_ids[i % len(task_ids)]})
    out = await env.step({"action": "bash", "command": "python -m pytest -q 2>&1 | tail -1"})
    outputs.append(out.observation)
    held.release()

  started = time.perf_counter()
  async with trio.open_nursery() as nursery:
    nursery.start_soon(sample)
    async with trio.open_nursery() as chains:
      for i in range(n):
        chains.start_soon(chain, i)
    wall = time.perf_counter() - started
    held = _tree_memory_mib(server.process.pid)  # every episode loaded, between commands
    held_cgroups = _cgroups_mib(server.process.pid)
    stats = await manager.server_stats()
    await trio.sleep(0.5)  # one more sample with all n held
    done.set()
  for i in range(n):
    await manager.release("swe", f"conc-{i}")
  pool = next(iter(stats.values()))["pools"]["swe"]
  return {
    "episodes": n,
    "wall_s": wall,
    "peak_live": pool["peak_live"],
    "ran_tests": sum(1 for o in outputs if " in " in o),
    **{f"peak_{k}": v for k, v in peak.items()},
    **{f"held_{k}": v for k, v in held.items()},
    "held_cgroups_mib": held_cgroups,
    "peak_cgroups_mib": peak_cgroups[0] if memory_cgroup.available() else None,
  }


async def cold_starts(n: int) -> list[float]:
  times = []
  for _ in range(n):
    env = SweEnv()
    started = time.perf_counter()
    await env.start()
    times.append(time.perf_counter() - started)
    await env.close()
  return times


def main(argv):
  del argv
  load_start = os.getloadavg()[0]
  task_ids = swe_tasks.shipped_task_ids("test")[: FLAGS.tasks or None]
  result = {"machine": machine(), "tasks": len(task_ids)}
  cold = trio.run(cold_starts, FLAGS.cold_starts)
  server = LocalEnvServer([f"swe={FLAGS.concurrent}:2"])
  try:

    async def run():
      manager = EnvManager([server.address])
      starts = await episode_starts(manager, task_ids, FLAGS.episodes)
      grade_times, rewards = await grading(manager, task_ids)
      conc = await concurrent_episodes(manager, server, task_ids, FLAGS.concurrent)
      await manager.aclose()
      return starts, grade_times, rewards, conc

    starts, grade_times, rewards, conc = trio.run(run)
  finally:
    server.stop()
  copy = reference_copy(swe_tasks.resolve_row({"task_id": task_ids[0]}).repo, FLAGS.episodes)
  host = [reference_pytest(t) for t in task_ids]
  result.update(
    {
      "episode_start": _pct(starts),
      "cold_sandbox_start": _pct(cold),
      "reference_cp": _pct(copy),
      "grading": _pct(grade_times),
      "reference_host_pytest": _pct(host),
      "expert_reward_mean": float(np.mean(rewards)),
      "concurrent": conc,
      "load": load_note(load_start),
    }
  )
  s, g = result["episode_start"], result["grading"]
  md = [
    f"# swe env ({result['machine']}; {result['load']})",
    "",
    "| measure | p50 | p90 | reference (same run) | ratio p50 | goal |",
    "|---|---|---|---|---|---|",
    f"| episode start (acquire + reset, warm pool) | {s['p50_ms']:.1f} ms | {s['p90_ms']:.1f} ms "
    f"| cp -a to tmpfs {result['reference_cp']['p50_ms']:.1f} ms | "
    f"{s['p50_ms'] / result['reference_cp']['p50_ms']:.1f}x | <= 100 ms |",
    f"| cold sandbox start (bwrap + driver) | {result['cold_sandbox_start']['p50_ms']:.1f} ms | "
    f"{result['cold_sandbox_start']['p90_ms']:.1f} ms | | | |",
    f"| hidden-test reward (submit) | {g['p50_ms']:.0f} ms | {g['p90_ms']:.0f} ms | host pytest "
    f"{result['reference_host_pytest']['p50_ms']:.0f} ms | "
    f"{g['p50_ms'] / result['reference_host_pytest']['p50_ms']:.1f}x | <= 1000 ms |",
    "",
    f"Expert reward on the {len(task_ids)} test tasks: {result['expert_reward_mean']:.3f}.",
    "",
    f"{conc['episodes']} concurrent episodes on one server (each: repository loaded, pytest run; "
    f"{conc['ran_tests']} ran, {conc['wall_s']:.1f} s), memory of the server's process tree "
    f"(server + every sandbox; PSS counts shared pages once, the RSS sum counts them in "
    f"every process):",
    "",
    "| | PSS | RSS sum | processes | sandbox memory cgroups (tmpfs included) |",
    "|---|---|---|---|---|",
    f"| peak (while the 64 pytest runs overlap) | {conc['peak_pss_mib']:.0f} MiB | "
    f"{conc['peak_rss_mib']:.0f} MiB | {conc['peak_processes']} | "
    + (f"{conc['peak_cgroups_mib']:.0f} MiB" if conc["peak_cgroups_mib"] is not None else "n/a")
    + " |",
    f"| held (64 episodes loaded, between commands) | {conc['held_pss_mib']:.0f} MiB | "
    f"{conc['held_rss_mib']:.0f} MiB | {conc['held_processes']} | "
    + (f"{conc['held_cgroups_mib']:.0f} MiB" if conc["held_cgroups_mib"] is not None else "n/a")
    + " |",
    "",
    "Goal: 64 concurrent episodes within 2 GiB.",
    "",
  ]
  write_results(FLAGS.out, result, "\n".join(md))


if __name__ == "__main__":
  app.run(main)

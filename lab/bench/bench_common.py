"""Helpers shared by the benchmarks that time each engine in its own worker process
(bench_sampler.py, bench_train_step.py) and the profiles next to them.

    w = WorkerProcess([sys.executable, script, "--serve=..."], label="smollm2:jax", env=env)
    w.first          # the worker's first JSON line (its READY message)
    reply = w.ask("run 8")
    w.close()

A worker prints one JSON object per line on stdout (anything else there is skipped) and reads
one command per stdin line; its stderr goes to a temporary log, shown if it dies.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import tempfile
import time

LAB_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_ROOT = os.path.dirname(LAB_DIR)
RESULTS_DIR = os.path.join(LAB_DIR, "results")  # every benchmark writes its JSON + table here

# SmolLM2-135M's architecture (random-init benches and scaled-down A/Bs use it with fewer layers).
SMOLLM2_135M_SHAPES = dict(
  model_type="llama",
  vocab_size=49152,
  hidden_size=576,
  intermediate_size=1536,
  num_hidden_layers=30,
  num_attention_heads=9,
  num_key_value_heads=3,
  head_dim=64,
  rms_norm_eps=1e-5,
  rope_theta=100000.0,
  max_position_embeddings=8192,
  tie_word_embeddings=True,
)


# "jax+NAME" engines/frameworks run JAX with these XLA_FLAGS added (A/B of XLA:CPU's GEMM backends
# and scheduler); `xla_flags_env` builds the worker's environment.
XLA_CPU_VARIANTS = {
  "noynn": "--xla_cpu_experimental_ynn_fusion_type=",
  "onednn": "--xla_cpu_experimental_ynn_fusion_type= --xla_cpu_experimental_onednn_fusion_type=LIBRARY_FUSION_TYPE_DOT",
  "xnn": "--xla_cpu_experimental_ynn_fusion_type= --xla_cpu_experimental_xnn_fusion_type=LIBRARY_FUSION_TYPE_DOT",
  "conc": "--xla_cpu_enable_concurrency_optimized_scheduler=true",
  "noconc": "--xla_cpu_enable_concurrency_optimized_scheduler=false",
  "vw512": "--xla_cpu_prefer_vector_width=512",  # LLVM codegen of fusions with 512-bit vectors (default 256)
}


def xla_flags_env(variant: str, env: dict | None = None) -> dict:
  """A copy of `env` (default os.environ) with XLA_CPU_VARIANTS[variant]'s flags appended."""
  env = dict(os.environ if env is None else env)
  env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {XLA_CPU_VARIANTS[variant]}".strip()
  return env


class WorkerProcess:
  """Parent-side handle of a JSON-lines worker subprocess; `first` is its first reply."""

  def __init__(self, cmd: list[str], *, label: str, env: dict | None = None, close_timeout_s: float = 300):
    self.label = label
    self.close_timeout_s = close_timeout_s
    self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    self.proc = subprocess.Popen(
      cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, bufsize=1, env=env
    )
    self.first = self._read()

  def _read(self) -> dict:
    for line in self.proc.stdout:
      if line.startswith("{"):
        return json.loads(line)
    self.log.seek(0)
    raise RuntimeError(f"{self.label} worker died (exit {self.proc.wait()}):\n{self.log.read()[-3000:]}")

  def ask(self, command: str) -> dict:
    """Sends one command line; returns the worker's next JSON reply."""
    self.proc.stdin.write(command + "\n")
    self.proc.stdin.flush()
    return self._read()

  def close(self) -> None:
    if self.proc.poll() is None:
      self.proc.stdin.write("quit\n")
      self.proc.stdin.flush()
      self.proc.wait(timeout=self.close_timeout_s)
    os.unlink(self.log.name)


def cpu_name() -> str:
  """The CPU's model name (/proc/cpuinfo), else platform.processor()."""
  try:
    with open("/proc/cpuinfo") as f:
      return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
  except (OSError, StopIteration):
    return platform.processor() or platform.machine()


def load_note(load_start: float | None = None) -> str:
  """How busy the machine was, for a results file: the 1-minute load average against the CPU count
  (at the start when given, and now). Quiet: at most one runnable task above the CPU count (the
  benchmark itself may keep every core busy)."""
  cpus = os.cpu_count() or 1
  now = os.getloadavg()[0]
  loads = [now] if load_start is None else [load_start, now]
  state = "quiet" if max(loads) <= cpus + 1 else "shared with other jobs"
  span = " -> ".join(f"{x:.1f}" for x in loads)
  return f"{cpus} CPUs, {state} (load average {span})"


def measure_matmul_rate(n: int = 2048, reps: int = 5, dtype: str = "float32") -> float:
  """FLOP/s of an n x n `jnp.matmul` in `dtype` (jitted, best of reps)."""
  import jax
  import jax.numpy as jnp

  a = jax.random.normal(jax.random.key(0), (n, n), dtype)
  f = jax.jit(jnp.matmul)
  f(a, a).block_until_ready()
  best = float("inf")
  for _ in range(reps):
    t = time.perf_counter()
    f(a, a).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2 * n**3 / best

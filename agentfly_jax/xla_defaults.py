"""XLA flags the library sets by default (before JAX starts its backend), each measured.

    import agentfly_jax   # adds DEFAULT_XLA_FLAGS to $XLA_FLAGS unless the flag is already there

- `--xla_cpu_enable_concurrency_optimized_scheduler=false`: XLA:CPU's concurrency-optimized
  scheduler (its default) runs independent parts of a program side by side, which keeps both
  sets of temporaries alive. For the train step that costs memory and buys no speed: SmolLM2-135M
  B8xT256 on the project's 2-core CPU, PPO step (actor + critic) XLA temporaries 9.9 -> 4.6 GiB,
  peak RSS 13.99 -> 8.70 GiB (torch: 10.47); speed against torch's step: PPO 0.71x -> 0.67x,
  policy 0.77x -> 0.81x, CPU seconds equal, i.e. within run-to-run noise
  (lab/results/bench_train_step_ab_scheduler.md).

A flag the user already put in XLA_FLAGS (with any value) is left as it is; set
AGENTFLY_XLA_DEFAULTS=0 to add none. XLA aborts on a flag it does not know, so the flags are
added only for the jaxlib versions they were checked with (TESTED_JAXLIB; pinned: 0.10.2). The
flags apply only when this runs before JAX creates its CPU client (importing agentfly_jax before
running anything in JAX does that).
"""

from __future__ import annotations

import os

DEFAULT_XLA_FLAGS = ("--xla_cpu_enable_concurrency_optimized_scheduler=false",)
TESTED_JAXLIB = ((0, 10),)  # (major, minor) series the flags were checked with


def _jaxlib_series() -> tuple[int, int] | None:
  from importlib import metadata

  try:
    major, minor = metadata.version("jaxlib").split(".")[:2]
    return int(major), int(minor)
  except (metadata.PackageNotFoundError, ValueError):
    return None


def apply_default_xla_flags(environ=os.environ) -> list[str]:
  """Appends each default flag whose name is not in environ['XLA_FLAGS'] yet; returns those added."""
  if environ.get("AGENTFLY_XLA_DEFAULTS", "1").strip().lower() in ("0", "false", "off", "no"):
    return []
  if _jaxlib_series() not in TESTED_JAXLIB:
    return []
  current = environ.get("XLA_FLAGS", "")
  names = {part.split("=", 1)[0] for part in current.split()}
  added = [flag for flag in DEFAULT_XLA_FLAGS if flag.split("=", 1)[0] not in names]
  if added:
    environ["XLA_FLAGS"] = " ".join([current, *added]).strip()
  return added

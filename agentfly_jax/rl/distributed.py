"""Multi-host training: one JAX process per host, one global mesh over all their devices.

    initialize(coordinator_address="10.0.0.1:1234", num_processes=2, process_id=0)  # or from env
    rows = process_share(rows)               # this process rolls out its share of the step's rows
    trajs = gather_objects(local_trajs)      # every process then holds the global batch

Each process runs its own sampler on its local devices over its share of the rows; the
trajectories are gathered (small: token ids and floats), so every process builds the same global
arrays and the jitted prepare / train step run SPMD over the global mesh. Process 0 writes the
metrics and config files; checkpoints are written by orbax from all processes together.

Environment (when the arguments are not given): AGENTFLY_COORDINATOR_ADDRESS,
AGENTFLY_NUM_PROCESSES, AGENTFLY_PROCESS_ID. On CPU the cross-process collectives use gloo.
On Cloud TPU VMs (and other clusters JAX detects) `coordinator_address="auto"`: every worker runs
the same command and `jax.distributed.initialize()` reads the slice's topology from the TPU
environment (no process ids to give).
"""

from __future__ import annotations

import os
import pickle
from typing import Any, Sequence

import jax
import numpy as np

ENV_ADDRESS = "AGENTFLY_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "AGENTFLY_NUM_PROCESSES"
ENV_PROCESS_ID = "AGENTFLY_PROCESS_ID"


def _env_int(name: str) -> int | None:
  value = os.environ.get(name, "")
  if not value:
    return None
  try:
    return int(value)
  except ValueError:
    raise ValueError(f"environment variable {name}={value!r} must be an integer") from None


def initialize(
  coordinator_address: str | None = None, num_processes: int | None = None, process_id: int | None = None
) -> bool:
  """Starts `jax.distributed` when a coordinator is given (argument or environment); returns
  whether it did. Must run before anything touches a JAX device."""
  address = coordinator_address or os.environ.get(ENV_ADDRESS, "")
  if address == "auto":  # a TPU pod slice (or another cluster JAX detects): all from its environment
    jax.distributed.initialize()
    return True
  num = num_processes if num_processes is not None else _env_int(ENV_NUM_PROCESSES)
  pid = process_id if process_id is not None else _env_int(ENV_PROCESS_ID)
  if not address:
    if num not in (None, 1):
      raise ValueError(
        f"distributed: num_processes={num} needs a coordinator address (--coordinator_address or {ENV_ADDRESS})"
      )
    return False
  if num is None or pid is None:
    raise ValueError(
      f"distributed: coordinator {address!r} given but num_processes={num}, "
      f"process_id={pid}; set both (flags or {ENV_NUM_PROCESSES}/{ENV_PROCESS_ID})"
    )
  if not (num >= 1 and 0 <= pid < num):
    raise ValueError(f"distributed: process_id={pid} must be in [0, num_processes={num})")
  platforms = os.environ.get("JAX_PLATFORMS", "")
  if platforms in ("", "cpu") or platforms.startswith("cpu"):
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=address, num_processes=num, process_id=pid)
  return True


def is_primary() -> bool:
  """True on the process that writes metrics and config files."""
  return jax.process_index() == 0


def process_share(items: Sequence, what: str = "rollout.rows_per_step") -> list:
  """This process's contiguous share of `items` (len must divide evenly over the processes)."""
  n, count = len(items), jax.process_count()
  if n % count:
    raise ValueError(f"{what}={n} must be a multiple of the number of processes ({count})")
  per = n // count
  start = jax.process_index() * per
  return list(items[start : start + per])


def share_offset(n: int) -> int:
  """Index of this process's first item when n items are shared by `process_share`."""
  return jax.process_index() * (n // jax.process_count())


def gather_objects(local: list) -> list:
  """Concatenation over processes (in process order) of picklable lists; identity on one."""
  if jax.process_count() == 1:
    return list(local)
  from jax.experimental import multihost_utils

  payload = np.frombuffer(pickle.dumps(list(local)), np.uint8)
  sizes = multihost_utils.process_allgather(np.array([payload.size], np.int64))
  padded = np.zeros(int(sizes.max()), np.uint8)
  padded[: payload.size] = payload
  every = multihost_utils.process_allgather(padded)  # [P, max_size]
  out = []
  for p, size in enumerate(np.asarray(sizes).reshape(-1)):
    out.extend(pickle.loads(every[p, : int(size)].tobytes()))
  return out


def host_local(tree: Any) -> Any:
  """A copy of a tree of global arrays on this process's first device (for its own sampler);
  identity on one process."""
  if jax.process_count() == 1:
    return tree
  from jax.experimental import multihost_utils

  local = jax.local_devices()[0]
  host = multihost_utils.process_allgather(tree, tiled=True)
  return jax.device_put(host, local)


def barrier(name: str) -> None:
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(name)

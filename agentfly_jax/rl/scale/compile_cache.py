"""JAX's persistent compilation cache for training, evaluation and sweeps.

    cache_dir = enable_compile_cache(config.train.compile_cache)   # before the first jit

A SmolLM2 train step takes minutes to compile on a CPU and tens of seconds on a GPU; a sweep, a
resumed run or an `evaluate.py` after `train.py` compiles the same programs again. With the cache
on, XLA's executables are written to disk keyed by the program, the compile options, the
backend and the JAX version (JAX's own `jax_compilation_cache_dir`), so the second process
loads them instead of compiling.

`setting`:
  "auto"  $AGENTFLY_COMPILE_CACHE when set (a folder, or "off"), else xla/ under the project's
          cache root ($AGENTFLY_CACHE_DIR, else ~/.cache/agentfly_jax: where the BM25 indexes go)
  "off" / ""   no persistent cache (JAX's default)
  a path  that folder
"""

from __future__ import annotations

import os
import warnings

ENV_VAR = "AGENTFLY_COMPILE_CACHE"
OFF = ("", "off", "none", "0", "false")
# Programs that compile faster than this are not written (JAX's own default is 1 s; the
# trainer's small prepare/update programs of a tiny model take ~0.3-1 s and are worth keeping).
MIN_COMPILE_TIME_S = 0.3
# The folder is kept under this size, least recently used programs evicted first (JAX's LRU
# cache; with a limit, writes also take a file lock, so concurrent processes never collide).
MAX_CACHE_BYTES = 4 << 30


def resolve_compile_cache(setting: str) -> str | None:
  """The cache folder `setting` names (see the module doc), or None when the cache is off."""
  setting = (setting or "").strip()
  if setting.lower() == "auto":
    setting = os.environ.get(ENV_VAR, "").strip()
    if not setting:
      root = os.environ.get("AGENTFLY_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "agentfly_jax")
      setting = os.path.join(root, "xla")
  if setting.lower() in OFF:
    return None
  return os.path.abspath(os.path.expanduser(setting))


def enable_compile_cache(setting: str) -> str | None:
  """Points JAX's persistent compilation cache at the folder `setting` names (creating it);
  returns the folder, or None when off. A folder named explicitly that cannot be created or
  written raises ValueError naming it; with "auto" that only warns and runs without the cache
  (a read-only home must not stop a run that never asked for a cache)."""
  import jax

  folder = resolve_compile_cache(setting)
  if folder is None:
    return None
  problem = None
  try:
    os.makedirs(folder, exist_ok=True)
    if not os.access(folder, os.W_OK):
      problem = f"{folder} is not writable"
  except OSError as e:
    problem = f"cannot create {folder}: {e.strerror}"
  if problem is not None:
    if setting.strip().lower() == "auto":
      warnings.warn(
        f"compile cache off: {problem} (set {ENV_VAR} or train.compile_cache to a writable folder)", stacklevel=2
      )
      return None
    raise ValueError(f"train.compile_cache={setting!r}: {problem}")
  jax.config.update("jax_compilation_cache_dir", folder)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_TIME_S)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  try:
    import filelock  # noqa: F401  (JAX's LRU eviction needs it)

    jax.config.update("jax_compilation_cache_max_size", MAX_CACHE_BYTES)
  except ImportError:
    pass
  return folder

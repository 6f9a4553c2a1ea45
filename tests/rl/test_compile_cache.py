"""The persistent compilation cache (rl/scale/compile_cache.py): which folder a setting names, a second
process loads the program the first compiled (counted by JAX's own cache-hit events), and a
folder that cannot be used is a config error naming it."""

import os
import subprocess
import sys

import pytest

from agentfly_jax.rl.scale.compile_cache import ENV_VAR, resolve_compile_cache
from train_cli import ROOT


# Compiles one program (a few matmuls and a scan: slow enough to pass the cache's minimum
# compile time) and prints the cache hits and misses JAX recorded.
_PROGRAM = r"""
import sys
import jax, jax.numpy as jnp
from agentfly_jax.rl.scale.compile_cache import enable_compile_cache
events = []
jax.monitoring.register_event_listener(lambda name, **kw: events.append(name))
folder = enable_compile_cache(sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

@jax.jit
def f(x, w):
  def body(h, wi):
    return jnp.tanh(h @ wi) + h, None
  return jax.lax.scan(body, x, w)[0].sum()

x = jax.random.normal(jax.random.key(0), (16, 32))
w = jax.random.normal(jax.random.key(1), (6, 32, 32)) / 6
print(float(f(x, w)))
hits = sum(e == "/jax/compilation_cache/cache_hits" for e in events)
misses = sum(e == "/jax/compilation_cache/cache_misses" for e in events)
print(f"folder={folder} hits={hits} misses={misses}")
"""


def _run(setting: str, env: dict) -> tuple[float, dict]:
  """(the program's value, {"folder": ..., "hits": n, "misses": n}) of one process."""
  out = subprocess.run(
    [sys.executable, "-c", _PROGRAM, setting], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
  )
  assert out.returncode == 0, out.stderr[-3000:]
  value, summary = out.stdout.strip().splitlines()[-2:]
  fields = dict(part.split("=", 1) for part in summary.split())
  return float(value), {"folder": fields["folder"], "hits": int(fields["hits"]), "misses": int(fields["misses"])}


def test_settings_name_the_folder(tmp_path, monkeypatch):
  monkeypatch.setenv(ENV_VAR, str(tmp_path / "from_env"))
  assert resolve_compile_cache("auto") == str(tmp_path / "from_env")
  monkeypatch.setenv(ENV_VAR, "off")
  assert resolve_compile_cache("auto") is None
  monkeypatch.delenv(ENV_VAR)
  monkeypatch.setenv("AGENTFLY_CACHE_DIR", str(tmp_path / "root"))  # the project's cache root
  assert resolve_compile_cache("auto") == str(tmp_path / "root" / "xla")
  monkeypatch.delenv("AGENTFLY_CACHE_DIR")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  assert resolve_compile_cache("auto") == str(tmp_path / "home" / ".cache" / "agentfly_jax" / "xla")
  for off in ("", "off", "OFF", "none"):
    assert resolve_compile_cache(off) is None
  assert resolve_compile_cache(str(tmp_path / "mine")) == str(tmp_path / "mine")
  monkeypatch.chdir(tmp_path)
  assert resolve_compile_cache("rel/cache") == str(tmp_path / "rel" / "cache")


@pytest.mark.slow
def test_a_second_process_loads_what_the_first_compiled(tmp_path):
  env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
  env["JAX_PLATFORMS"] = "cpu"
  folder = tmp_path / "xla"
  first_value, first = _run(str(folder), env)
  assert first["folder"] == str(folder) and first["hits"] == 0 and first["misses"] >= 1, first
  assert len(list(folder.iterdir())) >= first["misses"], "the first process wrote no cache entries"
  second_value, second = _run(str(folder), env)  # every program (the jit and the RNG's) loaded
  assert second == {"folder": str(folder), "hits": first["misses"], "misses": 0}, (first, second)
  assert second_value == first_value
  _, off = _run("off", env)  # off: nothing read or written
  assert off == {"folder": "None", "hits": 0, "misses": 0}, off


def test_an_unusable_folder_is_a_config_error_unless_auto(tmp_path, monkeypatch):
  import jax

  from agentfly_jax.rl.scale.compile_cache import enable_compile_cache

  blocker = tmp_path / "a_file"
  blocker.write_text("not a folder")
  before = jax.config.jax_compilation_cache_dir
  with pytest.raises(ValueError, match="a_file"):  # named explicitly: an error naming it
    enable_compile_cache(str(blocker / "cache"))
  monkeypatch.setenv(ENV_VAR, str(blocker / "cache"))
  with pytest.warns(UserWarning, match="compile cache off.*a_file"):  # auto: a warning, no cache
    assert enable_compile_cache("auto") is None
  assert jax.config.jax_compilation_cache_dir == before  # the test run's cache untouched

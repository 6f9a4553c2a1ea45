"""`swe`: a software-engineering episode: a repository, a shell, file edits, hidden tests.

Each instance is one bubblewrap sandbox (the same walls as `python_sandbox`: no network, private
IPC/PID/UTS namespaces, read-only /usr and the server venv's packages, rlimits, a memory cgroup
where the server may make one, a uid of its own under root) running `swe_driver.py` as its pid 1.
The episode's repository is a fresh copy on a size-capped tmpfs at /repo, the only writable tree
besides a small /tmp: `reset(row)` sends the task's repository (a cached .tar.gz) into a sandbox
the pool started ahead, so two episodes never share a file; a shipped task's bug (one exact edit
of its clean repository) is made on that copy.

Actions (JSON objects; a plain string is a bash command):
  {"action": "bash", "command": str}                       runs `bash -c` in /repo
  {"action": "view", "path": str, "lines": [start, end]}   numbered lines (or a folder listing)
  {"action": "str_replace", "path": str, "old": str, "new": str}   one exact-match edit
  {"action": "submit"}                                     grades the repository; ends the episode
Every command's processes end with it; output past `max_output_bytes` keeps its head and tail
with a note. Errors (a bad action, `old` absent or ambiguous, a missing file) are observations.

Reward (`submit`, or the env reward `hidden_tests`): the fraction of the task's hidden tests that
pass (a shipped task's: the ones its bug breaks, selected by pytest node id). The repository is
archived out of the agent's sandbox (its processes killed first) into a second sandbox with the
same caps, and the hidden tests are copied in there, for that run only (they never exist in the
agent's sandbox); pytest runs there with its own config (`-c /dev/null`, no conftest, no cache,
a per-test time limit). The denominator is the larger of the tests pytest reports and the tests
asked for (the selected node ids, or every hidden test function counted statically), so code
that breaks collection scores 0, not 0/0. The code under test runs beside the tests, so a
repository written to fool pytest (rewriting its report) is not caught: this grades honest
attempts.

Rows: see swe_tasks.py (a shipped `task_id`, or SWE-Gym-style repo + problem_statement +
test_command + hidden_tests folders) and harbor_tasks.py (a Harbor task directory, graded by its
tests/test.sh).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shlex
import time
from typing import Any

import trio

from envservers import protocol
from envservers.env import EnvCrashed, ServerEnv, StepOutcome, env_reward
from envservers.envs import harbor_tasks, swe_tasks
from envservers.envs.bwrap import BwrapProcess, bwrap_args, default_python, driver_source
from envservers.process import exit_reason, wait_exit
from envservers.registry import register_env

_DRIVER_SOURCE = driver_source("swe_driver.py")
_MAX_FRAME = 96 << 20
HIDDEN_DIR = "/hidden_tests"
# The hidden tests to run follow it: the task's node ids under HIDDEN_DIR, or HIDDEN_DIR (all).
GRADE_COMMAND = (
  "python -m pytest -q -p no:cacheprovider --noconftest -c /dev/null "
  "--rootdir=/repo --import-mode=importlib -o junit_family=xunit1 "
  "--junitxml=/tmp/junit.xml"
)


def grade_command(test_timeout_s: float, site_packages: bool) -> str:
  """GRADE_COMMAND with a per-test time limit (pytest-timeout, when the sandbox can import it
  from the server venv): a test that hangs fails alone instead of stalling the whole run."""
  if test_timeout_s > 0 and site_packages and importlib.util.find_spec("pytest_timeout"):
    return GRADE_COMMAND.replace(" --junitxml", f" -p pytest_timeout --timeout={test_timeout_s:g} --junitxml")
  return GRADE_COMMAND


ACTIONS = ("bash", "view", "str_replace", "submit")


class Sandbox(BwrapProcess):
  """One bwrap process running the repository driver; `request` sends one op and waits."""

  def __init__(
    self,
    limits: dict,
    repo_mb: int,
    tmp_mb: int,
    python: str,
    site_packages: bool,
    use_cgroup: bool,
    grading: bool = False,
  ):
    self.limits, self.repo_mb, self.tmp_mb = limits, repo_mb, tmp_mb
    self.python, self.site_packages, self.use_cgroup = python, site_packages, use_cgroup
    self.grading = grading  # a grading sandbox has a /hidden_tests tmpfs for the tests
    self.process = self.stderr = self.cgroup = None
    self.reader: protocol.FrameReader | None = None

  def command(self) -> list[str]:
    """The command line: `sh` running bwrap as its child. With --as-pid-1 (the driver as the
    namespace's init, which the agent's `kill -9 -1` cannot reach), bwrap's --die-with-parent
    kills the sandbox when the *thread* that forked it exits, and trio forks from worker threads
    that exit after 10 s idle (a burst of sandboxes was SIGKILLed 10 s later; python_sandbox,
    without --as-pid-1, is not affected). A plain `sh` in between lives as long as the sandbox,
    and killing it (the pool's hard stop) still takes bwrap and everything inside down."""
    env = {
      "HOME": "/tmp",
      "PATH": "/opt/bin:/usr/local/bin:/usr/bin:/bin",
      "LANG": "C.UTF-8",
      "TERM": "dumb",
      "PYTHONIOENCODING": "utf-8",
      "PYTHONDONTWRITEBYTECODE": "1",
      "OPENBLAS_NUM_THREADS": "1",
      "OMP_NUM_THREADS": "1",
      "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    tmpfs = [("/dev/shm", self.tmp_mb), ("/tmp", self.tmp_mb), ("/repo", self.repo_mb)]
    mounts = ("--dir", "/opt/bin", "--symlink", self.python, "/opt/bin/python")
    if self.grading:  # + Harbor's paths: the tests also at /tests, a writable /logs
      tmpfs += [(HIDDEN_DIR, self.tmp_mb), ("/logs", 1)]
      mounts += ("--symlink", HIDDEN_DIR, "/tests")
    return [
      "/bin/sh",
      "-c",
      '"$@"; exit $?',
      "swe-sandbox",
      *bwrap_args(
        self.python,
        [self.python, "-I", "-S", "-c", _DRIVER_SOURCE, json.dumps(self.limits)],
        env=env,
        tmpfs=tmpfs,
        chdir="/repo",
        site_packages=self.site_packages,
        pythonpath=("/repo",),
        mounts=mounts,
        as_pid_1=True,
      ),
    ]

  async def start(self) -> None:
    await self.spawn(self.command(), "the swe env")
    self.reader = protocol.FrameReader(self.process.stdout, max_frame_bytes=_MAX_FRAME)
    with trio.fail_after(30):
      hello = await self._receive("start")
    if self.use_cgroup:  # the driver is ready and idle: before any command runs
      self.confine_memory((self.limits["memory_mb"] + self.repo_mb + 2 * self.tmp_mb) << 20)
    if not hello.get("ready"):
      raise EnvCrashed(f"swe driver sent {hello!r} instead of ready")

  @property
  def pid(self) -> int | None:
    return self.process.pid if self.process is not None else None

  def alive(self) -> bool:
    return self.process is not None and self.process.poll() is None

  async def _crashed(self, what: str) -> EnvCrashed:
    returncode = await wait_exit(self.process) if self.process is not None else None
    detail = self.stderr.tail() if self.stderr is not None else ""
    return EnvCrashed(
      f"the swe sandbox died during {what}: {exit_reason(returncode)}"
      + (f"; sandbox stderr: {detail}" if detail else "")
    )

  async def _receive(self, what: str) -> dict:
    body = await self.reader.read_reply()
    if body is None:
      raise await self._crashed(what)
    try:
      return json.loads(body)
    except ValueError:
      raise EnvCrashed("the swe sandbox sent a malformed reply") from None

  async def request(self, message: dict, timeout_s: float) -> dict:
    """Sends one op; EnvCrashed if the sandbox dies or does not answer within `timeout_s`."""
    if self.process is None:
      raise EnvCrashed("the swe sandbox is not running")
    try:
      await self.process.stdin.send_all(protocol.encode_frame(message, _MAX_FRAME))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
      raise await self._crashed(message["op"]) from None
    with trio.move_on_after(timeout_s):
      return await self._receive(message["op"])
    await self.close()
    raise EnvCrashed(f"the swe sandbox did not answer {message['op']!r} within {timeout_s:g} s and was killed")

  async def close(self) -> None:
    await self.stop()


def _positive(name: str, value: Any) -> None:
  if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
    raise ValueError(f"swe option {name!r} must be a positive number, got {value!r}")


def parse_lines(lines: Any) -> tuple[int, int | None]:
  """view's `lines`: None, [start, end], "start-end" or "start" -> (start, end or None);
  ValueError naming the argument."""
  if lines is None or lines == "" or lines == []:
    return 1, None
  if isinstance(lines, str):
    parts = lines.replace(":", "-").split("-")
    try:
      values = [int(p) for p in parts if p.strip()]
    except ValueError:
      values = []
  elif isinstance(lines, (list, tuple)):
    values = list(lines)
  elif isinstance(lines, int) and not isinstance(lines, bool):
    values = [lines]
  else:
    values = []
  if not 1 <= len(values) <= 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
    raise ValueError(f"argument 'lines' must be [start, end] or 'start-end' (1-based), got {lines!r}")
  start = values[0]
  end = values[1] if len(values) == 2 else None
  if start < 1 or (end is not None and 0 < end < start):
    raise ValueError(
      f"argument 'lines' {lines!r}: start must be >= 1 and end >= start (end -1 = to the end of the file)"
    )
  return start, end


@register_env
class SweEnv(ServerEnv):
  """Options (server flag `--env-opt swe.NAME=VALUE`):
  timeout_s: wall-clock limit of one command (default 30); cpu_s: its CPU seconds (30).
  grade_timeout_s: limit of the hidden-test run (default 120; a task's own, Harbor's [verifier] timeout_sec,
    replaces it when given, and a task asking for more is refused at reset); test_timeout_s: of one hidden
    test (default 10; 0 = none; needs pytest-timeout in the server venv). A task's own episode limit
    (Harbor's [agent] timeout_sec) ends its episode: the first step past it grades the repository as it is.
  memory_mb: address-space limit per process (default 1024); max_procs (default 64);
    max_open_files (default 256); file_size_mb: largest file (default 32).
  repo_mb / tmp_mb: sizes of the /repo and /tmp tmpfs (default 128 / 64); repo_archive_mb:
    largest packed repository sent in or out (default 32).
  max_output_bytes: a command's output keeps this much, head and tail (default 8192).
  max_file_bytes: largest file `view` / `str_replace` read (default 1 MiB).
  memory_cgroup: a memory cgroup of memory_mb + repo_mb + 2 * tmp_mb per sandbox where the
    server may create one (default true). python: the sandbox's interpreter.
  site_packages: expose the server venv's packages read-only (default true; pytest is there).
  """

  name = "swe"
  reusable = False  # a used sandbox holds an episode's files: never hand it to another chain

  def __init__(
    self,
    timeout_s: float = 30.0,
    cpu_s: float = 30.0,
    grade_timeout_s: float = 120.0,
    test_timeout_s: float = 10.0,
    memory_mb: int = 1024,
    max_procs: int = 64,
    max_open_files: int = 256,
    file_size_mb: int = 32,
    repo_mb: int = 128,
    tmp_mb: int = 64,
    repo_archive_mb: int = 32,
    max_output_bytes: int = 8192,
    max_file_bytes: int = 1 << 20,
    memory_cgroup: bool = True,
    python: str | None = None,
    site_packages: bool = True,
  ):
    numbers = dict(
      timeout_s=timeout_s,
      cpu_s=cpu_s,
      grade_timeout_s=grade_timeout_s,
      memory_mb=memory_mb,
      max_procs=max_procs,
      max_open_files=max_open_files,
      file_size_mb=file_size_mb,
      repo_mb=repo_mb,
      tmp_mb=tmp_mb,
      repo_archive_mb=repo_archive_mb,
      max_output_bytes=max_output_bytes,
      max_file_bytes=max_file_bytes,
    )
    for key, value in numbers.items():
      _positive(key, value)
    if not isinstance(test_timeout_s, (int, float)) or test_timeout_s < 0:
      raise ValueError(f"swe option 'test_timeout_s' must be a number >= 0, got {test_timeout_s!r}")
    self.timeout_s, self.grade_timeout_s = float(timeout_s), float(grade_timeout_s)
    self.limits = {
      "cpu_s": int(cpu_s),
      "memory_mb": int(memory_mb),
      "max_procs": int(max_procs),
      "max_open_files": int(max_open_files),
      "file_size_mb": int(file_size_mb),
      "max_output_bytes": int(max_output_bytes),
      "max_file_bytes": int(max_file_bytes),
    }
    self.repo_mb, self.tmp_mb = int(repo_mb), int(tmp_mb)
    self.archive_bytes = int(repo_archive_mb) << 20
    self.python = python or default_python()
    self.site_packages, self.use_cgroup = bool(site_packages), bool(memory_cgroup)
    self.grade_command = grade_command(float(test_timeout_s), self.site_packages)
    # The pool's hard limit of one call: a command, or a submit (archive + grading sandbox).
    self.call_timeout_s = self.timeout_s + self.grade_timeout_s + 30.0
    self.sandbox: Sandbox | None = None
    self.task: swe_tasks.SweTask | None = None
    self.result: dict | None = None
    self.deadline: float | None = None  # time.monotonic() when the task's own episode limit passes
    self.steps = 0
    self.timings: dict[str, float] = {}

  def _sandbox(self, grading: bool = False) -> Sandbox:
    return Sandbox(self.limits, self.repo_mb, self.tmp_mb, self.python, self.site_packages, self.use_cgroup, grading)

  @property
  def worker_pid(self) -> int | None:
    return self.sandbox.pid if self.sandbox is not None else None

  def alive(self) -> bool:
    return self.sandbox is not None and self.sandbox.alive()

  async def start(self) -> None:
    self.sandbox = self._sandbox()
    await self.sandbox.start()

  async def reset(self, row: dict | None) -> str:
    task = harbor_tasks.resolve_row(row)  # ValueError naming the field: the env stays usable
    if task.grade_timeout_s is not None and task.grade_timeout_s > self.grade_timeout_s:
      raise ValueError(
        f"field 'harbor_task': the task's [verifier] timeout_sec = {task.grade_timeout_s:g} is over this env's "
        f"grade_timeout_s = {self.grade_timeout_s:g} (its calls' limit); start the server with "
        f"--env-opt swe.grade_timeout_s={task.grade_timeout_s:g}"
      )
    archive = swe_tasks.repo_archive(task.repo, self.archive_bytes)
    if self.task is not None or self.sandbox is None:  # a used sandbox: start from a fresh one
      await self.close()
      await self.start()
    started = time.perf_counter()
    load = {"op": "load", "tar_b64": archive}
    if task.bug is not None:  # a shipped task: the clean repository, then its bug
      load["edit"] = dataclasses.asdict(task.bug)
    reply = await self.sandbox.request(load, 30.0)
    if "error" in reply:
      raise ValueError(
        f"field 'repo': {task.repo!r} could not be unpacked{' with its bug' if task.bug else ''}: {reply['error']}"
      )
    self.timings["load_s"] = time.perf_counter() - started
    self.task, self.result, self.steps = task, None, 0
    self.deadline = None if task.agent_timeout_s is None else time.monotonic() + task.agent_timeout_s
    tests = f" Its tests run with: {task.test_command}" if task.test_command else ""
    return (
      f"{task.problem_statement.strip()}\n\nThe repository is at /repo (the working "
      f"directory).{tests}\nActions: bash(command), "
      f"view(path, lines), str_replace(path, old, new), submit()."
    )

  async def step(self, action: Any) -> StepOutcome:
    if self.task is None:
      return StepOutcome(
        "Error: no task is loaded in this sandbox (it was restarted after a "
        "crash, or reset was not called); the episode cannot continue.",
        reward=0.0,
        done=True,
        info={"error": "NoTask"},
      )
    if self.result is not None:
      return StepOutcome("Error: the episode is over (already submitted).", done=True, info={"error": "EpisodeOver"})
    if self.deadline is not None and time.monotonic() >= self.deadline:
      return await self._agent_time_over()
    if isinstance(action, str):
      action = {"action": "bash", "command": action}
    if not isinstance(action, dict) or action.get("action") not in ACTIONS:
      got = action.get("action") if isinstance(action, dict) else type(action).__name__
      return StepOutcome(
        f"Error: the action must be an object with 'action' one of {list(ACTIONS)}, got {got!r}",
        info={"error": "BadAction"},
      )
    self.steps += 1
    kind = action["action"]
    try:
      if kind == "submit":
        result = await self.grade()
        self.result = result
        return StepOutcome(
          f"Submitted. {result['passed']} of {result['total']} hidden tests pass.",
          reward=result["reward"],
          done=True,
          info={"passed": result["passed"], "total": result["total"]},
        )
      request = self._request(kind, action)
    except ValueError as e:
      return StepOutcome(f"Error: {e}", info={"error": "BadAction"})
    limit = self.timeout_s + 10.0 if kind == "bash" else 30.0
    reply = await self.sandbox.request(request, limit)
    if "error" in reply:
      return StepOutcome(f"Error: {reply['error']}", info={"error": "ToolError"})
    info = {key: reply[key] for key in ("exit_code", "timed_out", "bytes") if key in reply}
    return StepOutcome(reply["output"], info=info)

  async def _agent_time_over(self) -> StepOutcome:
    """The task's episode limit ([agent] timeout_sec) has passed: the repository is graded as it is."""
    result = await self.grade()
    self.result = result
    return StepOutcome(
      f"The task's time limit for the agent ([agent] timeout_sec = {self.task.agent_timeout_s:g}) is over; the "
      f"repository was graded as it is: {result['passed']} of {result['total']} hidden tests pass.",
      reward=result["reward"],
      done=True,
      info={"passed": result["passed"], "total": result["total"], "agent_timed_out": True},
    )

  def _command_timeout_s(self) -> float:
    """A command's limit: the env's, or what is left of the task's episode limit when that is less."""
    if self.deadline is None:
      return self.timeout_s
    return max(1.0, min(self.timeout_s, self.deadline - time.monotonic()))

  def _request(self, kind: str, action: dict) -> dict:
    """The driver request of a bash / view / str_replace action; ValueError naming the
    argument."""
    if kind == "bash":
      command = action.get("command")
      if not isinstance(command, str) or not command.strip():
        raise ValueError("bash needs argument 'command' (a non-empty string)")
      return {"op": "bash", "command": command, "timeout_s": self._command_timeout_s()}
    path = action.get("path")
    if not isinstance(path, str) or not path.strip():
      raise ValueError(f"{kind} needs argument 'path' (a file under /repo)")
    if kind == "view":
      start, end = parse_lines(action.get("lines"))
      return {"op": "view", "path": path, "start": start, "end": end}
    for name in ("old", "new"):
      if not isinstance(action.get(name), str):
        raise ValueError(f"str_replace needs argument {name!r} (a string)")
    return {"op": "str_replace", "path": path, "old": action["old"], "new": action["new"]}

  async def grade(self) -> dict:
    """Runs the hidden tests on the repository as it is now: {reward, passed, total, cases}."""
    started = time.perf_counter()
    snap = await self.sandbox.request({"op": "snapshot", "max_bytes": self.archive_bytes}, 60.0)
    if "error" in snap:
      return {"reward": 0.0, "passed": 0, "total": 0, "error": snap["error"], "cases": []}
    tests = swe_tasks.repo_archive(self.task.hidden_tests, self.archive_bytes)
    grader = self._sandbox(grading=True)
    limit_s = self.task.grade_timeout_s or self.grade_timeout_s  # the task's own limit, when it gives one
    try:
      await grader.start()
      for archive, dest in ((snap["tar_b64"], "/repo"), (tests, HIDDEN_DIR)):
        loaded = await grader.request({"op": "load", "tar_b64": archive, "dest": dest}, 60.0)
        if "error" in loaded:
          raise EnvCrashed(f"the grading sandbox could not unpack {dest}: {loaded['error']}")
      if self.task.grader == harbor_tasks.GRADER:
        reply = await grader.request(
          {"op": "bash", "command": harbor_tasks.grade_command(), "timeout_s": limit_s},
          limit_s + 10.0,
        )
        return self._harbor_result(reply, started)
      targets = " ".join(shlex.quote(f"{HIDDEN_DIR}/{node}") for node in self.task.selected_tests)
      reply = await grader.request(
        {
          "op": "grade",
          "command": f"{self.grade_command} {targets or HIDDEN_DIR}",
          "timeout_s": limit_s,
          "junit": "/tmp/junit.xml",
        },
        limit_s + 10.0,
      )
    finally:
      await grader.close()
    cases = reply.get("cases", [])
    passed = sum(1 for _, outcome in cases if outcome == "passed")
    total = max(len(cases), len(self.task.selected_tests) or swe_tasks.count_hidden_tests(self.task.hidden_tests))
    self.timings["grade_s"] = time.perf_counter() - started
    return {
      "reward": passed / total if total else 0.0,
      "passed": passed,
      "total": total,
      "timed_out": bool(reply.get("timed_out")),
      "cases": cases,
      "output_tail": reply.get("output", "")[-2000:],
    }

  def _harbor_result(self, reply: dict, started: float) -> dict:
    """A Harbor task's grade: tests/test.sh's reward file, else its exit code (harbor_tasks.py)."""
    output = reply.get("output", "")
    reward, exit_code = harbor_tasks.parse_grade(output)
    self.timings["grade_s"] = time.perf_counter() - started
    return {
      "reward": reward,
      "passed": int(reward == 1.0),
      "total": 1,
      "timed_out": bool(reply.get("timed_out")),
      "exit_code": exit_code,
      "cases": [],
      "output_tail": output[-2000:],
    }

  @env_reward("hidden_tests")
  async def hidden_tests_reward(self) -> dict:
    """The fraction of hidden tests passing (as submitted; the current repository if the chain
    never submitted), with passed / total / submitted."""
    if self.task is None:
      return {"reward": 0.0, "passed": 0, "total": 0, "submitted": 0.0}
    submitted = self.result is not None
    result = self.result if submitted else await self.grade()
    return {
      "reward": result["reward"],
      "passed": float(result["passed"]),
      "total": float(result["total"]),
      "submitted": float(submitted),
    }

  async def run_visible_tests(self) -> dict:
    """Runs the task's own test command once (what the row check does)."""
    return await self.sandbox.request(
      {"op": "bash", "command": self.task.test_command, "timeout_s": self.timeout_s}, self.timeout_s + 10.0
    )

  async def close(self) -> None:
    sandbox, self.sandbox = self.sandbox, None
    self.task = None
    if sandbox is not None:
      await sandbox.close()

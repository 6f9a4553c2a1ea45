"""The SWE hidden tests and task fixes (and the Harbor example tasks' tests/ and solution/) are unreachable from the agent's sandbox under a non-editable
install (the package, with its data, inside the site-packages the sandbox mounts); the sandbox
probe skips only for a missing bubblewrap or refused user namespaces."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap

import pytest

import envservers_helpers
from envservers.envs import bwrap
from envservers_helpers import sandbox_unavailable_reason

REPO = pathlib.Path(__file__).resolve().parents[2]
needs_sandbox = pytest.mark.skipif(sandbox_unavailable_reason() is not None, reason=str(sandbox_unavailable_reason()))


def test_probe_does_not_hide_sandbox_bugs(monkeypatch):
  """A bug in bwrap.py (its command line raising) must not turn into a skip."""

  def broken(*args, **kwargs):
    raise RuntimeError("a bug in bwrap.py")

  monkeypatch.setattr(bwrap, "bwrap_args", broken)
  envservers_helpers.sandbox_unavailable_reason.cache_clear()
  try:
    if os.path.exists(bwrap.BWRAP):
      reason = envservers_helpers.sandbox_unavailable_reason()
      assert reason is None or "namespaces" in reason, reason
  finally:
    envservers_helpers.sandbox_unavailable_reason.cache_clear()
  monkeypatch.setattr(bwrap, "BWRAP", "/nonexistent/bwrap")
  try:
    assert "not installed" in envservers_helpers.sandbox_unavailable_reason()
  finally:
    envservers_helpers.sandbox_unavailable_reason.cache_clear()


def test_seal_args_cover_every_bind(tmp_path):
  """The package is hidden under whichever bind exposes it (site-packages, /usr, a prefix)."""
  here = bwrap.sealed_dirs()[0]
  assert here.endswith("envservers")
  parent = os.path.dirname(here)
  args = bwrap.seal_args([(parent, "/opt/site-packages"), ("/usr", "/usr")])
  hidden = [args[i + 1] for i, a in enumerate(args) if a == "--tmpfs"]
  want = ["/opt/site-packages/envservers"]
  if here.startswith("/usr/"):
    want.append(here)
  assert hidden == want
  assert bwrap.seal_args([(str(tmp_path), str(tmp_path))]) == []


# Run by the temporary venv's interpreter: starts the swe env's sandbox the way the env does and
# greps every file readable inside (all of / but the pseudo file systems) for the patterns.
_SEARCH = textwrap.dedent(
  """
  import json, sys, trio, envservers
  from envservers.envs.swe import SweEnv
  patterns = json.load(open(sys.argv[1]))
  async def main():
    env = SweEnv(timeout_s=240, cpu_s=240, memory_cgroup=False)
    await env.start()
    try:
      heredoc = "\\n".join(patterns)
      command = (
        "cat > /tmp/patterns <<'PATTERNS_END'\\n" + heredoc + "\\nPATTERNS_END\\n"
        "tops=$(find / -mindepth 1 -maxdepth 1 ! -type l ! -name proc ! -name sys ! -name dev); "
        "grep -rlsF -f /tmp/patterns $tops | grep -vx /tmp/patterns; "
        "echo SITE=$(ls -A /opt/site-packages/envservers | wc -l) $(ls /opt/site-packages | grep -c .)"
      )
      reply = await env.sandbox.request({"op": "bash", "command": command, "timeout_s": 240}, 260)
    finally:
      await env.close()
    print(json.dumps({"package": envservers.__file__, "reply": reply}))
  trio.run(main)
  """
)


def _patterns(site: pathlib.Path) -> list[str]:
  """Hidden-test lines and fix strings, read from the installed copy (so they are in it)."""
  data = site / "envservers" / "data"
  hidden = sorted(data.glob("swe_repos/*/*/hidden_tests/*.py"))
  harbor = sorted(data.glob("harbor_tasks/*/tests/*")) + sorted(data.glob("harbor_tasks/*/solution/*"))
  hidden += [p for p in harbor if p.is_file()]
  tasks = sorted(data.glob("swe_tasks/*/*.json"))
  assert hidden and tasks and any("harbor" in str(p) for p in hidden), f"the install lacks the SWE data under {data}"
  patterns = []
  for path in hidden:
    lines = sorted({line.strip() for line in path.read_text().splitlines() if len(line.strip()) >= 30}, key=len)
    patterns += lines[-3:]
  for path in tasks:  # the bug's edit as the task file spells it (the fix is its inverse)
    patterns += [line.strip() for line in path.read_text().splitlines() if line.strip().startswith(('"old"', '"new"'))]
  return sorted(set(patterns))


@pytest.mark.slow
@needs_sandbox
@pytest.mark.timeout(600)
def test_swe_data_unreachable_from_sandbox_of_non_editable_install():
  # Not pytest's tmp_path: its 0700 parent keeps a sandbox running under a uid of its own out.
  tmp_path = pathlib.Path(tempfile.mkdtemp(prefix="swe-sealed-"))
  try:
    tmp_path.chmod(0o755)
    _check_sealed(tmp_path)
  finally:
    shutil.rmtree(tmp_path, ignore_errors=True)


def _check_sealed(tmp_path: pathlib.Path) -> None:
  venv = tmp_path / "venv"
  subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)
  python = venv / "bin" / "python"
  site = pathlib.Path(
    subprocess.run(
      [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
      capture_output=True,
      text=True,
      check=True,
    ).stdout.strip()
  )
  src = tmp_path / "src"  # a copy: an in-tree build would leave build/ in the checkout
  src.mkdir()
  for name in ("pyproject.toml", "README.md"):
    shutil.copy(REPO / name, src / name)
  for name in ("agentfly_jax", "envservers"):
    shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
  subprocess.run(
    [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", site, src],
    check=True,
    capture_output=True,
  )
  # The server's other packages (trio, pytest) from this venv, on a path the sandbox never mounts.
  (site / "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
  canary = "sealing canary 7f3a9c: this file is readable in the sandbox"
  (site / "canary.txt").write_text(canary + "\n")
  patterns = _patterns(site)
  (tmp_path / "patterns.json").write_text(json.dumps([canary, *patterns]))
  (tmp_path / "search.py").write_text(_SEARCH)
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
  done = subprocess.run(
    [python, "-I", str(tmp_path / "search.py"), str(tmp_path / "patterns.json")],
    capture_output=True,
    text=True,
    timeout=400,
    env=env,
    cwd=tmp_path,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  assert result["package"].startswith(str(site)), result  # the installed copy served, not the checkout
  output = result["reply"]["output"]
  hits = [line for line in output.splitlines() if line.startswith("/")]
  assert "/opt/site-packages/canary.txt" in hits, output  # the search reached the mounted packages
  assert hits == ["/opt/site-packages/canary.txt"], f"hidden-test or fix text readable in the sandbox: {hits}"
  assert "SITE=0 " in output, output  # the installed package is an empty folder inside

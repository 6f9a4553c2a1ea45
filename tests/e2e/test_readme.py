"""README's "Train your own agent" section runs as written: its titled code blocks become files,
its bash block runs in a fresh directory next to the repository's scripts, and the run trains the
README's task."""

import json
import os
import re
import subprocess

import pytest
from train_cli import ROOT

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

FENCE = re.compile(r'```(\w+)(?: title="([^"]+)")?\n(.*?)```', re.S)


def readme_section(title: str) -> str:
  text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
  start = text.index(f"## {title}\n")
  end = text.find("\n## ", start + 1)
  return text[start : end if end > 0 else len(text)]


def test_section_is_short_and_has_a_tool_a_reward_rows_and_one_command():
  section = readme_section("Train your own agent")
  assert len(section.strip().splitlines()) <= 30 + 4  # + the title and the intro lines
  blocks = FENCE.findall(section)
  assert [lang for lang, _, _ in blocks] == ["python", "json", "bash"]
  assert "@tool" in blocks[0][2] and "@reward" in blocks[0][2] and blocks[1][1].endswith(".jsonl")


@pytest.mark.slow
def test_train_your_own_agent_section_runs_as_written(tmp_path):
  for name in (".venv", "experiments", "configs"):
    os.symlink(os.path.join(ROOT, name), tmp_path / name)
  commands = []
  for lang, title, body in FENCE.findall(readme_section("Train your own agent")):
    if title:
      (tmp_path / title).write_text(body)
    else:
      assert lang == "bash"
      commands.append(body)
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
  for command in commands:
    out = subprocess.run(["bash", "-ec", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
  run = tmp_path / "runs" / "mine"
  records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
  assert [r["step"] for r in records if "rollout/reward_mean" in r] == [1, 2]
  saved = json.loads((run / "config.json").read_text())
  assert saved["task"]["module"] == "my_task" and saved["task"]["train_path"] == str(tmp_path / "rows.jsonl")

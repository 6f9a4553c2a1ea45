"""A user's custom task written to a folder (module + rows), for the tests that build or train it
(tests/tasks/test_custom_task.py, tests/e2e/test_golden_run.py)."""

import json
import os
import textwrap

MODULE = textwrap.dedent('''
    from agentfly_jax.rewards import reward
    from agentfly_jax.tools import tool

    SYSTEM_PROMPT = "Spell words backwards with the mirror tool."

    @tool
    def mirror_word(word: str) -> str:
      """Spells a word backwards.

      Args:
        word: the word to reverse.
      """
      return word[::-1]

    @reward
    def mirror_match(prediction: str, mirrored: str) -> dict:
      return {"reward": float(mirrored in (prediction or "")), "mirror_reward_ran": 1.0}

    def scripted_response(prompt_text, use_tool, rng):
      return "I do not know."
''')
WORDS = ["otter", "maple", "quartz", "violet", "walnut", "zephyr", "basil", "cobalt"]


def write_task(folder, module_name="mirror_task"):
  folder.mkdir(parents=True, exist_ok=True)
  (folder / f"{module_name}.py").write_text(MODULE)
  rows = [{"question": f"Spell {w} backwards.", "mirrored": w[::-1]} for w in WORDS]
  (folder / "train.json").write_text(json.dumps(rows, indent=1))
  (folder / "eval.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:4]) + "\n")
  return rows


def env_with(folder):
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join([str(folder), env.get("PYTHONPATH", "")])
  return env


def task_flags(folder, *extra):
  return [
    "--config.task.module=mirror_task",
    f"--config.task.train_path={folder / 'train.json'}",
    f"--config.task.eval_path={folder / 'eval.jsonl'}",
    *extra,
  ]

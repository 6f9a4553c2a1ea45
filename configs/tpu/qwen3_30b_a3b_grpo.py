"""Qwen3-30B-A3B (mixture of experts: 128 experts, 8 a token, 48 sparse layers) GRPO on the TPU
topology `v5p:2x2x2` (8 chips of 95 GiB), experts split over the mesh's 'expert' axis (mesh.expert=4,
fsdp=2: tokens exchanged with all_to_all, models/moe.py), JAX sampler and trainer on one mesh.

  python experiments/train.py --config=configs/tpu/qwen3_30b_a3b_grpo.py:/ckpt/Qwen3-30B-A3B --workdir=gs://...
  python experiments/aot_compile.py --config=configs/tpu/qwen3_30b_a3b_grpo.py --topology=v5p:2x2x2

Everything but the experts (attention, embeddings, norms: 1.5 B of the 30.5 B params) is split over
fsdp x expert, all 8 chips, and so are the rows between the layers: with the default rules (fsdp only)
those params, their Adam moments and gradients sit 4 times on the mesh and attention runs 4 times over
the same rows (the train step: 103.5 GiB a chip, over the 95; 89 with these rules). 8 chips are the
fewest that hold the state (30.5 B x 16 bytes of params, gradients and Adam moments = 56.9 GiB a chip).

Floor of the train step a chip (8 micro-batches of 8 rows x 2,048 tokens, one row a chip): that state
56.9 + one layer's weights gathered in bfloat16 (attention 19 M whole + its 32 of the 128 experts' 604 M)
0.32 + remat-kept layer inputs (48 x 2,048 x 2,048 x 2 bytes) 0.38 + the all_to_all's 2,048 tokens x
8 assignments x 2,048 x 2 bytes, sent and received, 0.13 = 57.7 GiB. lab/results/aot_tpu.md has what
XLA reports for these programs on v5p:2x2x2 and the Qwen3-235B-A22B step this slice cannot hold.
"""

from agentfly_jax.rl.config import tpu_grpo_config

# the logical rules that name fsdp, extended over the expert axis (models/sharding.py DEFAULT_RULES): an
# axis an earlier dim of a param used is skipped, so the experts' kernels [E, D, I] stay experts-on-expert,
# D-on-fsdp
EXPERT_FSDP_RULES = {
  "embed": ("fsdp", "expert"),
  "embed_out": ("fsdp", "expert"),
  "q_heads_in": ("tp", "fsdp", "expert"),
  "mlp_in": ("tp", "fsdp", "expert"),
  "act_batch": ("fsdp", "expert"),
}


def get_config(model_dir: str = ""):
  """`model_dir`: the text after `configs/tpu/qwen3_30b_a3b_grpo.py:` (an HF folder), or set model.pretrained."""
  import ml_collections

  config = tpu_grpo_config("qwen3_30b_a3b_grpo_v5p8", "qwen3-30b-a3b", model_dir, fsdp=2)
  config.mesh.expert = 4
  # the sampler's routes replayed in prepare and the train step, so trainer and sampler route alike
  config.model.router_replay = "rollout"
  config.mesh.rules = ml_collections.ConfigDict({**config.mesh.rules.to_dict(), **EXPERT_FSDP_RULES})
  return config

"""On-policy distillation: a teacher's log-probs of the student's own sampled tokens as a per-token advantage.

    teacher = prepare.make_teacher_logprobs(t_graphdef, cfg, mesh=mesh, rules=rules)   # jitted, on the mesh
    arrays["teacher_logprobs"] = teacher(t_params, t_rest, arrays)           # f32[B, L], 0 off the actions
    adv = distill_advantages(env_adv, arrays["teacher_logprobs"], old_logprobs, mask, weight)

The per-token advantage of distillation is the negative of the reverse-KL estimate k1 of KL(student || teacher)
at the sampled token: log p_teacher(y_t | y_<t) - log p_student(y_t | y_<t). A policy-gradient step on it lowers
the student's reverse KL to the teacher on the student's own samples (as in GKD / on-policy distillation). Mixed
with the environment's advantages by `weight` = `loss.distill_weight` in [0, 1]:

    A_t = (1 - weight) * A_env_t + weight * (log p_teacher_t - log p_student_t)    at action tokens, 0 elsewhere

(weight 1: distillation alone; the reward is still computed and logged). The student's log-probs are the
trainer's recompute at the sampling temperature (prepare's `old_logprobs`: the distribution the tokens were
drawn from); the teacher's are at temperature 1 (the teacher as it is). The teacher's forward is the reference
model's log-prob path (prepare.action_logprobs) on another graph: any size or family over the same vocabulary.
"""

from __future__ import annotations

import jax.numpy as jnp


def reverse_kl_advantages(teacher_logprobs, student_logprobs, mask):
  """f32[B, L] log p_teacher - log p_student of the sampled tokens (f32[B, L] each) where bool[B, L] `mask`, else 0."""
  return jnp.where(mask, teacher_logprobs - student_logprobs, 0.0).astype(jnp.float32)


def distill_advantages(env_advantages, teacher_logprobs, student_logprobs, mask, weight: float):
  """f32[B, L] (1 - weight) x `env_advantages` + weight x `reverse_kl_advantages` at `mask`, 0 elsewhere."""
  rkl = reverse_kl_advantages(teacher_logprobs, student_logprobs, mask)
  return jnp.where(mask, (1.0 - weight) * env_advantages + weight * rkl, 0.0).astype(jnp.float32)


def distill_metrics(teacher_logprobs, student_logprobs, mask) -> dict:
  """distill/reverse_kl (the mean k1 estimate log p_student - log p_teacher over the action tokens) and
  distill/teacher_logprob (the teacher's mean log-prob of the student's tokens): f32[] each."""
  n = jnp.maximum(jnp.sum(mask), 1)
  return {
    "distill/reverse_kl": jnp.sum(jnp.where(mask, student_logprobs - teacher_logprobs, 0.0)) / n,
    "distill/teacher_logprob": jnp.sum(jnp.where(mask, teacher_logprobs, 0.0)) / n,
  }

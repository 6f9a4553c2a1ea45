"""On-policy distillation through the whole loop: the teacher (an HF folder of another size over the student's
tokenizer) is loaded on the mesh, scores each step's sampled tokens, and its reverse KL drives the update. The
teacher here is a random-init model: near-uniform, so its log-prob of any token is about -ln(vocab), and the
student (the lookup warm start) is far more confident than it: the reverse KL is large and positive."""

import os
import shutil

import numpy as np
import pytest
from train_cli import ROOT

from agentfly_jax.rl.config import lookup_config

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

WARMSTART = os.path.join(ROOT, "experiments", "results", "lookup_warmstart")


def _config(tmp_path, teacher):
  c = lookup_config("grpo", WARMSTART)
  c.train.steps = 2
  c.train.lr = 1e-2  # one step moves the student off the teacher
  c.rollout.rows_per_step, c.rollout.num_chains, c.rollout.max_turns = 2, 4, 2
  c.rollout.max_tokens_per_turn = 16
  c.train.micro_batch_size = 8
  c.eval.every, c.eval.num_rows = 0, 0
  c.checkpoint.every = 100
  c.log.tensorboard = c.log.progress = False
  c.teacher.pretrained = teacher
  c.loss.distill_weight = 1.0
  return c


@pytest.mark.slow
def test_distillation_trains_through_the_loop(tmp_path):
  from agentfly_jax.rl.trainer import Trainer

  from flax import nnx

  from agentfly_jax.models import CausalLM, save_pretrained, tiny_config

  teacher = str(tmp_path / "teacher")
  vocab = 668  # the warm start's tokenizer (experiments/results/lookup_warmstart/config.json)
  cfg = tiny_config("qwen2", vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=3)
  save_pretrained(CausalLM(cfg, rngs=nnx.Rngs(3)), teacher)
  for name in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(os.path.join(WARMSTART, name), teacher)
  records = Trainer(_config(tmp_path, teacher), str(tmp_path / "run")).train()
  assert [r["step"] for r in records] == [1, 2]
  for r in records:
    assert r["distill/teacher_logprob"] == pytest.approx(-np.log(vocab), abs=0.3)  # near-uniform teacher
    assert r["distill/reverse_kl"] > 1.0  # the student is far sharper than it
    assert np.isfinite(r["actor/pg_loss"]) and r["actor/grad_norm"] > 0
    assert r["adv/abs_mean"] >= 0


def test_a_teacher_over_another_vocabulary_stops_the_build(tmp_path):
  from agentfly_jax.data import build_tiny_tokenizer
  from agentfly_jax.rl.setup import build_run
  from agentfly_jax.rl.spec import RunSpec

  teacher = tmp_path / "teacher"
  shutil.copytree(WARMSTART, teacher)
  build_tiny_tokenizer(str(teacher), ["other words entirely"] * 8, vocab_size=300, template="qwen2.5")
  with pytest.raises(ValueError, match="config.teacher.pretrained=.*the teacher's vocabulary differs"):
    build_run(RunSpec.from_config(_config(tmp_path, str(teacher))), str(tmp_path / "run"))

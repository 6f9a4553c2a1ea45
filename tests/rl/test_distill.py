"""On-policy distillation: the per-token reverse-KL advantage and its mix with the reward's on hand-worked cases
under the action mask; the teacher's jitted log-prob program (a model of another size) equal to HF transformers'
log-softmax of the student's tokens; prepare's advantages mixed exactly so; the vocabulary check; the spec's
distillation fields."""

import dataclasses

import numpy as np
import pytest
import jax.numpy as jnp
from flax import nnx

from agent_testlib import agent_tokenizer, tokenizer_dir
from agentfly_jax.agents.trajectory import Trajectory
from agentfly_jax.data import build_tiny_tokenizer
from agentfly_jax.models import CausalLM, save_pretrained, tiny_config
from agentfly_jax.rl.batching import train_arrays
from agentfly_jax.rl.config import default_config
from agentfly_jax.rl.core.distill import distill_advantages, distill_metrics, reverse_kl_advantages
from agentfly_jax.rl.core.prepare import make_prepare, make_teacher_logprobs
from agentfly_jax.rl.spec import RunSpec
from agentfly_jax.rl.teacher import check_same_vocabulary
from agentfly_jax.rl.update import default_prepare_config

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

T = np.array([[-1.0, -0.5, -2.0, -0.1], [-3.0, -0.2, -0.7, -1.5]], np.float32)  # teacher log-probs
S = np.array([[-2.0, -0.5, -1.0, -0.3], [-1.0, -0.4, -0.7, -9.0]], np.float32)  # student log-probs
M = np.array([[True, True, False, True], [False, True, True, False]])
ENV = np.array([[0.5, 0.5, 0.5, 0.5], [-1.0, -1.0, -1.0, -1.0]], np.float32)  # GRPO-like, broadcast per row


def test_reverse_kl_advantage_hand_worked():
  # teacher - student where the mask holds: row 0: -1 - -2 = 1, -0.5 - -0.5 = 0, (masked), -0.1 - -0.3 = 0.2
  # row 1: (masked), -0.2 - -0.4 = 0.2, -0.7 - -0.7 = 0, (masked)
  want = [[1.0, 0.0, 0.0, 0.2], [0.0, 0.2, 0.0, 0.0]]
  np.testing.assert_allclose(reverse_kl_advantages(T, S, M), want, atol=1e-6)


def test_mixed_with_the_reward_hand_worked():
  # weight 0.25: 0.75 x env + 0.25 x (teacher - student) at the mask
  want = [[0.375 + 0.25, 0.375, 0.0, 0.375 + 0.05], [0.0, -0.75 + 0.05, -0.75, 0.0]]
  np.testing.assert_allclose(distill_advantages(ENV, T, S, M, 0.25), want, atol=1e-6)
  np.testing.assert_allclose(distill_advantages(ENV, T, S, M, 0.0), np.where(M, ENV, 0), atol=1e-6)
  np.testing.assert_allclose(distill_advantages(ENV, T, S, M, 1.0), reverse_kl_advantages(T, S, M), atol=1e-6)
  m = distill_metrics(T, S, M)  # student - teacher over the 5 action tokens: (-1 + 0 - 0.2 - 0.2 + 0) / 5
  assert float(m["distill/reverse_kl"]) == pytest.approx(-1.4 / 5)
  assert float(m["distill/teacher_logprob"]) == pytest.approx((-1.0 - 0.5 - 0.1 - 0.2 - 0.7) / 5)


V = 96
STUDENT = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1)
TEACHER = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)


def _trajs(rng, groups=2, chains=3):
  out = []
  for g in range(groups):
    for c in range(chains):
      n = int(rng.integers(10, 24))
      mask = np.zeros(n, bool)
      mask[4:] = rng.random(n - 4) < 0.7
      lp = np.where(mask, -rng.random(n) * 2, 0).astype(np.float32)
      out.append(
        Trajectory(rng.integers(0, V, n).astype(np.int32), mask, lp, reward=float(rng.random()), group_id=g, chain_id=c)
      )
  return out


@pytest.mark.slow  # ~30 s here: two compiles and an HF forward per trajectory
def test_teacher_logprobs_equal_hf_transformers_and_prepare_mixes_them(tmp_path):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  rng = np.random.default_rng(7)
  trajs = _trajs(rng)
  arrays = train_arrays(trajs, pad_id=0)
  teacher = CausalLM(tiny_config("qwen2", num_hidden_layers=3, head_dim=16, **TEACHER), rngs=nnx.Rngs(5))
  save_pretrained(teacher, str(tmp_path / "teacher"))
  student = CausalLM(tiny_config("qwen2", num_hidden_layers=2, head_dim=16, **STUDENT), rngs=nnx.Rngs(1))
  cfg = default_prepare_config("grpo", chunk=4, logits_chunk=8, temperature=0.7)
  t_graph, t_params, t_rest = nnx.split(teacher, nnx.Param, ...)
  got = np.asarray(
    make_teacher_logprobs(t_graph, cfg)(t_params, t_rest, {k: jnp.asarray(v) for k, v in arrays.items()})
  )

  hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "teacher"), dtype=torch.float32).eval()
  for i, t in enumerate(trajs):
    with torch.no_grad():
      logits = hf(torch.tensor(t.token_ids[None, :-1], dtype=torch.long)).logits[0].double()
    ref = torch.log_softmax(logits, -1)[torch.arange(len(t.token_ids) - 1), torch.tensor(t.token_ids[1:])].numpy()
    mask = np.asarray(t.action_mask[1:])  # target-aligned: position j predicts token j + 1
    n = len(ref)
    np.testing.assert_allclose(got[i, :n][mask], ref[mask], atol=2e-4)  # at temperature 1, not the sampler's 0.7
    assert np.all(got[i, :n][~mask] == 0) and np.all(got[i, n:] == 0)

  w = 0.4
  graph, params, rest = nnx.split(student, nnx.Param, ...)
  prep = make_prepare(graph, rest, dataclasses.replace(cfg, distill_weight=w))
  device = {k: jnp.asarray(v) for k, v in arrays.items()}
  plain, _ = prep(params, None, None, device)
  mixed, metrics = prep(params, None, None, {**device, "teacher_logprobs": jnp.asarray(got)})
  mask = arrays["action_mask"]
  want = np.where(mask, (1 - w) * np.asarray(plain["advantages"]) + w * (got - np.asarray(plain["old_logprobs"])), 0)
  np.testing.assert_allclose(np.asarray(mixed["advantages"]), want, atol=1e-5)
  rkl = np.sum(np.where(mask, np.asarray(plain["old_logprobs"]) - got, 0)) / mask.sum()
  assert float(metrics["distill/reverse_kl"]) == pytest.approx(rkl, rel=1e-4)


def test_a_teacher_with_another_vocabulary_is_refused(tmp_path):
  student_tok = agent_tokenizer()
  same = tmp_path / "same"
  save_pretrained(CausalLM(tiny_config("qwen2", vocab_size=student_tok.vocab_size), rngs=nnx.Rngs(0)), str(same))
  import shutil

  for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(f"{tokenizer_dir()}/{f}", same / f)
  assert check_same_vocabulary(str(same), student_tok) == student_tok.vocab_size
  other = tmp_path / "other"
  build_tiny_tokenizer(str(other), ["a completely different corpus of words"] * 8, vocab_size=300, template="qwen2.5")
  save_pretrained(CausalLM(tiny_config("qwen2", vocab_size=300), rngs=nnx.Rngs(0)), str(other))
  with pytest.raises(ValueError, match=r"config.teacher.pretrained=.*the teacher's vocabulary differs"):
    check_same_vocabulary(str(other), student_tok)
  small = tmp_path / "small"
  save_pretrained(CausalLM(tiny_config("qwen2", vocab_size=100), rngs=nnx.Rngs(0)), str(small))
  for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(f"{tokenizer_dir()}/{f}", small / f)
  with pytest.raises(ValueError, match=r"vocab_size 100 is under the tokenizer's"):
    check_same_vocabulary(str(small), student_tok)
  with pytest.raises(ValueError, match="no config.json"):
    check_same_vocabulary(str(tmp_path), student_tok)


@pytest.mark.parametrize(
  "fields, message",
  [
    ({"loss.distill_weight": 0.5}, r"config.loss.distill_weight=0.5: distillation needs a teacher"),
    ({"teacher.pretrained": "/t"}, r"config.teacher.pretrained='/t': a teacher is loaded for loss.distill_weight"),
    ({"loss.distill_weight": 1.5, "teacher.pretrained": "/t"}, r"config.loss.distill_weight=1.5: must be in \[0, 1\]"),
  ],
)
def test_distillation_fields_are_checked(fields, message):
  c = default_config()
  for key, value in fields.items():
    section, name = key.split(".")
    c[section][name] = value
  with pytest.raises(ValueError, match=message):
    RunSpec.from_config(c)

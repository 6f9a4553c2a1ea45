"""The built-in visual_qa task: its rows hide the answer and the scene from the agent, its agent reads
images, and `build_run` builds a tiny Qwen2.5-VL run of configs/visual_qa_grpo.py (the policy a Qwen25VL,
its vision tower frozen by default, trained with model.vision.train=True)."""

from __future__ import annotations

import pytest
from flax import nnx

from agentfly_jax.data.row_fields import REWARD_ONLY_FIELDS, agent_view
from agentfly_jax.rl.spec import RunSpec
from agentfly_jax.tasks import get_task


def test_rows_and_agent():
  task = get_task("visual_qa")
  rows = task.make_rows(8, 0)
  assert len(rows) == 8 and all(r["question"] and r["answer"] for r in rows)
  test_ids = {r["id"] for r in task.make_eval_rows(8, 0)}
  assert not test_ids & {r["id"] for r in rows}
  seen = agent_view(rows[0], REWARD_ONLY_FIELDS)
  assert "answer" not in seen and "solution" not in seen


@pytest.mark.slow  # tokenizer training + a model build: ~20 s on a loaded 2-core CPU
@pytest.mark.parametrize("train_vision", [False, True])
def test_build_run_accepts_a_qwen2_5_vl_policy(tmp_path, train_vision):
  from agentfly_jax.models import Qwen25VL
  from agentfly_jax.rl.setup import build_run
  from configs.visual_qa_grpo import get_config

  c = get_config()
  c.model.vision.train = train_vision
  c.eval.num_rows = 0
  parts = build_run(RunSpec.from_config(c), str(tmp_path / "run"))
  model = nnx.merge(parts.policy.graphdef, parts.policy.params, parts.policy.rest)
  assert isinstance(model, Qwen25VL) and parts.model_config.vision is not None
  assert parts.agent.vision is not None
  roots = {p[0] for p, _ in nnx.to_flat_state(parts.policy.params)}
  assert ("visual" in roots) == train_vision and "model" in roots

"""The SFT warm start's step-0 record through experiments/train.py (tiny lookup policy): with
`eval.before_sft` the base model's greedy eval comes first (eval_pre_sft/*), then the SFT's NLL
and time and the eval after it (eval/*); with it off the pre-SFT eval is skipped, the rest stays."""

import pytest
from train_cli import run_train

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)

FLAGS = [
  "--config.sft.steps=2",
  "--config.sft.rows_per_step=4",
  "--config.train.steps=1",
  "--config.rollout.rows_per_step=1",
  "--config.rollout.num_chains=2",
  "--config.rollout.max_turns=1",
  "--config.rollout.max_tokens_per_turn=8",
  "--config.eval.every=1",
  "--config.eval.num_rows=4",
  "--config.checkpoint.every=0",
  "--config.log.tensorboard=False",
]


@pytest.mark.slow
@pytest.mark.parametrize("before_sft", [True, False])
def test_step_zero_has_the_pre_sft_eval_only_when_asked(tmp_path, before_sft):
  records = run_train(tmp_path / "run", *FLAGS, f"--config.eval.before_sft={before_sft}")
  step0 = next(r for r in records if r["step"] == 0)
  pre_sft = [k for k in step0 if k.startswith("eval_pre_sft/")]
  assert bool(pre_sft) == before_sft, sorted(step0)
  if before_sft:
    assert step0["eval_pre_sft/num_chains"] == 4
  assert step0["eval/num_chains"] == 4 and step0["time/sft_s"] > 0  # the SFT ran, then the eval after it
  assert 0 < step0["sft/nll_first"] < 20 and 0 < step0["sft/nll_last"] < 20  # trained: its NLL is recorded

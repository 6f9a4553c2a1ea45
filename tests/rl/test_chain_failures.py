"""rl/chain_failures.py: a step where every chain failed stops the run at once; a failed share above the
threshold stops it after `patience` steps in a row (a good step resets the count); the error names
the first failed chain's exception and frame; segments of one chain count once."""

import pytest

from agentfly_jax.agents.trajectory import Trajectory
from agentfly_jax.rl.chain_failures import ChainFailureGuard, ChainsFailedError, error_share


def _traj(group, chain, finish, segment=0):
  error = "ValueError: bad key" if finish == "error" else None
  frame = "agent.py:7 in run" if finish == "error" else None
  return Trajectory(
    [1, 2],
    [0, 1],
    [0, -1],
    group_id=group,
    chain_id=chain,
    finish_reason=finish,
    error=error,
    error_frame=frame,
    segment=segment,
  )


def _step(n_error, n_ok=0):
  return [_traj(0, c, "error") for c in range(n_error)] + [_traj(1, c, "agent_done") for c in range(n_ok)]


def test_every_chain_failed_stops_at_once_naming_the_first():
  with pytest.raises(
    ChainsFailedError,
    match=r"step 4: every chain failed \(3 of 3 finish=error\); the first "
    r"\(group 0, chain 0\): ValueError: bad key\n  at agent.py:7 in run",
  ):
    ChainFailureGuard().check(4, _step(3))


def test_share_above_threshold_for_patience_steps_stops():
  guard = ChainFailureGuard(max_error_share=0.5, patience=3)
  assert guard.check(1, _step(3, 1)) == 0.75
  assert guard.check(2, _step(3, 1)) == 0.75
  assert guard.check(3, _step(1, 3)) == 0.25  # a good step: the count starts again
  guard.check(4, _step(3, 1))
  guard.check(5, _step(3, 1))
  with pytest.raises(ChainsFailedError, match="stayed above 0.5 for 3 steps"):
    guard.check(6, _step(3, 1))


def test_segments_of_a_chain_count_once_and_bad_settings_are_named():
  trajs = [_traj(0, 0, "agent_done", 0), _traj(0, 0, "agent_done", 1), _traj(0, 1, "error")]
  assert error_share(trajs)[0] == 0.5
  with pytest.raises(ValueError, match="max_error_share=1.5: must be in"):
    ChainFailureGuard(max_error_share=1.5)
  with pytest.raises(ValueError, match="patience=0: must be an int >= 1"):
    ChainFailureGuard(patience=0)


def test_timed_out_chains_are_failed_chains_and_shown():
  from agentfly_jax.rl.run_log import postfix

  trajs = [_traj(0, 0, "timeout"), _traj(0, 1, "error"), _traj(0, 2, "agent_done"), _traj(0, 3, "agent_done")]
  share, first, failed, chains = error_share(trajs)
  assert (share, first is trajs[0], failed, chains) == (0.5, True, 2, 4)
  guard = ChainFailureGuard(max_error_share=0.25, patience=1)
  with pytest.raises(ChainsFailedError, match=r"\(2 of 4: 1 finish=error, 1 finish=timeout at this step\)"):
    guard.check(2, trajs)
  with pytest.raises(ChainsFailedError, match=r"every chain failed \(1 of 1 finish=timeout\).*chain_timeout_s"):
    ChainFailureGuard().check(3, trajs[:1])
  bar = postfix({"rollout/reward_mean": 0.0, "rollout/success_rate": 0.0, "rollout/finish/timeout": 0.25})
  assert bar["timeout"] == "0.25" and "error" not in bar

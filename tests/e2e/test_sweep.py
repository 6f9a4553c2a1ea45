"""experiments/sweep.py: a 2x2 grid runs locally and writes its summary table, plot and SLURM script; a stopped
sweep stops its runs."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from train_cli import ROOT, load_script

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)


def _load_sweep_script():
  """experiments/sweep.py as a module (a script, not part of the package)."""
  return load_script("experiments/sweep.py")


def test_grid_and_random_points():
  sweep = _load_sweep_script()
  grid = sweep.parse_assignments("train.lr=1e-4,3e-4;rollout.num_chains=2,4", multi=True)
  points = sweep.sweep_points(grid, "grid", 0, 0)
  assert len(points) == 4 and {"train.lr": "3e-4", "rollout.num_chains": "2"} in points
  assert len(sweep.sweep_points(grid, "random", 3, 0)) == 3
  with pytest.raises(ValueError, match="not key=value"):
    sweep.parse_assignments("train.lr", multi=True)


def _sweep_command(sweep_dir, *, grid: str, base: str) -> list[str]:
  """sweep.py over configs/lookup_rloo.py, two runs at a time."""
  script = os.path.join(ROOT, "experiments", "sweep.py")
  return [
    sys.executable,
    script,
    "--config=configs/lookup_rloo.py",
    f"--sweep_dir={sweep_dir}",
    f"--grid={grid}",
    f"--base={base}",
    "--parallel=2",
  ]


@pytest.mark.slow
def test_sweep_runs_2x2_grid_and_summarises(tmp_path):
  sweep_dir = tmp_path / "sweep"
  base = (
    "sft.steps=0;train.steps=1;rollout.rows_per_step=1;rollout.num_chains=2;rollout.max_turns=1;"
    "rollout.max_tokens_per_turn=8;eval.every=0;eval.num_rows=0;train.micro_batch_size=4;"
    "log.tensorboard=False"
  )
  out = subprocess.run(
    # seed is no program's constant or shape: the 2nd pair of runs (seed=1) finds every program the first
    # pair (one per lr, compiled side by side) put in the compile cache
    _sweep_command(sweep_dir, grid="train.lr=1e-4,3e-4;seed=0,1", base=base),
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  summary = json.loads((sweep_dir / "summary.json").read_text())
  assert len(summary) == 4 and all(r["returncode"] == 0 for r in summary)
  assert all(r["final"]["rollout/reward_mean"] is not None for r in summary)
  table = (sweep_dir / "summary.md").read_text()
  assert table.count("\n") == 6 and "train.lr" in table and "seed" in table
  assert (sweep_dir / "summary.png").stat().st_size > 1000
  slurm = (sweep_dir / "slurm_array.sh").read_text()
  assert "#SBATCH --array=0-3" in slurm and slurm.count("experiments/train.py") == 4


@pytest.mark.slow
def test_a_stopped_sweep_stops_its_runs(tmp_path):
  """SIGTERM to sweep.py (a scheduler's cancel) ends the train.py processes it started: none is left
  running without its parent."""
  psutil = pytest.importorskip("psutil")
  sweep = subprocess.Popen(
    _sweep_command(
      tmp_path / "sweep", grid="seed=0,1", base="train.steps=1000;eval.every=0;eval.num_rows=0;log.tensorboard=False"
    ),
    cwd=ROOT,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )
  children = []
  try:
    deadline = time.monotonic() + 300
    while len(children) < 2 and time.monotonic() < deadline and sweep.poll() is None:
      children = [c for c in psutil.Process(sweep.pid).children() if "train.py" in " ".join(c.cmdline())]
      time.sleep(0.2)
    assert len(children) == 2, sweep.communicate(timeout=60)[0][-3000:]
    sweep.send_signal(signal.SIGTERM)
    out, _ = sweep.communicate(timeout=60)
    assert sweep.returncode != 0 and "stopped by signal SIGTERM" in out, out[-3000:]
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, [c.cmdline() for c in alive]
  finally:  # nothing of this test outlives it, whatever failed
    if sweep.poll() is None:
      sweep.kill()
    for child in children:
      if child.is_running():
        child.kill()

"""A bad config value or unknown algorithm stops the run before any model, tokenizer or rollout,
with a message naming the field."""

import inspect
import os
import subprocess
import sys

import jax
import pytest

from agentfly_jax.rl.config import ALGORITHMS, default_config, validate_config
from agentfly_jax.rl.spec import RunSpec
from train_cli import ROOT


def test_default_and_shipped_configs_validate():
  validate_config(default_config())
  import importlib.util

  for name in sorted(os.listdir(os.path.join(ROOT, "configs"))):
    if name.endswith(".py"):
      spec = importlib.util.spec_from_file_location(name[:-3], os.path.join(ROOT, "configs", name))
      mod = importlib.util.module_from_spec(spec)
      spec.loader.exec_module(mod)
      if any(p.default is inspect.Parameter.empty for p in inspect.signature(mod.get_config).parameters.values()):
        continue  # configs/from_run.py:<run dir> needs a run (tests/test_custom_task.py covers it)
      cfg = mod.get_config()
      validate_config(cfg)
      assert cfg.algo in ALGORITHMS


@pytest.mark.parametrize(
  "field, value, needle",
  [
    ("algo", "ppo2", "config.algo='ppo2'"),
    ("task", "nope", "config.task='nope'"),
    ("loss.agg", "token-sum", "config.loss.agg='token-sum'"),
    ("loss.kl_kind", "k4", "config.loss.kl_kind='k4'"),
    ("rollout.num_chains", 0, "config.rollout.num_chains=0"),
    ("rollout.num_chains", 1, "config.rollout.num_chains=1"),  # GRPO needs a group
    ("train.lr", -1.0, "config.train.lr=-1.0"),
    ("rollout.top_p", 0.0, "config.rollout.top_p=0.0"),
    ("train.epochs", 0, "config.train.epochs=0"),
    ("mesh.sampler_devices", -1, "config.mesh.sampler_devices=-1"),
    ("train.logits_capacity", (0.5, 1.5), "config.train.logits_capacity=(0.5, 1.5)"),
    ("model.attention_impl", "sdpa", "config.model.attention_impl='sdpa'"),
  ],
)
def test_bad_values_name_the_field(field, value, needle):
  cfg = default_config()
  section, _, key = field.rpartition(".")
  (cfg[section] if section else cfg)[key] = value
  with pytest.raises(ValueError) as e:
    validate_config(cfg)
  assert needle in str(e.value)


def test_sampler_sub_mesh_needs_the_jax_sampler_and_enough_devices():
  from agentfly_jax.rl.setup import training_and_sampler_meshes

  cfg = default_config()
  cfg.mesh.sampler_devices, cfg.rollout.sampler = 1, "vllm"
  with pytest.raises(ValueError, match="config.mesh.sampler_devices=1.*JAX sampler"):
    validate_config(cfg)
  cfg.rollout.sampler = "jax"
  validate_config(cfg)
  n = len(jax.local_devices())
  cfg.mesh.sampler_devices = n  # + the trainer's one device: one too many
  with pytest.raises(ValueError, match=f"need {n + 1} devices; this host has {n}"):
    training_and_sampler_meshes(RunSpec.from_config(cfg))


def test_train_script_exits_before_rollout(tmp_path):
  workdir = tmp_path / "run"
  out = subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, "experiments", "train.py"),
      "--config=configs/lookup_grpo.py",
      f"--workdir={workdir}",
      "--config.algo=reinforce",
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert out.returncode != 0
  assert "config.algo='reinforce'" in out.stderr and "unknown algorithm" in out.stderr
  assert not workdir.exists()  # nothing was built

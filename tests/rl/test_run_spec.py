"""The run config parsed once into frozen typed sections (rl/spec.py): every bad field is named
with what is allowed; names come from the registries; `migrate` brings old saved configs up."""

import dataclasses
import json
import os

import pytest

from agentfly_jax.rl.core import advantages, losses
from agentfly_jax.rl.config import default_config, migrate
from agentfly_jax.rl.programs import loss_config
from agentfly_jax.rl.spec import RunSpec
from agentfly_jax.rl.spec_section import view
from agentfly_jax.rl.update import prepare_config
from agentfly_jax.sampling import registry as samplers
from train_cli import TESTS_DIR

SAVED_RUN = os.path.join(TESTS_DIR, "data", "run_saved_by_0e48eb0")


def _with(field, value):
  """The default config as a plain dict (a saved config.json; ConfigDict would refuse some
  wrong types itself) with `field` set to `value`."""
  c = default_config().to_dict()
  section, _, key = field.rpartition(".")
  node = c
  for part in filter(None, section.split(".")):
    node = node[part]
  node[key] = value
  return c


@pytest.mark.parametrize(
  "field, value, allowed",
  [
    ("model.family", "gpt2", "('qwen2', 'qwen3', 'llama', 'qwen3_moe', 'qwen2_5_vl')"),
    ("model.hidden_size", 0, "integer >= 1"),
    ("model.dtype", "float8", "'float32', 'bfloat16' or 'float16'"),
    ("model.lora.rank", -1, "integer >= 0"),
    ("mesh.fsdp", 0, "integer >= 1"),
    ("rollout.mode", "batch", "'sync' or 'async'"),
    ("rollout.sampler", "sglang", "registered: ['jax', 'jax_static', 'vllm'"),
    ("rollout.temperature", -0.5, ">= 0"),
    ("rollout.max_staleness", 1.5, "an integer"),
    ("rollout.prefix_cache_tokens", -1, "integer >= 0"),
    ("rollout.shared_turns", -2, "integer >= 0"),
    ("train.schedule", "step", "('constant', 'cosine', 'linear')"),
    ("train.remat", "dots", "known:"),
    ("train.micro_batch_size", 0, "integer >= 1"),
    ("train.pack_sequences", "yes", "a bool"),
    ("loss.policy_loss", "my_clip", "registered: ['ppo', 'gspo', 'decoupled_ppo'"),
    ("loss.estimator", "vtrace", "registered: ['grpo', 'drgrpo', 'rloo'"),
    ("loss.agg", "sum", "seq-mean-token-sum-norm"),
    ("loss.dual_clip", 0.5, "> 1 (or 0 to disable)"),
    ("loss.behaviour_cap", 0.0, "> 0"),
    ("critic.lr", 0.0, "> 0"),
    ("dapo.overlong_buffer", -4, "integer >= 0"),
    ("sft.tool_use_prob", 1.5, "(0, 1]"),
    ("sft.rows_per_step", 0, "integer >= 1"),
    ("eval.num_rows", -1, "integer >= 0"),
    ("checkpoint.keep", 0, "integer >= 1"),
    ("gpu.vllm_mem_fraction", 1.0, "[0, 1)"),
    ("log.wandb_project", 3, "a string"),
    ("train.logits_capacity", 0.5, "a list"),
    ("mesh.rules", "tp", "a mapping"),
    ("seed", "zero", "an integer"),
  ],
)
def test_each_bad_field_is_named_with_what_is_allowed(field, value, allowed):
  with pytest.raises(ValueError) as e:
    RunSpec.from_config(_with(field, value))
  assert f"config.{field}={value!r}" in str(e.value) and allowed in str(e.value), str(e.value)


def test_batch_invariance_is_asked_of_the_jax_engine_only():
  c = _with("rollout.batch_invariant", True)
  assert RunSpec.from_config(c).rollout.batch_invariant
  c["rollout"]["weight_update"] = "recompute"
  with pytest.raises(
    ValueError, match=r"config.rollout.batch_invariant=True: needs sampler='jax' .* weight_update='drain'"
  ):
    RunSpec.from_config(c)
  c["rollout"]["sampler"], c["rollout"]["weight_update"] = "vllm", "drain"
  with pytest.raises(ValueError, match=r"config.rollout.batch_invariant=True: needs sampler='jax'"):
    RunSpec.from_config(c)


def test_unknown_fields_are_named():
  c = default_config()
  c.train.lrr = 1e-3
  with pytest.raises(ValueError, match=r"config.train.lrr: unknown field; train has \[.*'lr'"):
    RunSpec.from_config(c)
  c = default_config()
  c.nonsense = 1
  with pytest.raises(ValueError, match="config.nonsense: unknown field"):
    RunSpec.from_config(c)
  c = _with("task", {"module": "m", "rewards": "x"})
  with pytest.raises(ValueError, match=r"config.task.rewards: unknown field; a user task has \[.*'reward'"):
    RunSpec.from_config(c)


def test_sections_are_frozen_typed_and_round_trip():
  spec = RunSpec.from_config(default_config())
  with pytest.raises(dataclasses.FrozenInstanceError):
    spec.loss.clip_low = 0.1
  assert isinstance(spec.train.lr, float) and isinstance(spec.train.logits_capacity, tuple)
  with pytest.raises(TypeError):  # the rules mapping is read-only too
    spec.mesh.rules["mlp"] = "fsdp"
  assert spec.to_dict() == default_config().to_dict()
  c = _with("train.lr", 3)  # an int where a float goes (a saved JSON): taken as the number
  assert RunSpec.from_config(c).train.lr == 3.0 and isinstance(RunSpec.from_config(c).train.lr, float)


def test_algorithm_resolution_and_overrides():
  spec = RunSpec.from_config(_with("algo", "ppo"))
  assert (spec.algorithm.estimator, spec.algorithm.policy_loss, spec.algorithm.critic) == ("gae", "ppo", True)
  c = _with("loss.policy_loss", "gspo")
  c["loss"]["agg"] = "token-mean"
  spec = RunSpec.from_config(c)
  assert (spec.algorithm.policy_loss, spec.algorithm.estimator, spec.algorithm.agg) == ("gspo", "grpo", "token-mean")
  with pytest.raises(ValueError, match="config.loss.estimator='gae': GAE needs a critic"):
    RunSpec.from_config(_with("loss.estimator", "gae"))
  c = _with("loss.estimator", "rloo")
  c["rollout"]["num_chains"] = 1
  with pytest.raises(ValueError, match="config.rollout.num_chains=1: grpo needs >= 2 chains"):
    RunSpec.from_config(c)


def test_registered_names_are_accepted_without_an_edit():
  loss_name, est_name, sampler_name = "test_only_loss", "test_only_estimator", "test_only_sampler"
  for field, name in (("loss.policy_loss", loss_name), ("loss.estimator", est_name), ("rollout.sampler", sampler_name)):
    with pytest.raises(ValueError, match=f"config.{field}='{name}'"):
      RunSpec.from_config(_with(field, name))
  losses.register_policy_loss(loss_name, losses.policy_loss)
  advantages.register(est_name, advantages.grpo, advantages._TO_TOKENS["grpo"])
  samplers.register_sampler(sampler_name, samplers.build_jax_sampler)
  try:
    c = _with("loss.policy_loss", loss_name)
    c["loss"]["estimator"], c["rollout"]["sampler"] = est_name, sampler_name
    spec = RunSpec.from_config(c)
    assert (spec.algorithm.policy_loss, spec.algorithm.estimator) == (loss_name, est_name)
    assert loss_config(spec).policy_loss == loss_name
    assert prepare_config(spec, loss_config(spec), spec.algorithm.estimator, 8).estimator == est_name
    assert sampler_name in samplers.sampler_names()
    with pytest.raises(ValueError, match="already registered"):
      samplers.register_sampler(sampler_name, samplers.build_jax_sampler)
  finally:
    losses._POLICY_LOSSES.pop(loss_name)
    advantages._ESTIMATORS.pop(est_name)
    advantages._TO_TOKENS.pop(est_name)
    samplers._SAMPLERS.pop(sampler_name)


def test_loss_and_prepare_configs_come_from_the_sections():
  c = default_config()
  c.loss.clip_high, c.loss.kl_coef, c.loss.gamma, c.loss.tis_cap = 0.35, 0.01, 0.9, 2.0
  c.train.logits_capacity, c.rollout.temperature, c.dapo.overlong_buffer = (0.75, 0.5), 0.0, 8
  spec = RunSpec.from_config(c)
  lc = loss_config(spec)
  assert (lc.clip_high, lc.kl_coef, lc.agg, lc.temperature) == (0.35, 0.01, "seq-mean-token-mean", 1.0)
  assert lc.logits_capacity == (0.5, 0.75)
  assert loss_config(spec, decoupled=True).policy_loss == "decoupled_ppo"
  pc = prepare_config(spec, lc, "grpo", 4)
  assert (pc.gamma, pc.tis_cap, pc.overlong_buffer, pc.logits_capacity, pc.chunk) == (0.9, 2.0, 8, (0.5, 0.75), 4)
  assert pc.overlong_max_tokens == c.rollout.max_total_tokens and not pc.behaviour_logprobs


def test_a_view_takes_the_sections_fields_and_names_the_ones_not_given():
  @dataclasses.dataclass(frozen=True)
  class Settings:
    clip_low: float = 9.0  # a default that must not stand in for the spec's
    gamma: float = 9.0
    chunk: int = 1

  loss = RunSpec().loss
  assert view(Settings, loss, chunk=4) == Settings(loss.clip_low, loss.gamma, 4)
  with pytest.raises(TypeError, match=r"not given \['chunk'\]"):
    view(Settings, loss)
  with pytest.raises(TypeError, match=r"unknown \['chunks'\]"):
    view(Settings, loss, chunk=4, chunks=4)


def test_migrate_fills_what_old_versions_ran_with_and_keeps_what_they_saved():
  with open(os.path.join(SAVED_RUN, "config.json")) as f:
    saved = json.load(f)
  older = json.loads(json.dumps(saved))  # a version before these fields existed
  del older["train"]["logits_capacity"], older["mesh"]["sampler_devices"], older["model"]["attention_impl"]
  del older["mesh"]["rules"]["mlp"]
  older["model"].pop("lora", None)
  older["task"] = {"name": "mine", "module": "my_task"}  # a user task before `agent` / `mcp_servers`
  m = migrate(older)
  assert m.train.logits_capacity == ()  # log-probs at every position, as that version did
  assert m.mesh.sampler_devices == 0 and m.model.attention_impl == "flash" and m.model.lora.rank == 0
  assert m.mesh.rules.mlp == "tp" and m.mesh.rules.act_batch == "fsdp"  # rules merged key by key
  assert m.model.hidden_size == saved["model"]["hidden_size"] == 32 and m.name == "old_run"
  spec = RunSpec.from_config(older, custom_task=True)
  assert spec.task.module == "my_task" and spec.task.agent == "" and spec.task_name == "mine"
  assert spec.train.capacity == () and spec.model.lora.lora_config() is None
  # the 0e48eb0 run itself (it had logits_capacity) parses, keeping its value
  assert RunSpec.from_config(saved).train.logits_capacity == tuple(saved["train"]["logits_capacity"])
  # a current config comes back equal
  assert migrate(default_config()).to_dict() == default_config().to_dict()


def test_migrate_moves_a_user_tasks_env_fields_into_row_defaults():
  """config.task.gym_id / openenv_url / openenv_app (before config.task.row_defaults): a set group's fields become
  row defaults (both OpenEnv keys, so a row naming either server keeps its own); unset ones are dropped."""
  old_task = {"name": "mine", "module": "my_task", "gym_id": "", "openenv_url": "http://h:1", "openenv_app": ""}
  task = migrate({"task": old_task}).task
  assert task.to_dict() == {
    "name": "mine",
    "module": "my_task",
    "row_defaults": {"openenv_url": "http://h:1", "openenv_app": ""},
  }
  assert old_task["openenv_url"] == "http://h:1"  # the caller's dict kept
  task = migrate({"task": {"module": "m", "gym_id": "CliffWalking-v1", "openenv_url": "", "openenv_app": ""}}).task
  assert task.to_dict() == {"module": "m", "row_defaults": {"gym_id": "CliffWalking-v1"}}
  spec = RunSpec.from_config({"task": {"module": "m", "gym_id": "", "openenv_url": "", "openenv_app": ""}})
  assert spec.task.row_defaults == {} and spec.task.module == "m"
  with pytest.raises(ValueError, match=r"config\.task\.row_defaults: key 3 must be a row field name"):
    RunSpec.from_config({"task": {"module": "m", "row_defaults": {3: "x"}}})

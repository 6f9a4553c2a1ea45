"""Builds a run's components from its config: task, tokenizer, model(s), mesh, sampler, agent.

Random init (config.model.pretrained == ""): trains the task's tiny tokenizer into
`workdir/tokenizer` and builds a tiny model of `config.model.family`. Pretrained: loads the HF
folder (config.json + safetensors + tokenizer files) with `from_pretrained`.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
from flax import nnx


@dataclasses.dataclass
class Components:
  task: Any
  tokenizer: Any
  tokenizer_dir: str
  agent: Any
  sampler: Any
  mesh: Any
  graphdef: Any
  rest: Any
  params: Any
  param_specs: Any
  critic_graphdef: Any
  critic_rest: Any
  critic_params: Any
  critic_specs: Any
  train_rows: list
  eval_rows: list
  end_of_turn_id: int
  model_dir: str | None
  sampler_shardings: Any = None   # the sampler sub-mesh's param shardings (None: no sub-mesh)
  lora: Any = None                # models.lora.LoRAConfig when config.model.lora.rank > 0
  base_identity: dict | None = None  # LoRA: {"source", "sha256"} of the frozen base (checkpoints keep it)


def build_tokenizer_dir(config, task, workdir: str) -> str:
  if config.model.pretrained:
    return config.model.pretrained
  from agentfly_jax.data.tiny_tokenizer import build_tiny_tokenizer
  from agentfly_jax.rl import distributed
  out = os.path.join(workdir, "tokenizer")
  if distributed.is_primary() and not os.path.exists(os.path.join(out, "tokenizer.json")):
    build_tiny_tokenizer(out, task.tokenizer_corpus(), vocab_size=config.model.vocab_size,
                         template="qwen2.5")
  distributed.barrier("tokenizer")  # the other processes read what process 0 wrote
  return out


def model_numerics(config) -> dict:
  """ModelConfig fields that come from `config.model` whatever the architecture: dtypes, remat,
  attention chunking, scanned layers."""
  from agentfly_jax.rl.config import resolved_remat
  m = config.model
  return dict(dtype=m.dtype, param_dtype=m.param_dtype, remat=resolved_remat(config),
              attention_chunk=m.attention_chunk, attention_impl=m.get("attention_impl", "flash"),
              scan_layers=m.get("scan_layers", False))


def model_config(config, vocab_size: int):
  """The policy's ModelConfig: the HF folder's config.json (`model.pretrained`), else the tiny
  random-init architecture of `config.model`; numerics (dtype, param_dtype, remat, attention
  chunking) from `config.model` either way."""
  import json

  from agentfly_jax.models import ModelConfig, tiny_config
  m = config.model
  ours = model_numerics(config)
  if m.pretrained:
    path = os.path.join(m.pretrained, "config.json")
    if not os.path.isfile(path):
      raise FileNotFoundError(f"config.model.pretrained={m.pretrained!r}: {path} not found (need an HF folder)")
    with open(path) as f:
      return ModelConfig.from_hf_dict(json.load(f), source=path, **ours)
  return tiny_config(m.family, vocab_size=vocab_size, tie_word_embeddings=m.tie_word_embeddings,
                     hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
                     num_hidden_layers=m.num_layers, num_attention_heads=m.num_heads,
                     num_key_value_heads=m.num_kv_heads, head_dim=m.head_dim, **ours)


def build_model(config, vocab_size: int, *, critic: bool = False, lora: bool = True):
  """The policy (or critic) of `config`; with `config.model.lora.rank` > 0 (and `lora`) its
  projections carry LoRA adapters (the critic's only with `model.lora.critic`)."""
  from agentfly_jax.models import CausalLM, Critic, from_pretrained
  from agentfly_jax.models.lora import apply_lora, lora_config_from
  m = config.model
  if m.pretrained:
    model = from_pretrained(m.pretrained, critic=critic, seed=config.seed, **model_numerics(config))
  else:
    cfg = model_config(config, vocab_size)
    cls = Critic if critic else CausalLM
    model = cls(cfg, rngs=nnx.Rngs(config.seed + (17 if critic else 0)))
  lora_cfg = lora_config_from(m.get("lora"))
  if lora and lora_cfg is not None and (not critic or m.lora.get("critic", False)):
    apply_lora(model, lora_cfg, rngs=nnx.Rngs(config.seed + (31 if critic else 29)))
  return model


def trainable_filter(config, *, critic: bool = False):
  """What the optimizer trains: every nnx.Param, or under LoRA the adapters (the critic: its
  adapters + its value head `score`)."""
  from agentfly_jax.models.lora import lora_config_from, lora_filter
  lora = config.model.get("lora")
  if lora_config_from(lora) is None or (critic and not lora.get("critic", False)):
    return nnx.Param
  return lora_filter(nnx.PathContains("score")) if critic else lora_filter()


def base_identity(config, model) -> dict:
  """The frozen base of a LoRA run: where it came from and the sha256 of its params."""
  from agentfly_jax.models.lora import base_params, params_sha256
  m = config.model
  source = os.path.abspath(m.pretrained) if m.pretrained else f"random-init {m.family} seed={config.seed}"
  return {"source": source, "sha256": params_sha256(base_params(model))}


def training_and_sampler_meshes(config, devices=None):
  """(the trainer's (fsdp, tp) mesh, the JAX sampler's sub-mesh or None). With
  `mesh.sampler_devices = N > 0` the trainer takes the first fsdp * tp local devices and the
  sampler the last N (a (1, N) mesh: tensor parallel), so the two never share a device.
  `devices`: these instead of the local ones (experiments/aot_compile.py: a TPU topology's)."""
  from agentfly_jax.models import make_mesh
  m = config.mesh
  n = m.get("sampler_devices", 0)
  if not n:
    return make_mesh(m.fsdp, m.tp, devices), None
  if jax.process_count() > 1 and devices is None:
    raise ValueError("config.mesh.sampler_devices > 0 runs on one process (each process of a "
                     "multi-host run samples on its own local devices)")
  devices = jax.local_devices() if devices is None else list(devices)
  if m.fsdp * m.tp + n > len(devices):
    raise ValueError(f"config.mesh: fsdp={m.fsdp} x tp={m.tp} trainer devices + sampler_devices={n} "
                     f"need {m.fsdp * m.tp + n} devices; this host has {len(devices)}")
  return make_mesh(m.fsdp, m.tp, devices[:m.fsdp * m.tp]), make_mesh(1, n, devices[-n:])


def build_components(config, workdir: str, task=None) -> Components:
  from agentfly_jax.agents import ToolCallAgent, load_tokenizer
  from agentfly_jax.models import partition_specs, save_pretrained, shard_model
  from agentfly_jax.models.lora import lora_config_from, merge_lora
  from agentfly_jax.rl.config import ALGORITHMS
  from agentfly_jax.tasks.from_config import build_task

  task = build_task(config, task)
  tok_dir = build_tokenizer_dir(config, task, workdir)
  tokenizer = load_tokenizer(tok_dir)
  end_of_turn = tokenizer.token_to_id("<|im_end|>")
  if end_of_turn is None:
    end_of_turn = tokenizer.eos_token_id
  if end_of_turn is None:
    raise ValueError(f"tokenizer in {tok_dir} has neither <|im_end|> nor an eos token to stop turns on")

  rules = config.mesh.get("rules")  # None (a run saved before config.mesh.rules): the defaults
  mesh, sampler_mesh = training_and_sampler_meshes(config)
  model = build_model(config, tokenizer.vocab_size)
  # On several processes each runs its own sampler on its local devices: a second, unsharded
  # copy; with a sampler sub-mesh, a second copy placed on it (weight syncs copy across).
  sampler_model = model
  if jax.process_count() > 1 or sampler_mesh is not None:
    sampler_model = build_model(config, tokenizer.vocab_size)
  if sampler_mesh is not None:
    shard_model(sampler_model, sampler_mesh, rules)
  shard_model(model, mesh, rules)
  graphdef, params, rest = nnx.split(model, trainable_filter(config), ...)
  specs = partition_specs(params, mesh, rules)
  lora_cfg = lora_config_from(config.model.get("lora"))
  identity = None if lora_cfg is None else base_identity(config, model)

  c_graphdef = c_rest = c_params = c_specs = None
  if ALGORITHMS[config.algo]["critic"]:
    critic = build_model(config, tokenizer.vocab_size, critic=True)
    shard_model(critic, mesh, rules)
    c_graphdef, c_params, c_rest = nnx.split(critic, trainable_filter(config, critic=True), ...)
    c_specs = partition_specs(c_params, mesh, rules)

  model_dir = None
  if config.rollout.sampler == "vllm":
    from agentfly_jax.sampling import VllmSampler
    model_dir = config.model.pretrained or os.path.join(workdir, "init_model")
    if not config.model.pretrained:  # the base (zero-B adapters change nothing: merged = base)
      save_pretrained(model if lora_cfg is None else merge_lora(model), model_dir, tokenizer_dir=tok_dir)
    r = config.rollout
    engine = {"gpu_memory_utilization": config.gpu.vllm_mem_fraction} if config.gpu.vllm_mem_fraction else {}
    sampler = VllmSampler(model_dir, dtype=r.vllm_dtype or config.model.dtype,
                          max_model_len=r.max_total_tokens + r.max_tokens_per_turn, max_num_seqs=r.max_batch_size,
                          max_batch_size=r.max_batch_size, seed=config.seed, lora=lora_cfg, **engine)
  else:
    from agentfly_jax.sampling import JaxSampler
    r = config.rollout
    sampler = JaxSampler(sampler_model, tokenizer, max_batch_size=r.max_batch_size,
                         max_len=r.max_total_tokens + r.max_tokens_per_turn, seed=config.seed,
                         mesh=(sampler_mesh or mesh) if jax.process_count() == 1 else None, sharding_rules=rules)

  if hasattr(task, "make_agent"):
    agent = task.make_agent(tokenizer)
  else:
    agent = ToolCallAgent(tokenizer, tools=list(task.TOOLS), reward_fn=task.REWARD,
                          system_prompt=task.SYSTEM_PROMPT)
  train_rows = task.make_rows(2000, seed=config.seed)
  make_eval_rows = getattr(task, "make_eval_rows", None) or (
      lambda n, seed: task.make_rows(n, seed=999_983 + seed))  # task modules: a disjoint seed
  eval_rows = make_eval_rows(config.eval.num_rows, config.seed) if config.eval.num_rows else []
  return Components(task=task, tokenizer=tokenizer, tokenizer_dir=tok_dir, agent=agent, sampler=sampler,
                    mesh=mesh, graphdef=graphdef, rest=rest, params=params, param_specs=specs,
                    critic_graphdef=c_graphdef, critic_rest=c_rest, critic_params=c_params,
                    critic_specs=c_specs, train_rows=train_rows, eval_rows=eval_rows,
                    end_of_turn_id=int(end_of_turn), model_dir=model_dir,
                    sampler_shardings=None if sampler_mesh is None else jax.tree.map(
                        lambda x: x.sharding, nnx.state(sampler_model, trainable_filter(config))),
                    lora=lora_cfg, base_identity=identity)

"""Builds a run's parts from its RunSpec: task, tokenizer, model(s), meshes, sampler, agent.

    parts = build_run(spec, workdir)          # RunParts (typed): parts.task, parts.policy, ...

Random init (model.pretrained == ""): trains the task's tiny tokenizer into `workdir/tokenizer`
and builds a tiny model of `model.family`. Pretrained: loads the HF folder (config.json +
safetensors + tokenizer files) with `from_pretrained`. Every helper takes the run's RunSpec (the
config is parsed once, by the script: rl/scale/ and experiments/aot_compile.py use them too).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
from flax import nnx


@dataclasses.dataclass(frozen=True)
class ModelHalves:
  """A model split for jit: the static graphdef, the trained params (+ their PartitionSpecs) and
  the rest (non-trained state; under LoRA the frozen base)."""

  graphdef: Any
  params: Any
  rest: Any
  specs: Any


@dataclasses.dataclass(frozen=True)
class RunParts:
  """What `build_run` makes from a RunSpec: the task (tasks/contract.TaskSpec), tokenizer, agent,
  env provider, sampler, meshes, the policy's (and PPO's critic's) halves, the training row stream
  and the eval rows."""

  spec: Any
  task: Any
  tokenizer: Any
  tokenizer_dir: str
  end_of_turn_id: int
  agent: Any
  env_provider: Any
  sampler: Any
  model_dir: str | None  # the HF folder a vLLM engine loaded (None: the JAX sampler)
  mesh: Any
  sampler_mesh: Any  # the JAX sampler's own sub-mesh (None: it shares `mesh`)
  sampler_shardings: Any  # its params' shardings there (None: no sub-mesh)
  policy: ModelHalves
  critic: ModelHalves | None
  train_stream: Any  # data/row_stream.RowStream over the task's epoch rows
  eval_rows: list
  lora: Any = None  # models.lora.LoRAConfig when model.lora.rank > 0
  base_identity: dict | None = None  # LoRA: {"source", "sha256"} of the frozen base (checkpoints keep it)
  teacher: ModelHalves | None = None  # on-policy distillation's teacher (rl/teacher.py), sharded on `mesh`
  model_config: Any = None  # the policy's models.ModelConfig (a vision tower's shapes for the batch's images)


def build_tokenizer_dir(spec, task, workdir: str) -> str:
  if spec.model.pretrained:
    return spec.model.pretrained
  from agentfly_jax.data.tiny_tokenizer import build_tiny_tokenizer
  from agentfly_jax.rl import distributed

  out = os.path.join(workdir, "tokenizer")
  if distributed.is_primary() and not os.path.exists(os.path.join(out, "tokenizer.json")):
    template = "qwen2.5-vl" if spec.model.family == "qwen2_5_vl" else "qwen2.5"  # VL: image parts, vision tokens
    build_tiny_tokenizer(out, task.tokenizer_corpus(), vocab_size=spec.model.vocab_size, template=template)
  distributed.barrier("tokenizer")  # the other processes read what process 0 wrote
  return out


def model_numerics(spec) -> dict:
  """ModelConfig fields that come from `model` whatever the architecture: dtypes, remat,
  attention chunking, scanned layers."""
  m = spec.model
  return dict(
    dtype=m.dtype,
    param_dtype=m.param_dtype,
    remat=spec.remat,
    attention_chunk=m.attention_chunk,
    attention_impl=m.attention_impl,
    scan_layers=m.scan_layers,
  )


def model_config(spec, vocab_size: int, special_ids: dict | None = None):
  """The policy's ModelConfig: the HF folder's config.json (`model.pretrained`), else the tiny
  random-init architecture of `model`; numerics (dtype, param_dtype, remat, attention chunking)
  from `model` either way. `spec`: the run's RunSpec; `special_ids`: a random-init model's token ids
  from its tokenizer (`vision_token_ids`: image_token_id, ...)."""
  import json

  from agentfly_jax.models import ModelConfig, tiny_config

  m = spec.model
  ours = model_numerics(spec)
  if m.pretrained:
    path = os.path.join(m.pretrained, "config.json")
    if not os.path.isfile(path):
      raise FileNotFoundError(f"config.model.pretrained={m.pretrained!r}: {path} not found (need an HF folder)")
    with open(path) as f:
      return ModelConfig.from_hf_dict(json.load(f), source=path, **ours)
  return tiny_config(
    m.family,
    vocab_size=vocab_size,
    tie_word_embeddings=m.tie_word_embeddings,
    hidden_size=m.hidden_size,
    intermediate_size=m.intermediate_size,
    num_hidden_layers=m.num_layers,
    num_attention_heads=m.num_heads,
    num_key_value_heads=m.num_kv_heads,
    head_dim=m.head_dim,
    **(
      dict(
        num_experts=m.num_experts,
        num_experts_per_tok=m.num_experts_per_tok,
        moe_intermediate_size=m.moe_intermediate_size,
      )
      if m.family == "qwen3_moe"
      else {}
    ),
    **(special_ids or {}),
    **ours,
  )


def vision_token_ids(tokenizer) -> dict:
  """A Qwen2.5-VL model's special token ids ({image_token_id, video_token_id, vision_start_token_id,
  vision_end_token_id}) as `tokenizer` has them; a KeyError-free ValueError naming the missing tokens."""
  names = {
    "image_token_id": "<|image_pad|>",
    "video_token_id": "<|video_pad|>",
    "vision_start_token_id": "<|vision_start|>",
    "vision_end_token_id": "<|vision_end|>",
  }
  ids = {k: tokenizer.token_to_id(t) for k, t in names.items()}
  missing = [names[k] for k, v in ids.items() if v is None]
  if missing:
    raise ValueError(f"a qwen2_5_vl policy needs the tokens {missing} in its tokenizer")
  return ids


def vision_processor(spec, cfg):
  """The image processor of a vision-language policy (`cfg` its ModelConfig): a pretrained folder's
  preprocessor_config.json, else the tiny tower's patch geometry; resize bounds from `model.vision`
  (min_pixels / max_pixels, 0: the folder's, or a random-init model's TINY_MAX_PIXELS)."""
  from agentfly_jax.vision.processor import VisionProcessor

  v, folder = spec.model.vision, spec.model.pretrained
  bounds = {k: getattr(v, k) for k in ("min_pixels", "max_pixels") if getattr(v, k)}
  if folder and os.path.isfile(os.path.join(folder, "preprocessor_config.json")):
    return VisionProcessor.from_pretrained(folder, **bounds)
  if not folder:
    bounds.setdefault("max_pixels", TINY_MAX_PIXELS)
  return VisionProcessor.for_model(cfg.vision, **bounds)


TINY_MAX_PIXELS = 128 * 128  # a random-init tower's images: 1,024 patches of 4 x 4 at most, 256 image tokens


def build_model(spec, vocab_size: int, *, critic: bool = False, lora: bool = True, special_ids: dict | None = None):
  """The policy (or critic) of `spec`; with `model.lora.rank` > 0 (and `lora`) its projections
  carry LoRA adapters (the critic's only with `model.lora.critic`)."""
  from agentfly_jax.models import from_pretrained, model_class
  from agentfly_jax.models.lora import apply_lora

  m = spec.model
  if m.pretrained:
    model = from_pretrained(m.pretrained, critic=critic, seed=spec.seed, **model_numerics(spec))
  else:
    cfg = model_config(spec, vocab_size, special_ids)
    model = model_class(cfg, critic=critic)(cfg, rngs=nnx.Rngs(spec.seed + (17 if critic else 0)))
  lora_cfg = m.lora.lora_config()
  if lora and lora_cfg is not None and (not critic or m.lora.critic):
    apply_lora(model, lora_cfg, rngs=nnx.Rngs(spec.seed + (31 if critic else 29)))
  return model


def trainable_filter(spec, *, critic: bool = False, lora: bool = True):
  """What the optimizer trains: every nnx.Param, or under LoRA the adapters (the critic: its
  adapters + its value head `score`). A vision tower (`visual`) trains whole with
  `model.vision.train`, else it is frozen (in the rest, as LoRA's base). `lora`: False for a model
  built without adapters (`build_model(lora=False)`; the AOT tool's abstract policy), whatever
  `model.lora.rank` says."""
  from agentfly_jax.models.lora import lora_filter

  visual = nnx.All(nnx.Param, nnx.PathContains("visual"))
  adapters = spec.model.lora.rank > 0 and lora
  if not adapters or (critic and not spec.model.lora.critic):
    return nnx.Param if spec.model.vision.train else nnx.All(nnx.Param, nnx.Not(visual))
  if critic:
    return lora_filter(nnx.PathContains("score"))
  return lora_filter(visual) if spec.model.vision.train else lora_filter()


def base_identity(spec, model) -> dict:
  """The frozen base of a LoRA run: where it came from and the sha256 of its params."""
  from agentfly_jax.models.lora import base_params, params_sha256

  m = spec.model
  source = os.path.abspath(m.pretrained) if m.pretrained else f"random-init {m.family} seed={spec.seed}"
  return {"source": source, "sha256": params_sha256(base_params(model))}


def training_and_sampler_meshes(spec, devices=None):
  """(the trainer's (fsdp, tp) mesh, the JAX sampler's sub-mesh or None). With
  `mesh.sampler_devices = N > 0` the trainer takes the first fsdp * tp local devices and the
  sampler the last N (a (1, N) mesh: tensor parallel), so the two never share a device.
  `devices`: these instead of the local ones (experiments/aot_compile.py: a TPU topology's)."""
  from agentfly_jax.models import make_mesh

  m = spec.mesh
  n = m.sampler_devices
  if not n:
    return make_mesh(m.fsdp, m.tp, devices, expert=m.expert), None
  if jax.process_count() > 1 and devices is None:
    raise ValueError(
      "config.mesh.sampler_devices > 0 runs on one process (each process of a "
      "multi-host run samples on its own local devices)"
    )
  devices = jax.local_devices() if devices is None else list(devices)
  if m.fsdp * m.tp * m.expert + n > len(devices):
    raise ValueError(
      f"config.mesh: fsdp={m.fsdp} x tp={m.tp} trainer devices + sampler_devices={n} "
      f"need {m.fsdp * m.tp * m.expert + n} devices; this host has {len(devices)}"
    )
  k = m.fsdp * m.tp * m.expert
  return make_mesh(m.fsdp, m.tp, devices[:k], expert=m.expert), make_mesh(1, n, devices[-n:])


def _end_of_turn_id(tokenizer, tok_dir: str) -> int:
  end_of_turn = tokenizer.token_to_id("<|im_end|>")
  if end_of_turn is None:
    end_of_turn = tokenizer.eos_token_id
  if end_of_turn is None:
    raise ValueError(f"tokenizer in {tok_dir} has neither <|im_end|> nor an eos token to stop turns on")
  return int(end_of_turn)


def _split(spec, model, mesh, *, critic: bool = False) -> ModelHalves:
  from agentfly_jax.models import partition_specs

  graphdef, params, rest = nnx.split(model, trainable_filter(spec, critic=critic), ...)
  return ModelHalves(graphdef, params, rest, partition_specs(params, mesh, spec.mesh.rules))


def _policy_models(spec, vocab_size: int, mesh, sampler_mesh, special_ids: dict | None = None):
  """(the policy model sharded on `mesh`, the sampler's model): on several processes each runs
  its own sampler on its local devices (a second, unsharded copy); with a sampler sub-mesh, a
  second copy placed on it (weight syncs copy across); else the policy itself."""
  from agentfly_jax.models import shard_model

  rules = spec.mesh.rules
  model = build_model(spec, vocab_size, special_ids=special_ids)
  sampler_model = model
  if jax.process_count() > 1 or sampler_mesh is not None:
    sampler_model = build_model(spec, vocab_size, special_ids=special_ids)
  if sampler_mesh is not None:
    shard_model(sampler_model, sampler_mesh, rules)
  shard_model(model, mesh, rules)
  return model, sampler_model


def _critic_halves(spec, vocab_size: int, mesh) -> ModelHalves | None:
  """PPO's critic, sharded on `mesh` and split (None when the algorithm has no critic)."""
  from agentfly_jax.models import shard_model

  if not spec.algorithm.critic:
    return None
  critic_model = build_model(spec, vocab_size, critic=True)
  shard_model(critic_model, mesh, spec.mesh.rules)
  return _split(spec, critic_model, mesh, critic=True)


def _teacher_halves(spec, tokenizer, mesh) -> ModelHalves | None:
  """On-policy distillation's teacher (config.teacher, rl/teacher.py), its vocabulary checked against the
  student's first, loaded sharded on `mesh` (forward only: no remat), split; None without one."""
  from agentfly_jax.models import from_pretrained, partition_specs
  from agentfly_jax.rl.teacher import check_same_vocabulary

  t = spec.teacher
  if not t.pretrained:
    return None
  check_same_vocabulary(t.pretrained, tokenizer)
  numerics = {**model_numerics(spec), "remat": False}
  if t.dtype:
    numerics.update(dtype=t.dtype, param_dtype=t.dtype)
  model = from_pretrained(t.pretrained, mesh=mesh, sharding_rules=spec.mesh.rules, **numerics)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  return ModelHalves(graphdef, params, rest, partition_specs(params, mesh, spec.mesh.rules))


def _build_sampler(spec, sampler_model, model, tokenizer, tok_dir: str, workdir: str, mesh, sampler_mesh, lora_cfg):
  """The rollout sampler `spec.rollout.sampler` names (sampling/registry.py), built on the
  sampler's model (and `model`, the policy, for samplers that read it)."""
  from agentfly_jax.sampling.registry import SamplerRequest, build_sampler

  r = spec.rollout
  return build_sampler(
    r.sampler,
    SamplerRequest(
      model=sampler_model,
      policy=model,
      tokenizer=tokenizer,
      tokenizer_dir=tok_dir,
      workdir=workdir,
      seed=spec.seed,
      max_batch_size=r.max_batch_size,
      max_len=r.max_len,
      dtype=r.vllm_dtype or spec.model.dtype,
      mesh=(sampler_mesh or mesh) if jax.process_count() == 1 else None,
      rules=spec.mesh.rules,
      pretrained=spec.model.pretrained,
      lora=lora_cfg,
      engine={"gpu_memory_utilization": spec.gpu.vllm_mem_fraction} if spec.gpu.vllm_mem_fraction else {},
      prefix_cache_tokens=r.prefix_cache_tokens,
      paged=dict(
        page_size=r.kv_page_size,
        kv_cache_gib=r.kv_cache_gib or None,
        decode_steps=r.decode_steps,
        weight_update=r.weight_update,
        batch_invariant=r.batch_invariant,
        vision_patch_multiple=spec.model.vision.patch_multiple,  # a VL policy's patches: the train step's bucket
      ),
    ),
  )


def check_backend(spec, backend: str | None = None) -> None:
  """ValueError when the run asks for what this backend cannot run (`backend`: jax's default):
  attention_impl "pallas" is a TPU kernel (experiments/aot_compile.py compiles it for TPU
  topologies from any host)."""
  backend = backend or jax.default_backend()
  if spec.model.attention_impl == "pallas" and backend != "tpu":
    raise ValueError(
      f"model.attention_impl='pallas' is the TPU Pallas kernel, and this run's JAX backend is {backend!r}: "
      "use --config.model.attention_impl=flash here"
    )


def build_run(spec, workdir: str, task=None) -> RunParts:
  """Every part of a run from its RunSpec; `task`: the task already built (tasks/from_config.build_task,
  as train.py does before anything is built) or a Task given in Python, else `build_task(spec)` here.
  The tokenizer of a random-init model is trained into `workdir/tokenizer`."""
  from agentfly_jax.agents import load_tokenizer
  from agentfly_jax.data.row_stream import RowStream
  from agentfly_jax.envs.provider import DeferredEnvProvider
  from agentfly_jax.tasks.from_config import build_task, check_demo_policy

  check_backend(spec)
  if task is None:
    task = build_task(spec)
  else:
    check_demo_policy(spec, task)
  tok_dir = build_tokenizer_dir(spec, task, workdir)
  tokenizer = load_tokenizer(tok_dir)
  end_of_turn = _end_of_turn_id(tokenizer, tok_dir)
  mesh, sampler_mesh = training_and_sampler_meshes(spec)
  special_ids = vision_token_ids(tokenizer) if spec.model.family == "qwen2_5_vl" and not spec.model.pretrained else None
  model, sampler_model = _policy_models(spec, tokenizer.vocab_size, mesh, sampler_mesh, special_ids)
  policy = _split(spec, model, mesh)
  lora_cfg = spec.model.lora.lora_config()
  identity = None if lora_cfg is None else base_identity(spec, model)
  critic = _critic_halves(spec, tokenizer.vocab_size, mesh)
  teacher = _teacher_halves(spec, tokenizer, mesh)  # None without config.teacher.pretrained
  built = _build_sampler(spec, sampler_model, model, tokenizer, tok_dir, workdir, mesh, sampler_mesh, lora_cfg)
  agent = task.make_agent(tokenizer)
  if model.config.vision is not None:  # the agent reads images as the policy's tower takes them
    agent.vision = vision_processor(spec, model.config)
  train_stream = RowStream(task.epoch_rows(spec.seed), spec.seed)
  eval_rows = task.make_eval_rows(spec.eval.num_rows, spec.seed) if spec.eval.num_rows else []
  return RunParts(
    spec=spec,
    task=task,
    tokenizer=tokenizer,
    tokenizer_dir=tok_dir,
    end_of_turn_id=end_of_turn,
    agent=agent,
    # the run's env provider, passed to every rollout and read for the pool metrics (the agent's
    # own, else the process default: resolved when a chain first needs an environment)
    env_provider=DeferredEnvProvider(agent.env_provider),
    sampler=built.sampler,
    model_dir=built.model_dir,
    mesh=mesh,
    sampler_mesh=sampler_mesh,
    sampler_shardings=None
    if sampler_mesh is None
    else jax.tree.map(lambda x: x.sharding, nnx.state(sampler_model, trainable_filter(spec))),
    policy=policy,
    critic=critic,
    train_stream=train_stream,
    eval_rows=eval_rows,
    lora=lora_cfg,
    base_identity=identity,
    teacher=teacher,
    model_config=model.config,
  )

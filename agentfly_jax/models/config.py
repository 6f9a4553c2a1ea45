"""ModelConfig: the architecture of a decoder-only causal LM, with HF `config.json` field names.

One config describes the Qwen2/Qwen2.5, Qwen3, Qwen3-MoE and Llama 3 families (SmolLM2 is a Llama):

    cfg = ModelConfig.from_hf_dict(json.load(open("config.json")))
    cfg.to_hf_dict()                         # -> dict HF transformers reads back
    cfg = tiny_config("qwen3", vocab_size=512)   # random-init test configs
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from agentfly_jax.models.vision_config import VisionConfig, flat_vl_hf_dict, nest_vl_hf_dict

MODEL_TYPES = ("qwen2", "qwen3", "llama", "qwen3_moe", "qwen2_5_vl")
_ARCHITECTURES = {
  "qwen2": "Qwen2ForCausalLM",
  "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
  "qwen3": "Qwen3ForCausalLM",
  "llama": "LlamaForCausalLM",
  "qwen3_moe": "Qwen3MoeForCausalLM",
}
_CRITIC_ARCHITECTURES = {
  "qwen2": "Qwen2ForTokenClassification",
  "qwen3": "Qwen3ForTokenClassification",
  "llama": "LlamaForTokenClassification",
  "qwen3_moe": "Qwen3MoeForTokenClassification",
}
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
_ROPE_TYPES = ("default", "llama3", "linear")


def dtype_name(dtype: Any) -> str:
  """'float32' | 'bfloat16' | 'float16' for a dtype or its name; ValueError otherwise."""
  name = jnp.dtype(dtype).name if not isinstance(dtype, str) else dtype
  if name not in _DTYPES:
    raise ValueError(f"unsupported dtype {dtype!r}; expected one of {sorted(_DTYPES)}")
  return name


ATTENTION_IMPLS = ("flash", "checkpoint", "pallas")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture + numerics of a causal LM. Field names follow HF `config.json`.

  Attributes (HF names): model_type ('qwen2' | 'qwen3' | 'llama'), vocab_size, hidden_size,
  intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads (GQA),
  head_dim, rms_norm_eps, rope_theta, rope_scaling (None or {'rope_type': 'llama3' | 'linear',
  ...}), max_position_embeddings, tie_word_embeddings, attention_bias (q/k/v/o biases, Llama
  and Qwen3), mlp_bias (Llama), bos/eos/pad_token_id, initializer_range.
  Ours: dtype (compute dtype name), param_dtype (parameter dtype name), remat (per decoder
  layer: a policy name of models/remat.py, "none" | "full" | "dots_saveable" | ...; or a bool),
  num_labels (critic head width; 1), matmul_precision ('highest' | 'high' |
  'default', jax.lax.Precision for every matmul: 'highest' keeps float32 exact on GPU, where
  'default' would use TF32 and drift ~5e-4 from HF; use 'default' for speed), attention_chunk
  (> 0: self-attention without a cache runs this many queries at a time, reading only the keys up
  to the block's end (causal), with no [B, H, T, T] kept for the backward pass; 0: one masked
  square, differentiated by XLA; default 512), attention_impl ("flash": `flash_attention.py`, a
  custom VJP from the saved per-row softmax statistics, at every length; "checkpoint": blocks
  under jax.checkpoint when T > chunk; "pallas": TPU only, jax.experimental's Pallas flash-attention
  kernel (`pallas_attention.py`), `attention_chunk` unused. "flash" is the default because it is the
  fastest path at long rows without the chunked path's longer compile: ~0.8x checkpoint's SmolLM2
  policy step at T=2048, lab/results/bench_train_step_ab_flash.md),
  fuse_projections (q/k/v and gate/up each as one GEMM over their concatenated kernels when a
  call has >= cpu_kernels.FUSE_MIN_ROWS tokens, i.e. training and prefill, not decode; the params stay
  separate, so names and checkpoints are unchanged; a faster CPU train step: lab/results/cpu_code_paths/README.md),
  scan_layers (True: the decoder layers are one `DecoderLayer` whose params carry a leading
  [num_hidden_layers] axis (logical name "layers"), run under `lax.scan`; compile time stays flat
  in depth; `models/layer_stack.py` converts states between the two layouts).
  Qwen2 always has q/k/v biases (no o bias); Qwen3 and Qwen3-MoE always have q/k RMSNorm.
  Mixture of experts (model_type "qwen3_moe", HF names; models/moe.py): num_experts (0 = dense),
  num_experts_per_tok (top k), moe_intermediate_size (each expert's SwiGLU width), norm_topk_prob
  (the k routing weights renormalised to sum to 1), decoder_sparse_step / mlp_only_layers (which
  layers are sparse: `is_moe_layer`; the others are a dense MLP of intermediate_size),
  router_aux_loss_coef (kept for the HF config; the trainer's coefficient is loss.router_aux_coef).
  Vision-language (model_type "qwen2_5_vl": a Qwen2 language model + a vision tower, models/qwen25_vl.py):
  vision (a models/vision_config.py VisionConfig), mrope_section (how the head_dim // 2 rotary
  frequencies split between temporal / height / width positions; positions may then be [3, B, T]),
  image_token_id / video_token_id / vision_start_token_id / vision_end_token_id (HF names).
  """

  model_type: str = "qwen2"
  vocab_size: int = 151936
  hidden_size: int = 896
  intermediate_size: int = 4864
  num_hidden_layers: int = 24
  num_attention_heads: int = 14
  num_key_value_heads: int = 2
  head_dim: int | None = None
  rms_norm_eps: float = 1e-6
  rope_theta: float = 1_000_000.0
  rope_scaling: dict | None = None
  max_position_embeddings: int = 32768
  tie_word_embeddings: bool = True
  attention_bias: bool = False
  mlp_bias: bool = False
  bos_token_id: int | None = None
  eos_token_id: int | list | None = None
  pad_token_id: int | None = None
  initializer_range: float = 0.02
  hidden_act: str = "silu"
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: bool | str = False
  num_labels: int = 1
  matmul_precision: str = "highest"
  attention_chunk: int = 512
  attention_impl: str = "flash"
  fuse_projections: bool = True
  scan_layers: bool = False
  num_experts: int = 0
  num_experts_per_tok: int = 8
  moe_intermediate_size: int = 768
  norm_topk_prob: bool = False
  decoder_sparse_step: int = 1
  mlp_only_layers: tuple = ()
  router_aux_loss_coef: float = 0.001
  vision: VisionConfig | None = None
  mrope_section: tuple = ()
  image_token_id: int | None = None
  video_token_id: int | None = None
  vision_start_token_id: int | None = None
  vision_end_token_id: int | None = None

  def __post_init__(self):
    if self.head_dim is None:
      object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
    object.__setattr__(self, "dtype", dtype_name(self.dtype))
    object.__setattr__(self, "param_dtype", dtype_name(self.param_dtype))
    if self.rope_scaling is not None:
      object.__setattr__(self, "rope_scaling", dict(self.rope_scaling))
    object.__setattr__(self, "mlp_only_layers", tuple(self.mlp_only_layers or ()))
    object.__setattr__(self, "mrope_section", tuple(self.mrope_section or ()))
    if isinstance(self.vision, dict):
      object.__setattr__(self, "vision", VisionConfig(**self.vision))
    self.validate()

  def validate(self) -> None:
    """Raises ValueError naming the bad field."""
    if self.model_type not in MODEL_TYPES:
      raise ValueError(f"ModelConfig.model_type {self.model_type!r} is not supported; expected one of {MODEL_TYPES}")
    for name in (
      "vocab_size",
      "hidden_size",
      "intermediate_size",
      "num_hidden_layers",
      "num_attention_heads",
      "num_key_value_heads",
      "head_dim",
    ):
      value = getattr(self, name)
      if not (isinstance(value, int) and value >= 1):
        raise ValueError(f"ModelConfig.{name} must be an int >= 1, got {value!r}")
    if self.num_attention_heads % self.num_key_value_heads:
      raise ValueError(
        f"ModelConfig.num_attention_heads ({self.num_attention_heads}) must be a multiple "
        f"of num_key_value_heads ({self.num_key_value_heads})"
      )
    if self.head_dim % 2:
      raise ValueError(f"ModelConfig.head_dim must be even for RoPE, got {self.head_dim}")
    if self.hidden_act != "silu":
      raise ValueError(f"ModelConfig.hidden_act {self.hidden_act!r} is not supported; only 'silu'")
    if not (isinstance(self.attention_chunk, int) and self.attention_chunk >= 0):
      raise ValueError(f"ModelConfig.attention_chunk must be an int >= 0, got {self.attention_chunk!r}")
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ValueError(f"ModelConfig.attention_impl {self.attention_impl!r} is not one of {ATTENTION_IMPLS}")
    if self.matmul_precision not in ("highest", "high", "default", "float32", "tensorfloat32", "bfloat16"):
      raise ValueError(f"ModelConfig.matmul_precision {self.matmul_precision!r} is not a jax.lax.Precision name")
    from agentfly_jax.models.remat import remat_name

    try:
      remat_name(self.remat)
    except ValueError as e:
      raise ValueError(f"ModelConfig.remat: {e}") from None
    self._validate_moe()
    self._validate_vision()
    if self.rope_scaling is not None and self.rope_type not in _ROPE_TYPES:
      raise ValueError(
        f"ModelConfig.rope_scaling rope_type {self.rope_type!r} is not supported; expected one of {_ROPE_TYPES}"
      )

  def _validate_moe(self) -> None:
    if self.model_type != "qwen3_moe":
      if self.num_experts:
        raise ValueError(f"ModelConfig.num_experts={self.num_experts} needs model_type 'qwen3_moe'")
      return
    if not (isinstance(self.num_experts, int) and self.num_experts >= 0):
      raise ValueError(f"ModelConfig.num_experts must be an int >= 0, got {self.num_experts!r}")
    if self.num_experts:
      for name in ("num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step"):
        value = getattr(self, name)
        if not (isinstance(value, int) and value >= 1):
          raise ValueError(f"ModelConfig.{name} must be an int >= 1, got {value!r}")
      if self.num_experts_per_tok > self.num_experts:
        raise ValueError(
          f"ModelConfig.num_experts_per_tok ({self.num_experts_per_tok}) exceeds num_experts ({self.num_experts})"
        )
    bad = [i for i in self.mlp_only_layers if not (isinstance(i, int) and 0 <= i < self.num_hidden_layers)]
    if bad:
      raise ValueError(f"ModelConfig.mlp_only_layers {bad} are not layer indices in [0, {self.num_hidden_layers})")
    if self.scan_layers and len({self.is_moe_layer(i) for i in range(self.num_hidden_layers)}) > 1:
      raise ValueError(
        "ModelConfig.scan_layers needs every decoder layer alike, but mlp_only_layers="
        f"{list(self.mlp_only_layers)} / decoder_sparse_step={self.decoder_sparse_step} mix sparse and dense layers"
      )

  def _validate_vision(self) -> None:
    if self.model_type != "qwen2_5_vl":
      if self.vision is not None or self.mrope_section:
        raise ValueError(f"ModelConfig.vision / mrope_section need model_type 'qwen2_5_vl', not {self.model_type!r}")
      return
    if not isinstance(self.vision, VisionConfig):
      raise ValueError(f"ModelConfig.vision must be a VisionConfig for model_type 'qwen2_5_vl', got {self.vision!r}")
    if self.vision.out_hidden_size != self.hidden_size:
      raise ValueError(
        f"ModelConfig.vision.out_hidden_size ({self.vision.out_hidden_size}) must equal hidden_size ({self.hidden_size})"
      )
    if self.head_dim != self.hidden_size // self.num_attention_heads:
      raise ValueError(
        f"ModelConfig.head_dim ({self.head_dim}) must be hidden_size // num_attention_heads for qwen2_5_vl"
      )
    section = self.mrope_section
    if (
      len(section) != 3 or not all(isinstance(n, int) and n >= 0 for n in section) or sum(section) * 2 != self.head_dim
    ):
      raise ValueError(
        f"ModelConfig.mrope_section {list(section)} must be 3 ints summing to head_dim // 2 ({self.head_dim // 2})"
      )
    if not isinstance(self.image_token_id, int):
      raise ValueError(f"ModelConfig.image_token_id must be an int for qwen2_5_vl, got {self.image_token_id!r}")

  @property
  def is_moe(self) -> bool:
    """True when some decoder layer is a sparse mixture of experts."""
    return any(self.is_moe_layer(i) for i in range(self.num_hidden_layers))

  def is_moe_layer(self, layer_idx: int) -> bool:
    """Layer `layer_idx` is a sparse MoE block (HF Qwen3MoeDecoderLayer's rule)."""
    return (
      self.num_experts > 0 and layer_idx not in self.mlp_only_layers and (layer_idx + 1) % self.decoder_sparse_step == 0
    )

  @property
  def placeholder_token_ids(self) -> tuple[int, ...]:
    """Ids the model never writes: a vision-language model's image / video placeholders and vision
    delimiters (they stand for pixels the processor puts in a prompt; a written one would be an image token
    with no image). Samplers never draw them and the trainer's log-probs leave them out of the softmax
    (models/token_stats.py), so both see one distribution; `()` for a text model."""
    if self.vision is None:
      return ()
    ids = (self.image_token_id, self.video_token_id, self.vision_start_token_id, self.vision_end_token_id)
    return tuple(sorted({int(i) for i in ids if i is not None}))

  @property
  def moe_layers(self) -> tuple[int, ...]:
    """Indices of the sparse decoder layers (the order of router outputs and replayed routes)."""
    return tuple(i for i in range(self.num_hidden_layers) if self.is_moe_layer(i))

  def __hash__(self):  # rope_scaling is a dict; nnx keeps the config as static module metadata
    return hash(tuple((f.name, repr(getattr(self, f.name))) for f in dataclasses.fields(self)))

  @property
  def rope_type(self) -> str:
    if not self.rope_scaling:
      return "default"
    return self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "default"))

  @property
  def compute_dtype(self):
    return _DTYPES[self.dtype]

  @property
  def params_dtype(self):
    return _DTYPES[self.param_dtype]

  @property
  def qkv_bias(self) -> bool:
    return self.model_type in ("qwen2", "qwen2_5_vl") or self.attention_bias

  @property
  def o_bias(self) -> bool:
    return self.model_type not in ("qwen2", "qwen2_5_vl") and self.attention_bias

  @property
  def qk_norm(self) -> bool:
    return self.model_type in ("qwen3", "qwen3_moe")

  def replace(self, **changes) -> "ModelConfig":
    return dataclasses.replace(self, **changes)

  # ---- HF config.json ----------------------------------------------------------------------
  @classmethod
  def from_hf_dict(cls, hf: dict, *, source: str = "config.json", **overrides) -> "ModelConfig":
    """Builds a config from a HF `config.json` dict (transformers 4.x or 5.x layout).

    Raises ValueError naming `source` and the field for unknown architectures, sliding-window
    attention and unsupported rope scaling.
    """
    if not isinstance(hf, dict):
      raise ValueError(f"{source}: expected a JSON object, got {type(hf).__name__}")
    model_type = hf.get("model_type")
    if model_type == "qwen2_5_vl":
      hf = flat_vl_hf_dict(hf, source=source)
    if model_type not in MODEL_TYPES:
      arch = hf.get("architectures")
      raise ValueError(
        f"{source}: unknown architecture (model_type={model_type!r}, architectures={arch!r}); "
        f"supported model_type values: {MODEL_TYPES}"
      )
    if hf.get("use_sliding_window"):
      raise ValueError(f"{source}: use_sliding_window=true is not supported")
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in hf.items() if k in fields and k not in ("dtype",)}
    # transformers 5 puts rope_theta / rope_type inside `rope_parameters`.
    rope = hf.get("rope_parameters") or hf.get("rope_scaling")
    if isinstance(rope, dict):
      rope = dict(rope)
      if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"{source}: partial_rotary_factor={rope['partial_rotary_factor']} is not supported")
      rope.pop("partial_rotary_factor", None)
      if "rope_theta" in rope:
        kwargs["rope_theta"] = rope.pop("rope_theta")
      rope_type = rope.get("rope_type", rope.get("type", "default"))
      kwargs["rope_scaling"] = None if rope_type == "default" else rope
    if kwargs.get("head_dim") is None:
      kwargs.pop("head_dim", None)
    if model_type == "qwen3_moe" and "num_experts" not in kwargs and "num_local_experts" in hf:
      kwargs["num_experts"] = hf["num_local_experts"]
    kwargs.update(overrides)
    try:
      return cls(**kwargs)
    except (TypeError, ValueError) as e:
      raise ValueError(f"{source}: {e}") from e

  def to_hf_dict(self, *, critic: bool = False) -> dict:
    """The HF `config.json` dict (loads in transformers as Qwen2/Qwen3/Llama *ForCausalLM, or
    *ForTokenClassification with num_labels=1 when `critic`)."""
    arch = (_CRITIC_ARCHITECTURES if critic else _ARCHITECTURES)[self.model_type]
    out = {
      "architectures": [arch],
      "model_type": self.model_type,
      "vocab_size": self.vocab_size,
      "hidden_size": self.hidden_size,
      "intermediate_size": self.intermediate_size,
      "num_hidden_layers": self.num_hidden_layers,
      "num_attention_heads": self.num_attention_heads,
      "num_key_value_heads": self.num_key_value_heads,
      "head_dim": self.head_dim,
      "hidden_act": self.hidden_act,
      "rms_norm_eps": self.rms_norm_eps,
      "rope_theta": self.rope_theta,
      "max_position_embeddings": self.max_position_embeddings,
      "tie_word_embeddings": self.tie_word_embeddings,
      "attention_bias": self.attention_bias,
      "initializer_range": self.initializer_range,
      "bos_token_id": self.bos_token_id,
      "eos_token_id": self.eos_token_id,
      "pad_token_id": self.pad_token_id,
      "dtype": self.param_dtype,
      "use_cache": True,
    }
    if self.model_type == "llama":
      out["mlp_bias"] = self.mlp_bias
    if self.model_type == "qwen3_moe":
      out.update(
        num_experts=self.num_experts,
        num_experts_per_tok=self.num_experts_per_tok,
        moe_intermediate_size=self.moe_intermediate_size,
        norm_topk_prob=self.norm_topk_prob,
        decoder_sparse_step=self.decoder_sparse_step,
        mlp_only_layers=list(self.mlp_only_layers),
        router_aux_loss_coef=self.router_aux_loss_coef,
        output_router_logits=False,
      )
    if self.model_type in ("qwen2", "qwen3", "qwen3_moe", "qwen2_5_vl"):
      out["use_sliding_window"] = False
      out["sliding_window"] = None
      out["max_window_layers"] = self.num_hidden_layers
    out["rope_parameters"] = {"rope_type": "default", "rope_theta": self.rope_theta, **(self.rope_scaling or {})}
    if self.rope_scaling:  # transformers 4.x reads this name
      out["rope_scaling"] = dict(self.rope_scaling)
    if critic:
      out["num_labels"] = self.num_labels
      out["id2label"] = {str(i): f"LABEL_{i}" for i in range(self.num_labels)}
      out["label2id"] = {f"LABEL_{i}": i for i in range(self.num_labels)}
    return nest_vl_hf_dict(out, self) if self.model_type == "qwen2_5_vl" else out


def tiny_config(
  model_type: str = "qwen2", *, vocab_size: int = 256, tie_word_embeddings: bool = True, **overrides
) -> ModelConfig:
  """A small random-init test config (2 layers, d=128, 4 heads / 2 KV heads of head_dim 32).

  head_dim 32 (or 64) keeps vLLM's CPU attention happy. `overrides` are any ModelConfig fields,
  e.g. `rope_scaling={"rope_type": "llama3", ...}`, `dtype="bfloat16"`, `remat=True`.
  "qwen3_moe": 8 experts of width 64, 2 a token (renormalised), every layer sparse.
  "qwen2_5_vl": a 3-block vision tower (width 64, 2 heads, 4-pixel patches, 2x2 merge, 16-pixel
  windows, block 1 full attention), mrope_section (4, 6, 6), image token id vocab_size - 3.
  """
  if model_type not in MODEL_TYPES:
    raise ValueError(f"tiny_config: model_type {model_type!r} is not one of {MODEL_TYPES}")
  kwargs = dict(
    model_type=model_type,
    vocab_size=vocab_size,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    max_position_embeddings=2048,
    tie_word_embeddings=tie_word_embeddings,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
  )
  if model_type == "qwen3_moe":  # 8 experts of width 64, top 2
    kwargs.update(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=True)
  if model_type == "qwen2_5_vl":
    vision = VisionConfig(
      depth=3,
      hidden_size=64,
      intermediate_size=96,
      num_heads=2,
      patch_size=4,
      temporal_patch_size=2,
      spatial_merge_size=2,
      window_size=16,
      fullatt_block_indexes=(1,),
      out_hidden_size=overrides.get("hidden_size", 128),
    )
    kwargs.update(vision=vision, mrope_section=(4, 6, 6), image_token_id=vocab_size - 3)
    kwargs.update(
      video_token_id=vocab_size - 4, vision_start_token_id=vocab_size - 2, vision_end_token_id=vocab_size - 1
    )
  kwargs.update(overrides)
  return ModelConfig(**kwargs)

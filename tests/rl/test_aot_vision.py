"""experiments/aot_compile.py for a vision-language policy (Qwen2.5-VL): its programs take each row's images,
and split the policy as the trainer does (a frozen vision tower in the rest). Tiny configs on v5e:2x2, lowered
only; the compiled rows at real sizes: lab/results/aot_tpu.md."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from train_cli import ROOT  # noqa: E402

from agentfly_jax.rl.spec import RunSpec

pytest.importorskip("libtpu", reason="jax[tpu] (libtpu) is needed for TPU compile-only")


def vl_config():
  """configs/lookup_grpo.py with a Qwen2.5-VL policy on 4 chips, rows of 128 tokens."""
  spec = importlib.util.spec_from_file_location("lookup_grpo", os.path.join(ROOT, "configs", "lookup_grpo.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  config = mod.get_config()
  config.mesh.fsdp = 4
  config.model.family, config.model.vision.patch_multiple = "qwen2_5_vl", 64
  config.rollout.max_total_tokens, config.rollout.max_tokens_per_turn = 128, 16
  return config


def test_a_vision_language_step_takes_each_rows_images(tmp_path):
  """A Qwen2.5-VL policy's prepare / train_step take each row's images as the trainer's batches hold them
  (rl/vision_batch.image_arrays through the policy's processor: the same keys, shapes and dtypes), the vision
  tower in the programs (its parameters counted; both programs lowered with the images). Tiny config on v5e:2x2;
  the compiled rows at real sizes: lab/results/aot_tpu.md."""
  import types

  import numpy as np
  from PIL import Image

  from agentfly_jax.models import tiny_config
  from agentfly_jax.rl.scale import aot
  from agentfly_jax.rl.scale.aot_programs import abstract_run, abstract_step_arrays, batch_note, train_step_args
  from agentfly_jax.rl.setup import vision_processor
  from agentfly_jax.rl.vision_batch import image_arrays

  spec = RunSpec.from_config(vl_config())
  cfg = tiny_config("qwen2_5_vl", vocab_size=256, num_hidden_layers=2, scan_layers=True)
  devices = aot.topology_devices("v5e:2x2")
  run = abstract_run(spec, cfg, devices, 128, images="2x40x56")
  n_rows, arrays = abstract_step_arrays(run)
  images = [Image.fromarray(np.random.default_rng(i).integers(0, 255, (56, 40, 3), np.uint8)) for i in range(2)]
  processor = vision_processor(spec, cfg)
  grids = processor.process(images)[1]
  ids = [5] * 20 + [cfg.image_token_id] * sum(processor.num_image_tokens(grids)) + [6] * 10
  traj = types.SimpleNamespace(images=images, image_grid_thw=grids, token_ids=ids, group_id=0, chain_id=0)
  want = image_arrays([traj] * n_rows, processor, cfg, length=128, patch_multiple=64)
  for k, v in want.items():
    assert (arrays[k].shape, arrays[k].dtype) == (v.shape, v.dtype), k
  assert run.images.tokens == sum(processor.num_image_tokens(grids)) > 0
  tokens = sum(processor.num_image_tokens(grids))
  assert f"2 images of 40x56 ({want['pixel_values'].shape[1]} patches, {tokens} tokens) a row" in batch_note(run)
  text = abstract_run(spec, tiny_config("qwen2", vocab_size=256, num_hidden_layers=2, scan_layers=True), devices, 1)
  assert run.num_params > text.num_params  # + the tower
  # both programs trace and lower with the images (compiling the tower for TPU is the table's job: minutes)
  ref = run.params if spec.loss.kl_coef > 0 else None
  run.update.prepare.lower(run.params, ref, run.critic_params, arrays, run.update.frozen)  # as the trainer calls it
  program, args, _, _ = train_step_args(run)
  assert args[1]["pixel_values"].shape[2:] == arrays["pixel_values"].shape[1:]
  program.lower(*args)

  path = tmp_path / "config.json"
  path.write_text(json.dumps(cfg.to_hf_dict()))
  with pytest.raises(aot.BadInput, match="--images='2x40': give COUNTxWIDTHxHEIGHT"):
    aot.compile_run(spec, "v5e:2x2", str(path), programs=("train_step",), images="2x40")
  with pytest.raises(
    aot.BadInput, match=r"--images='4x200x200': the row's images take \d+ image tokens, a row holds 128"
  ):
    aot.compile_run(spec, "v5e:2x2", str(path), programs=("train_step",), seq_len=128, images="4x200x200")
  with pytest.raises(aot.BadInput, match="--images='2x40x56': model_type 'qwen2' has no vision tower"):
    aot.compile_run(spec, "v5e:2x2", programs=("train_step",), images="2x40x56")  # the spec's text warm start


def test_a_frozen_vision_tower_is_in_the_rest_not_the_trained_params():
  """The abstract run splits the policy as the trainer does (rl/setup.trainable_filter): with `model.vision.train`
  False the tower (`visual`) is in the rest, placed by the partition rules and passed to prepare and the train step
  as an argument (never a constant), with no gradient or Adam moments in the train state; with it True the reverse.
  The parameter counts hold the tower either way. Lowered only (compiling the tower for TPU: lab/results/aot_tpu.md)."""
  import jax
  from flax import nnx

  from agentfly_jax.models import tiny_config
  from agentfly_jax.rl.scale import aot
  from agentfly_jax.rl.scale.aot_programs import abstract_run, abstract_step_arrays, train_step_args

  def visual(tree) -> list:
    return [k for k, _ in jax.tree_util.tree_leaves_with_path(tree) if "visual" in jax.tree_util.keystr(k)]

  config = vl_config()
  cfg = tiny_config("qwen2_5_vl", vocab_size=256, num_hidden_layers=2, scan_layers=True)
  devices = aot.topology_devices("v5e:2x2")
  runs = {}
  for train in (False, True):
    config.model.vision.train = train
    runs[train] = run = abstract_run(RunSpec.from_config(config), cfg, devices, 128, images="2x40x56")
    trained, frozen = visual(run.params), visual(nnx.state(run.rest, nnx.Param))
    assert (bool(trained), bool(frozen)) == (train, not train)
    assert bool(visual(run.state.opt_state)) == train and bool(visual(run.state.params)) == train
    assert visual(run.update.frozen[0]) == frozen and visual(run.sampler_rest) == frozen
    for leaf in jax.tree.leaves(run.rest):  # the rest's shardings are the partition rules', as shard_model's
      assert leaf.sharding.mesh == run.mesh
    _, arrays = abstract_step_arrays(run)
    program, args, _, _ = train_step_args(run)
    assert args[2] is run.update.frozen
    state_info, _, rest_info = program.lower(*args).args_info[0]  # the state donated, the rest an argument, kept
    assert all(a.donated for a in jax.tree.leaves(state_info))
    assert len(jax.tree.leaves(rest_info)) == len(jax.tree.leaves(run.rest)) and not any(
      a.donated for a in jax.tree.leaves(rest_info)
    )
    ref = run.params if run.spec.loss.kl_coef > 0 else None
    run.update.prepare.lower(run.params, ref, run.critic_params, arrays, run.update.frozen)
  assert runs[False].num_params == runs[True].num_params
  tower = sum(x.size for x in jax.tree.leaves(nnx.state(runs[False].rest, nnx.Param)))
  assert tower > 0
  count = lambda run: sum(x.size for x in jax.tree.leaves(run.state.params))  # noqa: E731
  assert count(runs[True]) - count(runs[False]) == tower
  # a text policy has nothing frozen: its rest is empty, its programs as before
  text = abstract_run(runs[False].spec, tiny_config("qwen2", vocab_size=256, num_hidden_layers=2), devices, 64)
  assert jax.tree.leaves(text.rest) == [] and count(text) == text.num_params

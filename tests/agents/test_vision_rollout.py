"""Chains whose tools return images: observation messages with image parts, trajectories carrying the images,
token ids equal HF's Qwen2.5-VL processor on the whole conversation, image tokens never under the action mask."""

from __future__ import annotations

import numpy as np

from agent_testlib import hermes_call
from agentfly_jax import tool
from agentfly_jax.agents import ToolCallAgent, run_rollout
from agentfly_jax.agents.trajectory import Trajectory
from agentfly_jax.sampling.scripted import ScriptedSampler
from agentfly_jax.vision.decode import image_png_bytes
from agentfly_jax.vision.processor import VisionProcessor
from tests.agents.vision_testlib import hf_processor, random_image, vl_tokenizer

EOT = "<|im_end|>"
SIZES = {"small": (41, 57), "wide": (60, 230), "tall": (150, 40)}


def _image_tools(seed):
  rng = np.random.default_rng(seed)
  images = {name: random_image(rng, *hw) for name, hw in SIZES.items()}

  @tool
  def look(name: str):
    """Looks at a picture.

    Args:
      name: which picture.
    """
    if name == "broken":
      return ["here:", b"\x89PNG\r\n\x1a\n not an image"]
    if name == "array":
      return np.asarray(images["small"])
    return [f"picture {name}:", image_png_bytes(images[name]), "end"]

  return look, images


def _script(tok, turns):
  def script(prompt_ids):
    k = tok.decode(prompt_ids).count("<|im_start|>assistant") - 1
    return tok.encode(turns[min(k, len(turns) - 1)] + EOT)

  return script


def _agent(look, vision=True):
  agent = ToolCallAgent(vl_tokenizer(), tools=[look])
  agent.vision = VisionProcessor() if vision else None
  return agent


def test_tool_images_become_observation_parts_and_the_tokens_equal_hf():
  look, images = _image_tools(1)
  turns = [
    hermes_call("look", {"name": "wide"}) + hermes_call("look", {"name": "tall"}),
    hermes_call("look", {"name": "array"}),
    "Three pictures seen.",
  ]
  agent = _agent(look)
  sampler = ScriptedSampler(_script(agent.tokenizer, turns))
  [traj] = run_rollout(agent, [{"question": "Look."}], sampler=sampler, num_chains=1, max_turns=4)
  assert traj.error is None and traj.finish_reason == "no_tool_call" and traj.num_turns == 3
  assert [c["observation"] for c in traj.tool_calls] == [
    "picture wide:<image>end",
    "picture tall:<image>end",
    "<image>",
  ]
  assert len(traj.images) == 3
  for got, want in zip(traj.images, [images["wide"], images["tall"], images["small"]]):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))

  # Qwen2.5-VL's published template renders an assistant message's content only (no tool_calls field): the
  # reference conversation holds each model turn's text as the model wrote it
  written = iter(agent.tokenizer.decode(r.token_ids[:-1]) for _, r in sampler.calls)
  reference = [
    {"role": "assistant", "content": next(written)} if m["role"] == "assistant" else m for m in traj.messages
  ]
  hf = hf_processor().apply_chat_template(reference, tokenize=True, return_dict=True, return_tensors="np")
  hf_ids = hf["input_ids"][0]
  # the chain ends after the last model turn; HF's rendering adds the template's trailing "\n"
  np.testing.assert_array_equal(traj.token_ids, hf_ids[: len(traj)])
  assert agent.tokenizer.decode(hf_ids[len(traj) :]) == "\n"
  np.testing.assert_array_equal(traj.image_grid_thw, hf["image_grid_thw"])
  pixel_values, grid = VisionProcessor().process(traj.images)
  np.testing.assert_allclose(pixel_values, hf["pixel_values"], rtol=0, atol=1e-6)
  np.testing.assert_array_equal(grid, traj.image_grid_thw)

  pad = agent.tokenizer.token_to_id("<|image_pad|>")
  is_image = traj.token_ids == pad
  assert is_image.sum() == traj.image_grid_thw.prod(axis=1).sum() // 4 > 0
  assert not (traj.action_mask & is_image).any()
  assert traj.action_mask.sum() == sum(len(r.token_ids) for _, r in sampler.calls)
  # every sampler call saw the chain's prefix, image tokens included, with the pixels of the images in it
  images_in = [0, 2, 3]  # turn 1: none; turn 2: wide and tall; turn 3: and the array
  for (prompt, result), sent, n in zip(sampler.calls, sampler.images_seen, images_in):
    assert list(traj.token_ids[: len(prompt)]) == prompt
    if n == 0:
      assert sent is None
      continue
    rows = int(traj.image_grid_thw[:n].prod(axis=1).sum())
    np.testing.assert_array_equal(sent.image_grid_thw, traj.image_grid_thw[:n])
    np.testing.assert_allclose(sent.pixel_values, hf["pixel_values"][:rows], rtol=0, atol=1e-6)
    assert int(np.sum(np.asarray(prompt) == pad)) == rows // 4

  back = Trajectory(**traj.to_json_dict())
  np.testing.assert_array_equal(back.image_grid_thw, traj.image_grid_thw)
  for a, b in zip(back.images, traj.images):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_bad_tool_image_is_an_error_observation_and_the_chain_goes_on():
  look, _ = _image_tools(2)
  turns = [hermes_call("look", {"name": "broken"}), hermes_call("look", {"name": "small"}), "ok"]
  agent = _agent(look)
  [traj] = run_rollout(
    agent, [{"question": "q"}], sampler=ScriptedSampler(_script(agent.tokenizer, turns)), num_chains=1, max_turns=4
  )
  assert traj.error is None and traj.num_turns == 3
  first, second = traj.tool_calls
  assert not first["ok"] and "tool 'look' returned an unusable image" in first["observation"]
  assert "tool 'look' result[1].image: the bytes do not decode" in first["observation"]
  assert second["ok"] and len(traj.images) == 1


def test_a_text_only_agent_refuses_an_image_naming_the_message():
  look, _ = _image_tools(3)
  agent = _agent(look, vision=False)
  turns = [hermes_call("look", {"name": "small"}), "ok"]
  [traj] = run_rollout(
    agent, [{"question": "q"}], sampler=ScriptedSampler(_script(agent.tokenizer, turns)), num_chains=1, max_turns=3
  )
  assert traj.finish_reason == "error"
  assert "messages[2].content[1]: an image part, but ToolCallAgent's model reads text only" in traj.error


def test_an_image_in_the_row_messages_over_the_context_is_an_error_naming_it():
  look, images = _image_tools(4)
  agent = _agent(look)
  row = {
    "question": "q",
    "messages": [
      {"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image", "image": images["wide"]}]}
    ],
  }
  sampler = ScriptedSampler(_script(agent.tokenizer, ["fine"]))
  [ok] = run_rollout(agent, [row], sampler=sampler, num_chains=1, max_turns=1, max_total_tokens=512)
  assert ok.error is None and len(ok.images) == 1 and ok.prompt_length < 512
  [traj] = run_rollout(agent, [row], sampler=sampler, num_chains=1, max_turns=1, max_total_tokens=10)
  assert traj.finish_reason == "error" and "row.messages[0].content[1]" not in (traj.error or "")
  assert "messages[0].content[1]: the image needs 16 image tokens" in traj.error


def test_every_agent_kind_keeps_a_tool_image_in_its_observation_message():
  from agentfly_jax.agents import CodeAgent, ReactAgent
  from agentfly_jax.agents.prompted import PromptedToolCallAgent
  from agentfly_jax.agents.parsers import ToolCall
  from agentfly_jax.tools.tool import ToolOutput

  look, images = _image_tools(6)
  out = ToolOutput(
    "picture small:<image>",
    content=[{"type": "text", "text": "picture small:"}, {"type": "image", "image": images["small"]}],
  )
  plain = ToolOutput("42")
  call = ToolCall("look", {"name": "small"})
  for agent in (
    ReactAgent(vl_tokenizer(), tools=[look]),
    CodeAgent(vl_tokenizer()),
    PromptedToolCallAgent(vl_tokenizer(), tools=[look]),
  ):
    [message] = agent.observation_messages([(call, plain), (call, out)], [])
    content = message["content"]
    assert [p["type"] for p in content].count("image") == 1, type(agent).__name__
    assert content[[p["type"] for p in content].index("image")]["image"] is images["small"]
    text = "".join(p.get("text", "<image>") for p in content)
    [text_only] = agent.observation_messages([(call, plain), (call, ToolOutput("picture small:<image>"))], [])
    assert text == text_only["content"], type(agent).__name__


def test_a_task_envs_first_observation_with_an_image_reaches_the_prompt_as_hf_renders_it():
  from agentfly_jax.tools import LocalEnvProvider, LocalMemoryEnv
  from agentfly_jax.vision.decode import image_data_url

  look, images = _image_tools(8)

  class Room(LocalMemoryEnv):
    async def reset(self, row=None):
      await super().reset(row)
      return [
        {"type": "text", "text": "You see:"},
        {"type": "image_url", "image_url": {"url": image_data_url(images["tall"])}},
      ]

  agent = ToolCallAgent(vl_tokenizer(), tools=[look], task_env="room", env_provider=LocalEnvProvider({"room": Room}))
  agent.vision = VisionProcessor()
  sampler = ScriptedSampler(_script(agent.tokenizer, ["A tall picture."]))
  [traj] = run_rollout(agent, [{"question": "Describe."}], sampler=sampler, num_chains=1, max_turns=1)
  assert traj.error is None and len(traj.images) == 1
  reference = [
    {
      "role": "user",
      "content": [
        {"type": "text", "text": "Describe."},
        {"type": "text", "text": "\n\n"},
        {"type": "text", "text": "You see:"},
        {"type": "image", "image": images["tall"]},
      ],
    }
  ]
  hf = hf_processor().apply_chat_template(
    reference, tokenize=True, return_dict=True, add_generation_prompt=True, return_tensors="np"
  )
  np.testing.assert_array_equal(traj.token_ids[: traj.prompt_length], hf["input_ids"][0])
  np.testing.assert_array_equal(traj.image_grid_thw, hf["image_grid_thw"])

"""Env observations with images through a real env server: the client decodes the wire's content parts, an
unusable image is an error observation naming the part, and a tool returning the step puts the image in the
chain's observation message."""

from __future__ import annotations

import io
import os

import numpy as np
import trio
from PIL import Image

from agent_testlib import hermes_call
from agentfly_jax import tool
from agentfly_jax.agents import ToolCallAgent, rollout
from agentfly_jax.envs.manager import EnvManager
from agentfly_jax.sampling.scripted import ScriptedSampler
from agentfly_jax.vision.processor import VisionProcessor
from envservers_helpers import running_server
from image_obs_env import random_png
from tests.agents.vision_testlib import hf_processor, vl_tokenizer

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@tool(env="image_obs")
async def picture(height: int, width: int, seed: int, env):
  """Asks the environment for a picture.

  Args:
    height: rows.
    width: columns.
    seed: which picture.
  """
  return await env.step({"height": height, "width": width, "seed": seed})


def _server(monkeypatch):
  monkeypatch.setenv("PYTHONPATH", f"{TESTS}:{os.environ.get('PYTHONPATH', '')}")
  return running_server("image_obs=2", extra=("--import", "image_obs_env"))


def test_env_image_observations_through_a_real_server(monkeypatch):
  with _server(monkeypatch) as server:
    manager = EnvManager([server.address])
    agent = ToolCallAgent(vl_tokenizer(), tools=[picture])
    agent.vision = VisionProcessor()

    async def main():
      env = await manager.acquire("image_obs", "direct")
      good = await env.step({"height": 45, "width": 70, "seed": 3})
      bad = await env.step("broken")
      await manager.release("image_obs", "direct")

      def script(prompt):
        k = agent.tokenizer.decode(prompt).count("<|im_start|>assistant") - 1
        text = hermes_call("picture", {"height": 90, "width": 33, "seed": 8}) if k == 0 else "seen"
        return agent.tokenizer.encode(text + "<|im_end|>")

      trajs = await rollout(
        agent, [{"question": "Look."}], sampler=ScriptedSampler(script), num_chains=1, max_turns=3, env_provider=manager
      )
      await manager.aclose()
      return good, bad, trajs

    good, bad, [traj] = trio.run(main)

  assert good.reward == 0.5 and [p["type"] for p in good.observation] == ["text", "image"]
  assert good.observation[0]["text"] == "a 45x70 picture:"
  expected = np.asarray(Image.open(io.BytesIO(random_png(45, 70, 3))).convert("RGB"))
  np.testing.assert_array_equal(np.asarray(good.observation[1]["image"]), expected)
  # the server checks every image observation before replying (envservers/images.py): the error comes from it
  assert bad.info == {"error": "BadObservation"}
  assert "observation[0]" in bad.observation and "image" in bad.observation

  assert traj.error is None and traj.finish_reason == "no_tool_call" and len(traj.images) == 1
  assert traj.tool_calls[0]["observation"] == "a 90x33 picture:<image>"
  expected = np.asarray(Image.open(io.BytesIO(random_png(90, 33, 8))).convert("RGB"))
  np.testing.assert_array_equal(np.asarray(traj.images[0]), expected)
  tool_message = traj.messages[2]
  assert tool_message["role"] == "tool" and tool_message["content"][1]["type"] == "image"
  hf = hf_processor()(images=traj.images, text=["<|vision_start|><|image_pad|><|vision_end|>"], return_tensors="np")
  np.testing.assert_array_equal(traj.image_grid_thw, hf["image_grid_thw"])
  pad = agent.tokenizer.token_to_id("<|image_pad|>")
  assert (traj.token_ids == pad).sum() == (hf["input_ids"][0] == pad).sum() > 0
  assert not traj.action_mask[traj.token_ids == pad].any()

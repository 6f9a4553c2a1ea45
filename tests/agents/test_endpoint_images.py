"""Image parts through the OpenAI-compatible endpoint (real hypercorn server on loopback, the real openai SDK): a
black-box agent's data-URL images become the prompt's image tokens (ids, pixels and grids equal HF's Qwen2.5-VL
processor on the whole conversation), reach the sampler with the prompt, continue the chain's segment and stay in
its trajectory; bad image parts are 400s naming the part and leave the chain as it was."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest

from agentfly_jax.agents import ToolCallAgent
from agentfly_jax.agents.endpoint import ChatEndpoint, serve_endpoint
from agentfly_jax.sampling.scripted import ScriptedSampler
from agentfly_jax.vision.decode import image_png_bytes
from agentfly_jax.vision.processor import VisionProcessor
from tests.agents.vision_testlib import hf_processor, random_image, vl_tokenizer

REPLIES = ["A cat.", "A dog and a cat."]


def _data_url(image) -> str:
  return "data:image/png;base64," + base64.b64encode(image_png_bytes(image)).decode()


def _image_part(image) -> dict:
  return {"type": "image_url", "image_url": {"url": _data_url(image)}}


def _endpoint(vision=True):
  tok = vl_tokenizer()
  agent = ToolCallAgent(tok, tools=[])
  agent.vision = VisionProcessor() if vision else None
  eot = tok.token_to_id("<|im_end|>")

  def script(prompt_ids):
    k = tok.decode(prompt_ids).count("<|im_start|>assistant") - 1
    return tok.encode(REPLIES[min(k, len(REPLIES) - 1)]) + [eot]

  sampler = ScriptedSampler(script)
  return ChatEndpoint(agent, sampler, max_tokens_per_turn=32, max_total_tokens=4096), sampler


@pytest.mark.trio
async def test_image_parts_reach_the_sampler_and_the_trajectory_as_hf_processes_them():
  rng = np.random.default_rng(5)
  first, second = random_image(rng, 44, 60), random_image(rng, 90, 31)
  endpoint, sampler = _endpoint()
  key = endpoint.open_chain(0, 0)
  messages = [
    {"role": "system", "content": "Say what you see."},
    {"role": "user", "content": [{"type": "text", "text": "What is here? "}, _image_part(first)]},
  ]
  async with serve_endpoint(endpoint) as base_url:
    async with httpx.AsyncClient(base_url=base_url, trust_env=False) as http:
      client = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, http_client=http)
      reply = (await client.chat.completions.create(model="policy", messages=messages)).choices[0].message
      assert reply.content == REPLIES[0]
      messages += [
        {"role": "assistant", "content": reply.content},
        {"role": "user", "content": [_image_part(second), {"type": "text", "text": " And now?"}]},
      ]
      reply = (await client.chat.completions.create(model="policy", messages=messages)).choices[0].message
      assert reply.content == REPLIES[1]
  [traj] = endpoint.close_chain(key).trajectories(reward=1.0, metrics={}, finish_reason="agent_done", prediction=None)
  assert traj.num_turns == 2  # one segment: the second request continued the first

  hf = hf_processor().apply_chat_template(
    [*messages, {"role": "assistant", "content": reply.content}],
    tokenize=True,
    return_dict=True,
    return_tensors="np",
  )
  hf_ids = hf["input_ids"][0]
  np.testing.assert_array_equal(traj.token_ids, hf_ids[: len(traj)])
  np.testing.assert_array_equal(traj.image_grid_thw, hf["image_grid_thw"])
  for got, want in zip(traj.images, [first, second], strict=True):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  pad = endpoint.agent.tokenizer.token_to_id("<|image_pad|>")
  assert not (traj.action_mask & (traj.token_ids == pad)).any()

  rows = np.prod(hf["image_grid_thw"], axis=1)
  for (prompt, _), sent, n in zip(sampler.calls, sampler.images_seen, [1, 2], strict=True):
    np.testing.assert_array_equal(sent.image_grid_thw, hf["image_grid_thw"][:n])
    np.testing.assert_allclose(sent.pixel_values, hf["pixel_values"][: rows[:n].sum()], rtol=0, atol=1e-6)
    assert list(traj.token_ids[: len(prompt)]) == prompt


BAD_IMAGE_PARTS = [
  (
    "text-only model",
    False,
    _image_part,
    "messages[0].content[1].image_url.url: an image part, but ToolCallAgent's model reads text only",
  ),
  ("no url", True, lambda im: {"type": "image_url", "image_url": {}}, "messages[0].content[1].image_url.url must be"),
  (
    "remote url",
    True,
    lambda im: {"type": "image_url", "image_url": {"url": "http://example.com/cat.png"}},
    "messages[0].content[1].image_url.url",
  ),
  (
    "not an image",
    True,
    lambda im: {
      "type": "image_url",
      "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"nope").decode()},
    },
    "messages[0].content[1].image_url.url",
  ),
  ("audio", True, lambda im: {"type": "input_audio", "input_audio": {}}, "only text and image_url parts"),
]


@pytest.mark.trio
@pytest.mark.parametrize("label, vision, part, message", BAD_IMAGE_PARTS, ids=[b[0] for b in BAD_IMAGE_PARTS])
async def test_bad_image_parts_are_400s_naming_the_part(label, vision, part, message):
  endpoint, sampler = _endpoint(vision)
  key = endpoint.open_chain(0, 0)
  image = random_image(np.random.default_rng(0), 20, 20)
  body = {"model": "policy", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, part(image)]}]}
  async with serve_endpoint(endpoint) as base_url:
    async with httpx.AsyncClient(base_url=base_url, trust_env=False) as http:
      r = await http.post("/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
  assert r.status_code == 400, r.text
  assert message in r.json()["error"]["message"], r.json()
  assert r.json()["error"]["param"].startswith("messages")
  assert endpoint.chains[key].segments == [] and endpoint.chains[key].num_requests == 0 and not sampler.calls

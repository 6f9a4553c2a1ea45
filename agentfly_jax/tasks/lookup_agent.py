"""The lookup task's agent written only with the `openai` SDK: its own loop, `tools=` in the
request, `tool_calls` read back, the tool run by the agent itself. Nothing here knows about
agentfly_jax's agents; the trainer trains it through the OpenAI-compatible endpoint:

  experiments/train.py --config=configs/lookup_endpoint_grpo.py      # task.agent = this run()

It sends the same system prompt and question as the built-in lookup agent, so the warm-started
policy sees the prompts it was trained on.
"""

from __future__ import annotations

import json

from agentfly_jax.tasks.lookup import SYSTEM_PROMPT, lookup

LOOKUP_SCHEMA = {
  "type": "function",
  "function": {
    "name": "lookup",
    "description": "Looks up the secret code of a key.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
  },
}


async def run(client, row: dict, *, model: str = "policy", max_turns: int = 4) -> str:
  """Asks the model, runs the lookups it calls, returns its last text answer."""
  messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": row["question"]}]
  content = ""
  for _ in range(max_turns):
    reply = await client.chat.completions.create(model=model, messages=messages, tools=[LOOKUP_SCHEMA])
    message = reply.choices[0].message
    content = message.content or ""
    if not message.tool_calls:
      return content
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls:
      try:
        key = json.loads(call.function.arguments).get("key", "")
        result = (
          await lookup.acall(key=key)
          if call.function.name == "lookup"
          else (f"Error: unknown tool {call.function.name!r}")
        )
      except (ValueError, AttributeError) as e:
        result = f"Error: {e}"
      messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
  return content

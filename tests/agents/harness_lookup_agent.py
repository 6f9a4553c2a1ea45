"""An outside harness for tests/agents/test_agents_loops.py: its own process, its own loop and HTTP client
(the synchronous `openai.OpenAI()`, configured only by OPENAI_BASE_URL / OPENAI_API_KEY), the row on stdin,
the answer on stdout. `--fail` exits 3 before any request."""

import sys

if "--fail" in sys.argv:
  print("harness: no config here", file=sys.stderr)
  sys.exit(3)

import json  # noqa: E402

import openai  # noqa: E402

from agentfly_jax.tasks.lookup import SYSTEM_PROMPT, lookup  # noqa: E402
from agentfly_jax.tasks.lookup_agent import LOOKUP_SCHEMA  # noqa: E402

row = json.loads(sys.stdin.read())
client = openai.OpenAI(max_retries=0)
messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": row["question"]}]
for _ in range(4):
  message = client.chat.completions.create(model="policy", messages=messages, tools=[LOOKUP_SCHEMA]).choices[0].message
  if not message.tool_calls:
    break
  messages.append(message.model_dump(exclude_none=True))
  for call in message.tool_calls:
    result = lookup(key=json.loads(call.function.arguments)["key"])  # outside trio: a plain call
    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
print(message.content or "")

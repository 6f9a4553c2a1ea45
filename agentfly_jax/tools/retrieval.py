"""`retrieve`: BM25 search over the env server's `retrieval` corpus (a stateful env tool).

retrieve("Varo Keltin")              # one-off call: the embedded local server (or
                                     # AGENTFLY_ENV_SERVERS) answers, like code_interpreter
retrieve(query="Ostrevel", k=5)
"""

from __future__ import annotations

from agentfly_jax.tools.tool import tool


@tool(stateful=True, env="retrieval", max_length=4096)
async def retrieve(query: str, k: int = 3, *, env) -> str:
  """Searches the knowledge base and returns the best-matching passages, numbered, with titles.

  Args:
    query: a few words to search for, e.g. a name or a title.
    k: how many passages to return (1 to 20).
  """
  return await env.step({"query": query, "k": k})

"""Tools by name: the built-ins, and user tools as `module:attribute`.

  get_tool("calculator")               # a built-in
  get_tool("my_pkg.my_task:lookup")    # a user's @tool
  list_tools()                         # the built-in names

Built-ins are listed here as "module:attribute" strings and imported on first use, so a listing
costs nothing and a built-in that needs an optional package fails only when asked for (the
importer and resolver: agentfly_jax/user_code.py).
"""

from __future__ import annotations

from agentfly_jax.user_code import Listing

BUILTIN_TOOLS: dict[str, str] = {
  "answer": "agentfly_jax.tools.builtin:answer",
  "calculator": "agentfly_jax.tools.builtin:calculator",
  "code_interpreter": "agentfly_jax.tools.builtin:code_interpreter",
  "retrieve": "agentfly_jax.tools.retrieval:retrieve",
  "web_search": "agentfly_jax.tools.web:web_search",
}


TOOLS = Listing("tool", BUILTIN_TOOLS)
register_builtin_tool = TOOLS.register
list_tools = TOOLS.names


def get_tool(name: str):
  """The `Tool` named `name`: a built-in (see `list_tools()`) or 'module:function'."""
  from agentfly_jax.tools.tool import Tool

  obj = TOOLS.resolve(name)
  if not isinstance(obj, Tool):
    raise ValueError(f"tool {name!r} is a {type(obj).__name__}, not a @tool function")
  return obj

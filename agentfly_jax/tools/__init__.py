"""Tools: the `@tool` decorator, the `Tool` object and its JSON schema, built-in tools.

from agentfly_jax.tools import tool, calculator, code_interpreter, answer, retrieve, web_search
from agentfly_jax.tools import tools_from_mcp          # an MCP server's tools (tools/mcp.py)
"""

from agentfly_jax.tools.builtin import answer, calculator, code_interpreter, evaluate_arithmetic
from agentfly_jax.tools.registry import BUILTIN_TOOLS, get_tool, list_tools, register_builtin_tool
from agentfly_jax.tools.retrieval import retrieve
from agentfly_jax.tools.web import set_search_backend, web_search
from agentfly_jax.tools.limits import ToolCounts, ToolLimits, tool_counts, tool_metrics
from agentfly_jax.tools.local_env import LocalEnvProvider, LocalMemoryEnv
from agentfly_jax.tools.mcp import McpConnection, tools_from_mcp
from agentfly_jax.tools.schema import function_schema, parse_google_docstring
from agentfly_jax.tools.tool import Tool, ToolOutput, get_env_provider, set_env_provider, tool, truncate

__all__ = [
  "tool",
  "Tool",
  "ToolOutput",
  "calculator",
  "code_interpreter",
  "answer",
  "retrieve",
  "web_search",
  "set_search_backend",
  "evaluate_arithmetic",
  "function_schema",
  "parse_google_docstring",
  "truncate",
  "LocalEnvProvider",
  "LocalMemoryEnv",
  "set_env_provider",
  "get_env_provider",
  "get_tool",
  "list_tools",
  "register_builtin_tool",
  "BUILTIN_TOOLS",
  "ToolLimits",
  "tool_metrics",
  "tool_counts",
  "ToolCounts",
  "McpConnection",
  "tools_from_mcp",
]

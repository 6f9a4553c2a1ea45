"""Data: dataset rows and the training stream over them, tiny tokenizers and chat templates for tests and demos.

from agentfly_jax.data import load_rows, RowStream, build_tiny_tokenizer
"""

from agentfly_jax.data.chat_templates import CHAT_TEMPLATES, LLAMA3_CHAT_TEMPLATE, QWEN25_CHAT_TEMPLATE
from agentfly_jax.data.dataset import load_rows, validate_row
from agentfly_jax.data.row_stream import RowStream
from agentfly_jax.data.tiny_tokenizer import build_tiny_tokenizer

__all__ = [
  "load_rows",
  "validate_row",
  "RowStream",
  "build_tiny_tokenizer",
  "CHAT_TEMPLATES",
  "QWEN25_CHAT_TEMPLATE",
  "LLAMA3_CHAT_TEMPLATE",
]

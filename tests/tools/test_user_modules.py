"""User modules (tasks, tools, rewards) are found by module path, by a file path the user gives, or
beside the command in the current directory; sys.path is never changed."""

import sys

import pytest

from agentfly_jax.user_code import import_user_module, resolve_object

TOOL_MODULE = "def shout(word: str) -> str:\n  return word.upper()\n"


@pytest.fixture
def folder(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  names = ("uq_shout_a", "uq_shout_b", "uq_shout_c", "uq_pkg", "uq_pkg.inner")
  yield tmp_path
  for name in names:
    sys.modules.pop(name, None)


def test_a_module_in_the_current_directory(folder):
  (folder / "uq_shout_a.py").write_text(TOOL_MODULE)
  before = list(sys.path)
  module = import_user_module("uq_shout_a")
  assert module.shout("a") == "A" and sys.modules["uq_shout_a"] is module
  assert resolve_object("uq_shout_a:shout", kind="tool", builtins={}) is module.shout
  assert sys.path == before


def test_a_file_path(folder):
  (folder / "sub").mkdir()
  (folder / "sub" / "uq_shout_b.py").write_text(TOOL_MODULE)
  before = list(sys.path)
  module = import_user_module("sub/uq_shout_b.py")
  assert module.shout("b") == "B" and sys.modules["uq_shout_b"] is module
  assert sys.path == before


def test_a_package_in_the_current_directory(folder):
  (folder / "uq_pkg").mkdir()
  (folder / "uq_pkg" / "__init__.py").write_text("")
  (folder / "uq_pkg" / "inner.py").write_text(TOOL_MODULE)
  before = list(sys.path)
  assert import_user_module("uq_pkg.inner").shout("c") == "C"
  assert sys.path == before


def test_a_missing_module_is_an_error(folder):
  before = list(sys.path)
  with pytest.raises(ModuleNotFoundError):
    import_user_module("uq_shout_c")
  with pytest.raises(FileNotFoundError):
    import_user_module("uq_shout_c.py")
  assert sys.path == before and "uq_shout_c" not in sys.modules

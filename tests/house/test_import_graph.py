"""The package's import graph, read from the source (every `import` statement: top-level, inside a
function, or under `if TYPE_CHECKING:`, all counted the same): no module import cycle, and imports between
sub-packages run one way, down the data flow of ../shared/docs/DESIGN.md. `envservers` imports
nothing of `agentfly_jax` and no JAX."""

import ast
import collections
import os

import pytest
from train_cli import ROOT

# Lower layers first; a module may import its own sub-package and any sub-package of a lower layer.
LAYERS = [
  ["envservers"],
  ["agentfly_jax.xla_defaults", "agentfly_jax.user_code", "agentfly_jax.vision"],  # import nothing of agentfly_jax
  ["agentfly_jax.envs"],
  ["agentfly_jax.tools"],
  ["agentfly_jax.rewards"],
  ["agentfly_jax.data", "agentfly_jax.metrics"],
  ["agentfly_jax.models"],
  ["agentfly_jax.sampling", "agentfly_jax.checkpoint"],  # checkpoint converts layer layouts (models)
  ["agentfly_jax.rl.core"],  # pure device math (losses, advantages, train step, prepare): no host loop
  ["agentfly_jax.agents"],
  ["agentfly_jax.tasks"],
  ["agentfly_jax.rl"],
  ["agentfly_jax"],  # the top-level package re-exports the decorators
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}


def _modules() -> dict[str, str]:
  mods = {}
  for pkg in ("agentfly_jax", "envservers"):
    for folder, _, files in os.walk(os.path.join(ROOT, pkg)):
      for f in files:
        if f.endswith(".py"):
          path = os.path.join(folder, f)
          name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
          mods[name.removesuffix(".__init__")] = path
  return mods


def _imports(path: str, module: str, known) -> list[tuple[str, int]]:
  """(imported module, line) for every import in the file: top-level, in functions and under
  `if TYPE_CHECKING:` alike (an annotation-only import still closes a cycle for a reader and for
  any tool that resolves the annotations)."""
  out = []
  is_package = path.endswith("__init__.py")

  class Visitor(ast.NodeVisitor):
    def visit_Import(self, node):
      out.extend((a.name, node.lineno) for a in node.names)

    def visit_ImportFrom(self, node):
      if node.level:
        base = module.split(".")[: (None if is_package else -1)]
        base = base[: len(base) - node.level + 1]
        source = ".".join(base + ([node.module] if node.module else []))
      else:
        source = node.module
      for a in node.names:
        full = f"{source}.{a.name}"
        out.append((full if full in known else source, node.lineno))

  Visitor().visit(ast.parse(open(path).read(), path))
  return out


def _graph():
  mods = _modules()
  edges = collections.defaultdict(dict)
  external = collections.defaultdict(dict)
  for name, path in mods.items():
    for target, line in _imports(path, name, mods):
      inner = target
      while inner and inner not in mods:
        inner = inner.rpartition(".")[0]
      if inner and inner != name:
        edges[name][inner] = line
      elif not inner:
        external[name][target] = line
  return mods, edges, external


def _layer(module: str) -> str:
  parts = module.split(".")
  if parts[0] == "envservers":
    return "envservers"
  if parts[:3] == ["agentfly_jax", "rl", "core"]:
    return "agentfly_jax.rl.core"
  return ".".join(parts[:2]) if len(parts) > 1 else parts[0]


def _cycles(edges) -> list[list[str]]:
  """Strongly connected components with more than one module (Tarjan)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in edges.get(v, {}):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        found.append(sorted(comp))

  for v in list(edges):
    if v not in index:
      visit(v)
  return found


def test_no_import_cycles():
  _, edges, _ = _graph()
  assert _cycles(edges) == []


def test_cycle_finder_finds_a_cycle():
  assert _cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]


def test_imports_run_down_the_layers():
  mods, edges, _ = _graph()
  unknown = sorted({_layer(m) for m in mods} - set(RANK))
  assert not unknown, f"sub-packages missing from LAYERS (place them in the data flow): {unknown}"
  upward = []
  for src, targets in edges.items():
    for dst, line in targets.items():
      a, b = _layer(src), _layer(dst)
      if a != b and RANK[b] > RANK[a]:
        upward.append(f"{mods[src]}:{line}: {src} ({a}) imports {dst} ({b})")
  assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(sorted(upward))


def test_envservers_stand_alone():
  """A server process stays light: no agentfly_jax, no JAX / flax / numpy-heavy ML stack."""
  mods, edges, external = _graph()
  bad = []
  for src in mods:
    if _layer(src) != "envservers":
      continue
    for dst, line in {**edges.get(src, {}), **external.get(src, {})}.items():
      if dst.split(".")[0] in ("agentfly_jax", "jax", "jaxlib", "flax", "optax", "orbax"):
        bad.append(f"{mods[src]}:{line}: imports {dst}")
  assert not bad, "\n".join(bad)


def _top_level_imports(path: str) -> list[str]:
  with open(path) as f:
    tree = ast.parse(f.read())
  out = []
  for node in tree.body:
    if isinstance(node, ast.Import):
      out += [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module:
      out += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
  return out


def test_trainer_side_uses_no_server_internals():
  """The trainer-side tasks reach envservers only through its public surface, `envservers.api` (the
  shared data / policy modules: catalogs, task sets, scripted policies), and that never re-exports a
  module that is part of a server (one importing envservers.env / registry / server at its top): a
  task that copied a server's internals drifts when the server changes. (agentfly_jax.envs starts
  servers: it is the client side of the protocol.)"""
  mods, edges, _ = _graph()
  server = ("envservers.env", "envservers.registry", "envservers.server", "envservers.subprocess_env")
  bad = []
  for src, targets in edges.items():
    if _layer(src) != "agentfly_jax.tasks":
      continue
    for dst, line in targets.items():
      if _layer(dst) != "envservers" or dst not in mods:
        continue
      if dst != "envservers.api":
        bad.append(f"{mods[src]}:{line}: {src} imports {dst}; tasks use envservers.api")
      for used in [dst, *(m for m in edges.get(dst, {}) if m.startswith("envservers."))]:  # the api's modules too
        if used in server or any(m in server for m in _top_level_imports(mods[used])):
          bad.append(f"{mods[src]}:{line}: {src} imports {dst}, which brings {used}, a server module")
  assert not bad, "\n".join(sorted(bad))


def test_rl_core_is_device_math_only():
  """rl/core holds what runs on the device: it imports no host-loop machinery (event loops,
  threads, checkpoint IO, progress bars, the env servers)."""
  mods, edges, external = _graph()
  host = ("trio", "asyncio", "threading", "concurrent", "orbax", "tqdm", "envservers", "subprocess")
  bad = [
    f"{mods[src]}:{line}: imports {dst}"
    for src in mods
    if _layer(src) == "agentfly_jax.rl.core"
    for dst, line in {**edges.get(src, {}), **external.get(src, {})}.items()
    if dst.split(".")[0] in host
  ]
  assert [m for m in mods if _layer(m) == "agentfly_jax.rl.core"], "agentfly_jax/rl/core is missing"
  assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
  "source,expected",
  [
    ("import os\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n  from x.y import Z\n", ["os", "typing", "x.y"]),
    ("def f():\n  from x.y import Z\n", ["x.y"]),
  ],
)
def test_import_reader(tmp_path, source, expected):
  path = tmp_path / "m.py"
  path.write_text(source)
  assert [name for name, _ in _imports(str(path), "m", {})] == expected

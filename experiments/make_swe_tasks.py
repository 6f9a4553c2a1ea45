"""Makes the SWE task set offline: generated bugs in small repositories, with issue texts.

    python experiments/make_swe_tasks.py [--out=envservers/data/swe_tasks] [--per_kind=2]

For each source repository under envservers/data/swe_repos/{train,dev,test}/<name>/ (repo/: a
package of 2-6 modules and its visible tests; hidden_tests/test_hidden.py; the three splits
use different repositories) every candidate bug of six kinds is found in the source with `ast`
(off_by_one, wrong_operator, missing_edge_case, wrong_default, swapped_arguments,
broken_import), applied, and kept only if the repository's own tests and the hidden tests both
catch it (and pass on the original). Each kept bug is one file, <out>/<split>/<task_id>.json:
repo_name, kind, problem_statement (an issue text from the failing visible test), the test
command, `bug` {path, old, new} (the exact edit, `old` unique in the clean file and `new` unique
in the buggy one, that makes the buggy repository; the reference fix is its inverse) and
`fail_to_pass` (the hidden tests the bug breaks, as pytest node ids under hidden_tests/).
The source repositories are shipped once; the env makes each task's repository at reset.
"""

from __future__ import annotations

import ast
import difflib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

from absl import app, flags

from envservers.envs.swe_tasks import REPOS_DIR, SPLITS

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The script's flags, defined when it runs (importing the generator defines none)."""
  flags.DEFINE_string("out", "envservers/data/swe_tasks", "output folder (replaced)")
  flags.DEFINE_integer("per_kind", 2, "tasks per bug kind and repository (at most)")
  flags.DEFINE_integer("seed", 0, "candidate order")


KINDS = ("off_by_one", "wrong_operator", "missing_edge_case", "wrong_default", "swapped_arguments", "broken_import")
TEST_COMMAND = "python -m pytest -q"
_SWAP_OPS = {
  ast.Add: ("+", "-"),
  ast.Sub: ("-", "+"),
  ast.Lt: ("<", "<="),
  ast.LtE: ("<=", "<"),
  ast.Gt: (">", ">="),
  ast.GtE: (">=", ">"),
  ast.Eq: ("==", "!="),
  ast.NotEq: ("!=", "=="),
  ast.FloorDiv: ("//", "/"),
  ast.Mult: ("*", "+"),
}

# Runs test functions without pytest: {file::name: None (passed) or the error}. Fast enough to
# try every candidate bug.
RUNNER = r'''
import importlib.util, json, os, sys, traceback
results = {}
for path in sys.argv[1:]:
  name = os.path.basename(path)[:-3]
  try:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
  except BaseException as e:
    results[path + "::<import>"] = {"type": type(e).__name__, "message": str(e)[:300], "line": ""}
    continue
  for attr in sorted(vars(module)):
    fn = getattr(module, attr)
    if attr.startswith("test") and callable(fn):
      try:
        fn()
        results[path + "::" + attr] = None
      except BaseException as e:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == path]
        line = frames[-1].line if frames else ""
        results[path + "::" + attr] = {"type": type(e).__name__, "message": str(e)[:300],
                                       "line": line}
print(json.dumps(results))
'''


def source_repos(split: str) -> dict[str, tuple[dict[str, str], str]]:
  """{name: ({path: source} of the repository, its hidden test module)} of
  envservers/data/swe_repos/<split>/<name>/{repo/, hidden_tests/test_hidden.py}."""
  repos = {}
  for name in sorted(os.listdir(os.path.join(REPOS_DIR, split))):
    root = os.path.join(REPOS_DIR, split, name)
    files = {}
    for folder, dirs, names in os.walk(os.path.join(root, "repo")):
      dirs[:] = sorted(d for d in dirs if d != "__pycache__")
      for file_name in sorted(names):
        if file_name.endswith(".py"):
          path = os.path.join(folder, file_name)
          with open(path) as f:
            files[os.path.relpath(path, os.path.join(root, "repo"))] = f.read()
    with open(os.path.join(root, "hidden_tests", "test_hidden.py")) as f:
      repos[name] = (files, f.read())
  return repos


def write_tree(files: dict[str, str], root: str) -> None:
  for rel, text in files.items():
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
      f.write(text)


def run_tests(repo: str, test_files: list[str]) -> dict:
  """{file::test: None or error} of the test files against `repo` (any test a timeout or crash
  leaves unreported counts as failed by the caller)."""
  env = dict(os.environ, PYTHONPATH=repo, PYTHONDONTWRITEBYTECODE="1")
  try:
    out = subprocess.run(
      [sys.executable, "-c", RUNNER, *test_files], cwd=repo, env=env, capture_output=True, text=True, timeout=20
    )
    return json.loads(out.stdout.strip().splitlines()[-1])
  except (subprocess.TimeoutExpired, json.JSONDecodeError, IndexError):
    return {}


def _segment(lines: list[str], node: ast.AST) -> tuple[int, int, int] | None:
  """(line index, start col, end col) of a single-line node."""
  if node.lineno != node.end_lineno:
    return None
  return node.lineno - 1, node.col_offset, node.end_col_offset


def _replace(source: str, line: int, start: int, end: int, text: str) -> str:
  lines = source.splitlines(keepends=True)
  lines[line] = lines[line][:start] + text + lines[line][end:]
  return "".join(lines)


def candidates(source: str, package: str, repo_functions: set[str]) -> list[tuple[str, str]]:
  """(kind, mutated source) for every bug this module can carry."""
  tree = ast.parse(source)
  lines = source.splitlines()
  out = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range":
      seg = _segment(lines, node.args[-1])
      if seg:
        text = lines[seg[0]][seg[1] : seg[2]]
        for new in ((text[:-4] if text.endswith((" - 1", " + 1")) else None), f"{text} - 1", f"{text} + 1"):
          if new:
            out.append(("off_by_one", _replace(source, *seg, new)))
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice) and node.slice.upper:
      seg = _segment(lines, node.slice.upper)
      if seg:
        text = lines[seg[0]][seg[1] : seg[2]]
        out.append(("off_by_one", _replace(source, *seg, f"{text} - 1")))
    if isinstance(node, (ast.BinOp, ast.Compare)):
      op = node.op if isinstance(node, ast.BinOp) else node.ops[0]
      right = node.right if isinstance(node, ast.BinOp) else node.comparators[0]
      swap = _SWAP_OPS.get(type(op))
      if swap and node.lineno == right.lineno == node.left.end_lineno:
        line = node.lineno - 1
        gap = lines[line][node.left.end_col_offset : right.col_offset]
        if gap.strip() == swap[0]:
          out.append(
            (
              "wrong_operator",
              _replace(source, line, node.left.end_col_offset, right.col_offset, gap.replace(swap[0], swap[1])),
            )
          )
      if isinstance(node, ast.BinOp) and isinstance(right, ast.Constant) and right.value == 1:
        seg = (node.lineno - 1, node.col_offset, node.end_col_offset)
        if node.lineno == node.end_lineno:  # `x - 1` -> `x`: an off-by-one too
          out.append(("off_by_one", _replace(source, *seg, ast.get_source_segment(source, node.left))))
    if isinstance(node, (ast.FunctionDef,)):
      for stmt in node.body:
        if (
          isinstance(stmt, ast.If)
          and not stmt.orelse
          and len(stmt.body) == 1
          and isinstance(stmt.body[0], (ast.Return, ast.Raise))
        ):
          kept = lines[: stmt.lineno - 1] + lines[stmt.end_lineno :]
          out.append(("missing_edge_case", "\n".join(kept) + "\n"))
      for default in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
        if isinstance(default, ast.Constant) and _segment(lines, default):
          value = default.value
          if isinstance(value, bool):
            new = repr(not value)
          elif isinstance(value, int):
            new = repr(value + 1 if value != 1 else 2)
          elif isinstance(value, float):
            new = repr(value + 1.0)
          elif isinstance(value, str):
            new = repr(value[:-1] if value else "-")
          else:
            continue
          out.append(("wrong_default", _replace(source, *_segment(lines, default), new)))
    if (
      isinstance(node, ast.Call)
      and isinstance(node.func, ast.Name)
      and node.func.id in repo_functions
      and len(node.args) >= 2
    ):
      a, b = node.args[0], node.args[1]
      sa, sb = ast.get_source_segment(source, a), ast.get_source_segment(source, b)
      if sa != sb and a.lineno == b.end_lineno == node.lineno:
        line = a.lineno - 1
        text = lines[line][a.col_offset : b.end_col_offset]
        swapped = sb + text[len(sa) : len(text) - len(sb)] + sa
        out.append(("swapped_arguments", _replace(source, line, a.col_offset, b.end_col_offset, swapped)))
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package + "."):
      line = node.lineno - 1
      module = node.module
      wrong = module[:-1] if module.endswith("s") else module + "s"
      src_lines = source.splitlines(keepends=True)
      src_lines[line] = src_lines[line].replace(module, wrong, 1)
      out.append(("broken_import", "".join(src_lines)))
  return out


def unique_edit(before: str, after: str) -> tuple[str, str]:
  """(old, new): the changed lines of `before` -> `after`, widened by whole lines of context
  until `old` occurs exactly once in `before` and `new` exactly once in `after` (so the edit
  and its inverse are each one exact str_replace)."""
  a, b = before.splitlines(keepends=True), after.splitlines(keepends=True)
  ops = [op for op in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes() if op[0] != "equal"]
  i1, i2, j1, j2 = ops[0][1], ops[-1][2], ops[0][3], ops[-1][4]
  while True:
    old, new = "".join(a[i1:i2]), "".join(b[j1:j2])
    if old and new and before.count(old) == 1 and after.count(new) == 1:
      return old, new
    if i1 > 0:
      i1, j1 = i1 - 1, j1 - 1
    elif i2 < len(a):
      i2, j2 = i2 + 1, j2 + 1
    else:
      raise ValueError("no unique context")


def first_changed_line(before: str, after: str) -> int:
  """The 1-based line of `after` where it first differs from `before`."""
  a, b = before.splitlines(), after.splitlines()
  ops = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
  first = next(op for op in ops if op[0] != "equal")
  return min(first[3] + 1, len(b))


def enclosing_function(source: str, line: int) -> str | None:
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.FunctionDef) and node.lineno <= line <= node.end_lineno:
      return node.name
  return None


def issue_text(kind: str, module: str, function: str | None, failure: tuple[str, dict]) -> str:
  test, error = failure
  test_name = test.rsplit("::", 1)[1]
  where = f"`{function}` in `{module}`" if function else f"`{module}`"
  if kind == "broken_import" or test_name == "<import>":
    return (
      f"Importing the package fails.\n\nRunning the test suite stops while importing: "
      f"{error['type']}: {error['message']}\n\nThe problem seems to be in `{module}`. "
      f"Please make the package importable again without changing its behaviour."
    )
  detail = f"\n\n    {error['line']}\n\nfails with {error['type']}"
  detail += f": {error['message']}" if error["message"] else ""
  return (
    f"{where} returns wrong results.\n\nThe test `{test_name}` in tests/ breaks at{detail}."
    f"\n\nPlease fix {where} so that it does what its docstring and the tests say."
  )


def repo_rng(seed: int, name: str) -> random.Random:
  """The candidate order of one repository (independent of the others)."""
  return random.Random(f"{seed}:{name}")


def make_repo_tasks(
  name: str, files: dict[str, str], hidden: str, out_dir: str, per_kind: int, rng: random.Random
) -> list[str]:
  """Writes <out_dir>/<task_id>.json for each kept bug of one repository; the task ids."""
  made = []
  os.makedirs(out_dir, exist_ok=True)
  with tempfile.TemporaryDirectory() as tmp:
    base = os.path.join(tmp, "base")
    write_tree(files, base)
    write_tree({"hidden/test_hidden.py": hidden}, tmp)
    visible = sorted(os.path.join(base, p) for p in files if p.startswith("tests/"))
    hidden_path = os.path.join(tmp, "hidden", "test_hidden.py")
    clean = run_tests(base, visible + [hidden_path])
    assert clean and all(v is None for v in clean.values()), f"{name}: tests fail unmodified: {clean}"
    functions = {n.name for text in files.values() for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef)}
    found = {kind: [] for kind in KINDS}
    for path, source in files.items():
      if path.startswith("tests/") or not path.endswith(".py"):
        continue
      for kind, mutated in candidates(source, name, functions):
        found[kind].append((path, mutated))
    for kind in KINDS:
      options = found[kind]
      rng.shuffle(options)
      kept = 0
      for path, mutated in options:
        if kept >= per_kind:
          break
        if mutated == files[path]:
          continue
        try:
          ast.parse(mutated)
        except SyntaxError:
          continue
        trial = os.path.join(tmp, "trial")
        shutil.rmtree(trial, ignore_errors=True)
        write_tree({**files, path: mutated}, trial)
        results = run_tests(trial, [p.replace(base, trial) for p in visible] + [hidden_path])
        in_hidden = lambda key: key.startswith(hidden_path + "::")  # noqa: E731
        vis_fail = sorted((k, v) for k, v in results.items() if v is not None and not in_hidden(k))
        hid_fail = {k.rsplit("::", 1)[1] for k, v in results.items() if in_hidden(k) and v is not None}
        if "<import>" in hid_fail:  # the hidden module cannot import: every test fails
          hid_fail = {k.rsplit("::", 1)[1] for k in clean if in_hidden(k)}
        if len(results) < len(clean) and not any(k.endswith("<import>") for k in results):
          continue  # a test hung or crashed the runner
        if not vis_fail or not hid_fail:
          continue
        task_id = f"{name}-{kind}-{kept}"
        old, new = unique_edit(files[path], mutated)
        function = enclosing_function(mutated, first_changed_line(files[path], mutated))
        failure = (vis_fail[0][0].replace(trial + "/", ""), vis_fail[0][1])
        meta = {
          "task_id": task_id,
          "repo_name": name,
          "kind": kind,
          "problem_statement": issue_text(kind, path, function, failure),
          "test_command": TEST_COMMAND,
          "fail_to_pass": [f"test_hidden.py::{test}" for test in sorted(hid_fail)],
          "bug": {"path": path, "old": old, "new": new},
        }
        with open(os.path.join(out_dir, f"{task_id}.json"), "w") as f:
          json.dump(meta, f, indent=1)
          f.write("\n")
        made.append(task_id)
        kept += 1
  return made


def main(argv):
  del argv
  if os.path.isdir(FLAGS.out):
    shutil.rmtree(FLAGS.out)
  summary = {}
  for split in SPLITS:
    for name, (files, hidden) in source_repos(split).items():
      made = make_repo_tasks(
        name, files, hidden, os.path.join(FLAGS.out, split), FLAGS.per_kind, repo_rng(FLAGS.seed, name)
      )
      summary[f"{split}/{name}"] = made
      print(f"{split}/{name}: {len(made)} tasks: {', '.join(made)}")
  total = sum(len(v) for v in summary.values())
  print(f"{total} tasks in {FLAGS.out}")


if __name__ == "__main__":
  define_flags()
  app.run(main)

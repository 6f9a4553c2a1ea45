"""The quickstart notebook executes top to bottom on CPU (nbclient), and trains; it is Colab-ready:
its first code cell installs the package when it is not importable, and no cell edits sys.path."""

import os

import nbformat
import pytest
from nbclient import NotebookClient
from train_cli import ROOT

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)


@pytest.mark.slow
def test_quickstart_notebook_runs():
  path = os.path.join(ROOT, "experiments", "quickstart.ipynb")
  nb = nbformat.read(path, as_version=4)
  code = [c.source for c in nb.cells if c.cell_type == "code"]
  assert "find_spec(\"agentfly_jax\") is None" in code[0] and "pip" in code[0]
  assert not any("sys.path" in src for src in code)
  assert any("agent.rollout(" in src for src in code)
  client = NotebookClient(
    nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": os.path.join(ROOT, "experiments")}}
  )
  client.execute()
  outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
  assert "The weather is cold." in outputs
  assert "Error" in outputs  # the unknown city became an error observation
  assert "⟦" in outputs  # the mask is shown
  images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
  assert images, "the reward plot was not displayed"

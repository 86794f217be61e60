"""Every notebook in notebooks/ runs top to bottom without an error (nbclient + ipykernel),
and the committed notebooks carry no outputs."""
import glob
import json
import os

import pytest

NOTEBOOKS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "notebooks", "*.ipynb")))


def test_the_notebooks_exist():
    names = [os.path.basename(p) for p in NOTEBOOKS]
    assert names == ["01_quickstart.ipynb", "02_learned_kernels.ipynb", "03_scaling.ipynb", "04_distillation.ipynb",
                     "05_diagnostics.ipynb"]


def test_the_notebooks_readme_lists_every_notebook():
    with open(os.path.join(os.path.dirname(__file__), "..", "notebooks", "README.md")) as fh:
        readme = fh.read()
    missing = [os.path.basename(p) for p in NOTEBOOKS if f"| `{os.path.basename(p)}` |" not in readme]
    assert not missing, f"notebooks/README.md's table lacks {missing}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_committed_notebook_is_stripped(path):
    with open(path) as fh:
        nb = json.load(fh)
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None, \
                f"{os.path.basename(path)} has outputs: strip them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_executes(path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("matplotlib")
    pytest.importorskip("ipykernel")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": os.path.dirname(path)}})
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend captures the figures
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    client.execute()   # raises CellExecutionError (with the traceback) on any error
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert any(o.get("output_type") == "display_data" and "image/png" in o.get("data", {}) for o in outputs), \
        "the notebook should draw at least one plot"

"""examples/quickstart.ipynb runs top to bottom in a fresh kernel and shows what it promises."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "quickstart.ipynb"


def _text(cell) -> str:
    out = []
    for o in cell.get("outputs", []):
        if "text" in o:
            out.append(o["text"])
        out += [str(v) for k, v in o.get("data", {}).items() if k.startswith("text/")]
    return "\n".join(out)


def test_quickstart_notebook_runs(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        pytest.skip("no python3 Jupyter kernel: `python -m ipykernel install --sys-prefix`")
    shutil.copy(NOTEBOOK, tmp_path / NOTEBOOK.name)
    nb = nbformat.read(tmp_path / NOTEBOOK.name, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not any(o.get("output_type") == "error" for o in c.get("outputs", [])) for c in code)
    texts = [_text(c) for c in code]
    table = next(t for t in texts if "| Attack | Metric |" in t)
    assert "| deit | pid_deit | Δ pid_deit−deit | p pid_deit vs deit |" in table
    assert "| Clean | Top-1 Acc (%) |" in table and "PGD (4/255)" in table
    assert "McNemar exact, n=32" in table
    assert any(o.get("data", {}).get("image/png") for c in code for o in c.get("outputs", []))
    assert any("PASSED" in t for t in texts)
    assert (tmp_path / "report.html").stat().st_size > 20000
    assert len(list((tmp_path / "results").iterdir())) == 2  # the two runs, in the notebook's folder

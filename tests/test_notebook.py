"""examples/quickstart.ipynb runs top to bottom in a fresh kernel and shows what it promises."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pandas as pd
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
    assert "| Clean | Top-1 Acc (%) [95% Wilson] |" in table and re.search(r"PGD-\d+ \(4/255\)", table)
    assert "McNemar exact, n=32" in table
    assert any(o.get("data", {}).get("image/png") for c in code for o in c.get("outputs", []))
    assert any("PASSED" in t for t in texts)
    # everything it writes goes to its temporary OUT folder, nothing next to the notebook
    out = Path(re.search(r"outputs in (\S+)", texts[0]).group(1))
    try:
        assert [p.name for p in tmp_path.iterdir()] == [NOTEBOOK.name]
        assert (out / "report.html").stat().st_size > 20000
        assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["deit", "my_pid", "pid_deit"]
        # the model-object section: the caller's module untouched, and the same weights give the
        # same verdicts as the registered name (same samples, same seed, model-independent draws)
        assert any("caller's model still in training mode: True" in t for t in texts)
        assert any("accuracy on x_adv" in t for t in texts)
        rec = {m: pd.read_parquet(out / m / "records.parquet") for m in ("my_pid", "pid_deit")}
        pgd = {m: r[(r.attack == "pgd") & (r.eps.round(6) == round(4 / 255, 6))] for m, r in rec.items()}
        assert len(pgd["my_pid"]) == 32
        assert pgd["my_pid"].correct_top1.tolist() == pgd["pid_deit"].correct_top1.tolist()
    finally:
        shutil.rmtree(out, ignore_errors=True)

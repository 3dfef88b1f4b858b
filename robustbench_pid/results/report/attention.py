"""``attention.parquet`` (``evaluate --analyze attention``): loading, intervals and paired model comparisons.

The file is tidy: one row per (sample, condition, layer, metric) with ``sample_id``, ``attack`` (``clean``
or the attack), ``eps``, ``settings_id`` (the condition's identity, as in the records), ``layer`` (0 =
embeddings, l = output of block l), ``metric``, ``value``, ``moved`` (the attack changed the sample's
pixels; False on the clean condition and for samples not attacked) and ``note`` (why a value is absent:
then ``value`` is NaN). Definitions of the metrics: ``robustbench_pid/probes/`` and docs/benchmarks.md.

Load it with :func:`load_attention` (``rbp.load_attention(run)``): ``load_records`` keeps returning the
per-sample records. :func:`summarize_attention` gives the mean per (run, condition, layer, metric) with
a 95% normal interval of the mean, over every sample for the clean condition and over the samples the
attack moved for an attack ("what the attention does on the samples the attack moved").
:func:`paired_attention` compares two models on the same samples, layer by layer (Wilcoxon signed-rank
p-value from scipy, paired bootstrap interval of the mean difference from ``stats``). Pandas only.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np
import pandas as pd

from ...errors import UserError
from ..stats.metrics import Z95
from ..stats.stats import paired_bootstrap
from ..store import load_runs
from ..files.verify import verify_run_files

FILE = "attention.parquet"
# metric -> (what it is, the paper claim it tests)
METRICS: Dict[str, tuple] = {
    "shift": ("||h_l(x_adv) - h_l(x)|| / ||h_l(x)||", "PIDformer: softmax's steady state is input-sensitive; PID damps it"),
    "token_similarity": ("mean pairwise cosine of the tokens (A.6)", "PIDformer: rank collapse with depth"),
    "effective_rank": ("exp(entropy of the normalised singular values)", "PIDformer: PID keeps token diversity"),
    "attention_entropy": ("mean over heads and queries of the attention rows' entropy (nats)",
                          "both: how the attention spreads under attack"),
    "pid_error_norm": ("||e^l|| = ||beta v^0 - v^l||", "PIDformer: the controller's error"),
    "pid_share_attn": ("share of softmax(qk)v in the sum of the four terms' norms", "PIDformer: how much PID acts"),
    "pid_share_p": ("share of lP e^l", "PIDformer"), "pid_share_i": ("share of lI sum e", "PIDformer"),
    "pid_share_d": ("share of lD (e^l - e^{l-1})", "PIDformer"),
    "pap_sparse_norm": ("||S|| of the sparse part PAP removes from the keys", "RPC: PAP removes the corruption"),
    "pap_sparse_fraction": ("||S|| / ||K||", "RPC: PAP removes the corruption"),
    # derived by with_shift_gain, not recorded: the perturbation's growth through the whole block stack
    "shift_gain": ("shift at the last layer / shift at layer 0 (embeddings), per sample",
                   "PIDformer: PID damps the perturbation through depth"),
}
GROUP = ["run_id", "model", "attack", "eps", "settings_id", "layer", "metric"]


def _read(run_dir: Path) -> pd.DataFrame:
    """A run's attention.parquet, checked against the sha256 finalize recorded in its run.json."""
    verify_run_files(run_dir, names=(FILE,))
    return pd.read_parquet(run_dir / FILE)


def load_attention(path: Union[str, Path, Sequence[Union[str, Path]]]) -> pd.DataFrame:
    """The ``attention.parquet`` rows of one run folder or of every complete run under a folder
    (several paths: all of them). A run folder named itself without the file is an error naming the
    fix; runs without it under a folder are left out with a warning."""
    paths = [path] if isinstance(path, (str, Path)) else list(path)
    frames: List[pd.DataFrame] = []
    seen: set = set()
    for p in paths:
        loaded = load_runs(p)
        for run in loaded.runs:
            if Path(run["path"]).resolve() in seen:  # a run given twice (or inside a folder also given) counts once
                continue
            seen.add(Path(run["path"]).resolve())
            f = Path(run["path"]) / FILE
            if f.is_file():
                frames.append(_read(Path(run["path"])))
            elif Path(run["path"]) == Path(p):
                raise UserError(f"{p} has no {FILE}: re-run its evaluate command with --analyze attention "
                                f"(the same --out: the analysis is part of the unit keys, so it computes anew)")
            else:
                warnings.warn(f"{run['path']}: no {FILE} (run without --analyze attention); left out", stacklevel=2)
    if not frames:
        raise UserError(f"no {FILE} under {', '.join(map(str, paths))}: evaluate with --analyze attention first")
    return pd.concat(frames, ignore_index=True)


def attention_of_runs(runs: Sequence[Dict[str, Any]]) -> Optional[pd.DataFrame]:
    """The attention rows of already-loaded runs (``Inputs.runs``: run.json + ``path``), None if none has them."""
    paths = dict.fromkeys(Path(r["path"]).resolve() for r in runs if r.get("path"))  # a run given twice: once
    frames = [_read(p) for p in paths if (p / FILE).is_file()]
    return pd.concat(frames, ignore_index=True) if frames else None


def analysed(df: pd.DataFrame) -> pd.DataFrame:
    """The rows a summary uses: every sample of the clean condition, the moved samples of an attack."""
    return df[(df["attack"] == "clean") | df["moved"].astype(bool)]


def summarize_attention(df: pd.DataFrame) -> pd.DataFrame:
    """Mean, 95% normal interval, sd and n per (run, model, condition, layer, metric); absent metrics
    keep a row with n = 0, NaN value and their ``note``."""
    if df.empty:
        return pd.DataFrame(columns=GROUP + ["value", "ci_low", "ci_high", "sd", "n", "note"])
    d = analysed(df)
    g = d.groupby(GROUP, sort=True, dropna=False)
    out = g["value"].agg(value="mean", sd="std", n="count").reset_index()
    notes = g["note"].agg(lambda s: next((x for x in s if x), "")).reset_index(drop=True)
    out["note"] = notes.values
    half = Z95 * out["sd"].fillna(0.0) / np.sqrt(out["n"].clip(lower=1))
    out["ci_low"], out["ci_high"] = out["value"] - half, out["value"] + half
    return out[GROUP + ["value", "ci_low", "ci_high", "sd", "n", "note"]]


def with_shift_gain(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` plus ``shift_gain`` rows (at each model's last layer): per sample, the last layer's shift over
    the embeddings' (layer 0) shift; > 1 means the blocks amplified the perturbation, < 1 damped it.
    Only for samples the attack moved (layer-0 shift > 0); the clean condition has none."""
    s = df[(df["metric"] == "shift") & (df["attack"] != "clean") & df["moved"].astype(bool)]
    if s.empty or "shift_gain" in set(df["metric"]):
        return df
    top = s.groupby("run_id")["layer"].transform("max")
    last, first = s[s["layer"] == top], s[s["layer"] == 0]
    keys = ["run_id", "attack", "eps", "settings_id", "sample_id"]
    m = last.merge(first[keys + ["value"]], on=keys, suffixes=("", "_0"))
    m = m[m["value_0"] > 0]
    gain = m.assign(metric="shift_gain", value=m["value"] / m["value_0"]).drop(columns="value_0")
    return pd.concat([df, gain], ignore_index=True)


def last_layer(summary: pd.DataFrame, metric: str = "shift") -> pd.DataFrame:
    """Each model's value of ``metric`` at its last layer, per condition."""
    s = summary[summary["metric"] == metric]
    if s.empty:
        return s
    top = s.groupby("model")["layer"].transform("max")
    return s[s["layer"] == top].sort_values(["model", "attack", "eps"]).reset_index(drop=True)


def paired_attention(df: pd.DataFrame, model_a: str, model_b: str, metric: str = "shift", n_boot: int = 1000,
                     seed: int = 0) -> pd.DataFrame:
    """B minus A, per (attack, eps, settings, layer), on the samples both have (moved by the attack in
    both, for an attack): mean of each, the mean difference with a paired-bootstrap 95% interval, the
    Wilcoxon signed-rank p-value and whether p < 0.05."""
    from scipy.stats import wilcoxon

    d = analysed(df[df["metric"] == metric].dropna(subset=["value"]))
    a, b = d[d["model"] == model_a], d[d["model"] == model_b]
    if a.empty or b.empty:
        raise UserError(f"paired_attention: no {metric!r} rows for {model_a if a.empty else model_b!r}")
    keys = ["attack", "eps", "settings_id", "layer", "sample_id"]
    m = a[keys + ["value"]].merge(b[keys + ["value"]], on=keys, suffixes=("_a", "_b"))
    rows = []
    for (attack, eps, sid, layer), g in m.groupby(["attack", "eps", "settings_id", "layer"], sort=True):
        va, vb = g["value_a"].to_numpy(), g["value_b"].to_numpy()
        diff = vb - va
        if np.allclose(diff, 0):
            p, lo, hi = 1.0, 0.0, 0.0
        else:
            p = float(wilcoxon(vb, va).pvalue)
            bs = paired_bootstrap(np.mean, va, vb, n_boot=n_boot, seed=seed)
            lo, hi = bs.ci_low, bs.ci_high
        rows.append({"attack": attack, "eps": eps, "settings_id": sid, "layer": int(layer), "metric": metric,
                     "model_a": model_a, "model_b": model_b, "n": len(g), "mean_a": float(va.mean()),
                     "mean_b": float(vb.mean()), "delta": float(diff.mean()), "ci_low": lo, "ci_high": hi,
                     "p_wilcoxon": p, "significant": bool(p < 0.05)})
    return pd.DataFrame(rows)


def run_suffix(summary: pd.DataFrame) -> Dict[tuple, str]:
    """(model, attack, eps, run_id, settings_id) -> " (run)" where one model's condition comes from several runs
    or settings (PGD-2 and PGD-10 at one eps), so their rows are told apart instead of merged; "" otherwise."""
    keys = ["model", "attack", "eps", "run_id", "settings_id"]
    u = summary[keys].drop_duplicates()
    many = u.groupby(["model", "attack", "eps"])["run_id"].transform("size") > 1
    return {tuple(r[k] for k in keys): (f" ({r['run_id']})" if m else "") for (_, r), m in zip(u.iterrows(), many)}

"""Regression checks for CI: compare results with a committed baseline CSV.

A baseline is a plain CSV (one row per model, dataset, protocol, attack, eps, metric with value,
n and its 95% interval, and what the number means: the condition's settings and sample set, and
where it was made: device, precision, library versions), reviewable in a pull request. ``check``
fails when a number gets worse by more than the tolerance (in percentage points; "worse" is lower
for accuracies and AUPR, higher for mCE/CE/FPR), when a baseline row is missing, and when a number
no longer measures the same thing:

- ``SETTINGS-CHANGED``: the attack behind the row changed (fewer steps, another step size, no
  random start, another loss, the paper instead of the standard protocol, ...). A weaker attack
  must never pass for an improvement; the report names each setting (old -> new), and
  ``--update`` is how a change is accepted on purpose.
- ``STATUS-CHANGED``: a converged value (``--converge``) changed status (``converged`` to ``not
  converged`` or to ``upper bound: gradients unavailable``, or back): the number no longer means the
  same kind of thing, even when its value held. A converged value that *rose* is ``improved`` only when both
  sides are exactly ``converged`` with the same recorded ladder settings; otherwise it fails as
  ``STATUS-CHANGED`` (a reduced, unfinished or bounded ladder on either side) or ``SETTINGS-CHANGED`` (no
  ladder settings recorded): a weaker ladder must not pass for a more robust model.
- ``SAMPLES-CHANGED``: the number was computed on another sample set (n or ids). When the results
  carry per-sample records and the baseline has its per-sample sidecar (written by ``--update``),
  old and new are shown on the samples both have.

Device and precision: the same command gives bit-identical numbers on the same device and
precision, and numbers that differ by floating-point rounding elsewhere (docs/devices.md). Against
a baseline made on another device type or precision, ``check`` says so and fails only on drops that
are also significant (as with ``--significant``); same-device checks keep the plain tolerance.

``significant=True`` (CI-aware mode) also requires the drop to be statistically significant: the
95% interval of new - old (Newcombe's method from the two Wilson intervals) must lie entirely on
the worse side of zero. Rows without intervals (e.g. mCE without a bootstrap interval) fall back to
the tolerance alone. Baselines written before settings were recorded still work, with a warning.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import pandas as pd

from .baseline import (BASELINE_COLUMNS, CHECK_KEY, ENVIRONMENT, check_update_target, normalize, read_baseline,
                       read_sidecar, sidecar, write_baseline)  # noqa: F401 (sidecar: part of this interface)
from .compare import compare, lower_is_better  # noqa: F401  (lower_is_better: part of this module's interface)
from ...errors import UserError
from ..inputs import as_inputs
from ...core.labels import eps_text
from ..summaries.converge import CONVERGE_METRICS

FAILING = ("REGRESSED", "MISSING", "SETTINGS-CHANGED", "SAMPLES-CHANGED", "STATUS-CHANGED", "INVALID")
# The ladder's evidence, not robustness: its curve (evidence-driven rungs differ between runs), its cost and the
# user's attack's gap to it. Its end, the converged top-1, and its status are gated.
NOT_GATED = CONVERGE_METRICS
# The ``cost`` benchmark's rows (parameters, multiply-adds, seconds and memory per sample) measure the model and
# the machine, not robustness: times move with the machine's load, so gating them would fail CI at random.
NOT_GATED_BENCHMARKS = ("cost",)


def _gated(df: pd.DataFrame) -> pd.DataFrame:
    bench = df["benchmark"].astype("string").fillna("") if "benchmark" in df.columns else ""
    return df[~df["metric"].isin(NOT_GATED) & ~(pd.Series(bench, index=df.index).isin(NOT_GATED_BENCHMARKS))]

@dataclass
class CheckResult:
    rows: pd.DataFrame  # one row per compared key with a status
    tolerance: float
    significant: bool
    baseline: str = ""
    notes: List[str] = field(default_factory=list)

    @property
    def failures(self) -> pd.DataFrame:
        return self.rows[self.rows["status"].isin(FAILING)]

    @property
    def ok(self) -> bool:
        return self.failures.empty

    def report(self, verbose: bool = False) -> str:
        """Readable diff: the rows that changed (all rows with ``verbose``), what changed, a summary line. Rows the
        baseline lacks ("new": a metric recorded since, a model added) are one line without ``verbose``: they pass,
        and a baseline older than the telemetry would list every telemetry row of every run."""
        r = self.rows
        counts = r["status"].value_counts()
        show = r if verbose else r[~r["status"].isin(["ok", "new"])]
        lines: List[str] = []
        if len(show):
            t = show.assign(
                eps=[eps_text(e, n) for e, n in zip(show["eps"], show["norm"])],
                old=[_f(v) for v in show["old"]], new=[_f(v) for v in show["new"]],
                delta=[_f(v, signed=True) for v in show["delta"]],
                interval=[f"[{_f(lo)}, {_f(hi)}]" if pd.notna(lo) else "" for lo, hi in
                          zip(show["new_ci_low"], show["new_ci_high"])],
                **{"delta 95% CI": [f"[{_f(lo, True)}, {_f(hi, True)}]" if pd.notna(lo) else "" for lo, hi in
                                    zip(show["delta_ci_low"], show["delta_ci_high"])]},
            )[["status", "model", "dataset", "protocol", "attack", "eps", "metric", "old", "new", "delta",
               "interval", "delta 95% CI"]]
            lines.append(t.to_string(index=False))
            lines.append("")
        fresh = r[r["status"] == "new"]
        if len(fresh) and not verbose:
            lines += [f"new (not in the baseline, not compared; --verbose lists them, --update adds them): {len(fresh)} "
                      f"rows of {', '.join(dict.fromkeys(map(str, fresh['model'])))}: metrics "
                      f"{', '.join(sorted(set(map(str, fresh['metric']))))}", ""]
        changed = r[r["status"].isin(["SETTINGS-CHANGED", "SAMPLES-CHANGED", "STATUS-CHANGED"])]
        for _, c in r[r["status"].isin(["SETTINGS-CHANGED", "SAMPLES-CHANGED", "STATUS-CHANGED", "INVALID"])].iterrows():
            lines.append(f"{c['status']}: {c['model']} {c['dataset']} {c['attack']} "
                         f"eps={eps_text(c['eps'], c['norm'])} {c['metric']}: {c['changes']}")
        if len(changed):
            lines.append("the numbers above no longer measure the same thing as the baseline; if the change is "
                         "deliberate, accept it with --update")
            lines.append("")
        mode = "significant drops only (Newcombe 95% interval of new-old)" if self.significant else "any drop"
        lines.append(
            f"check against {self.baseline or 'baseline'}: {len(r)} rows; "
            f"{counts.get('ok', 0)} ok, {counts.get('REGRESSED', 0)} regressed, {counts.get('MISSING', 0)} missing, "
            f"{counts.get('SETTINGS-CHANGED', 0)} with changed settings, {counts.get('SAMPLES-CHANGED', 0)} with "
            f"changed samples, {counts.get('STATUS-CHANGED', 0)} with a changed converge status, "
            f"{counts.get('INVALID', 0)} not a number, {counts.get('improved', 0)} improved, {counts.get('within-noise', 0)} drops not "
            f"significant, {counts.get('new', 0)} new; tolerance {self.tolerance:g} pp, failing on {mode}")
        lines += [f"note: {n}" for n in self.notes]
        lines.append("FAILED" if not self.ok else "PASSED")
        return "\n".join(lines)


def _f(v: Any, signed: bool = False) -> str:
    if v is None or pd.isna(v):
        return "-"
    return f"{v:+.2f}" if signed else f"{v:.2f}"


def _run_environment(runs: Sequence[Dict[str, Any]]) -> Dict[str, Dict[str, str]]:
    """run_id -> device type, precision and library versions, from each run's run.json."""
    env: Dict[str, Dict[str, str]] = {}
    for info in runs:
        dev = info.get("device") or ""
        devs = dev if isinstance(dev, list) else [dev]
        kinds = sorted({str(d).split(":")[0] for d in devs if d})
        v = info.get("versions") or {}
        env[str(info.get("run_id", ""))] = {
            "device": "+".join(kinds), "precision": str(info.get("precision") or ""),
            "versions": " ".join(f"{k}={v[k]}" for k in ("robustbench_pid", "torch", "timm") if k in v)}
    return env


def current_rows(data: Any, metrics: Optional[Sequence[str]] = None,
                 ce_baseline: Optional[str] = None) -> pd.DataFrame:
    """Tidy results reduced to one row per check key and settings (ambiguity is an error, not a guess)."""
    inp = as_inputs(data, ce_baseline=ce_baseline)
    df = inp.rows.copy()  # every row, not the de-duplicated view of the tables: two runs of one key are refused
    env = _run_environment(inp.runs)
    if env and "run_id" in df.columns:
        for col in ENVIRONMENT:
            from_run = df["run_id"].astype(str).map(lambda r, c=col: env.get(r, {}).get(c, ""))
            if col in df.columns:
                df[col] = df[col].astype("string").fillna("").astype(str).where(lambda x: x != "", from_run)
            else:
                df[col] = from_run
    df = normalize(df)
    ungated = sorted(set(metrics or ()) & set(df.loc[df.index.difference(_gated(df).index), "metric"]))
    if ungated:
        raise UserError(f"--metric {', '.join(ungated)}: not gated by check (the ladder's evidence and the cost "
                        f"benchmark's times, memory and counts are reported, not compared); choose another metric")
    df = _gated(df)
    if metrics:
        df = df[df["metric"].isin(metrics)]
    # one measurement repeated (a study's rows each recompute the clean pass on the same samples, same model): kept
    # once; two different numbers under one key stay an error below
    same = [c for c in ("samples_id", "checkpoint_sha256", "value", "n") if c in df.columns]
    if same and "run_id" in df.columns:  # across runs only: a row twice in one run is a damaged input, refused below
        as_text = df.astype({c: str for c in same + ["run_id"]})
        repeated = as_text.duplicated(CHECK_KEY + ["_match"] + same, keep="first")
        in_one_run = as_text.duplicated(CHECK_KEY + ["_match"] + same + ["run_id"], keep=False)
        df = df[~(repeated & ~in_one_run)]
    dup = df.duplicated(CHECK_KEY + ["_match"], keep=False)
    if dup.any():
        d = df[dup].iloc[0]
        runs = sorted(set(df[dup & (df[CHECK_KEY] == d[CHECK_KEY]).all(axis=1)]["run_id"].astype(str)))
        raise UserError(f"the results hold {int(dup.sum())} rows sharing a key, e.g. {d['model']} {d['dataset']} "
                        f"{d['protocol']} {d['attack']} eps={eps_text(d['eps'], d['norm'])} {d['metric']} "
                        f"with identical settings (runs {', '.join(runs)}); point check at one run folder per "
                        f"model/setting")
    out = df[BASELINE_COLUMNS + ["_match", "run_id", "norm"]].reset_index(drop=True)
    out.attrs["records"] = inp.records
    return out


def check(results: Any, baseline: Union[str, Path], tolerance: float = 0.0,
          metrics: Optional[Sequence[str]] = None, significant: bool = False,
          ce_baseline: Optional[str] = None) -> CheckResult:
    """Compare ``results`` (paths, tidy DataFrame) with the baseline CSV; see the module docstring.

    ``ce_baseline``: the model whose corruption errors normalize CE/mCE outside ImageNet."""
    cur = current_rows(results, metrics, ce_baseline)
    base = _gated(read_baseline(baseline))  # a baseline written before a metric stopped being gated
    notes: List[str] = []
    if metrics:
        unknown = set(metrics) - set(base["metric"]) - set(cur["metric"])
        if unknown:
            raise UserError(f"--metric {', '.join(sorted(unknown))}: not in the baseline or the results; present: "
                            f"{', '.join(sorted(set(base['metric']) | set(cur['metric'])))}")
        base = base[base["metric"].isin(metrics)]
    if cur.empty:
        raise UserError("the results hold no rows to check" + (" for the chosen --metric" if metrics else ""))
    if base.empty:  # every result row would be "new" and the check would pass having compared nothing
        raise UserError(f"the baseline {baseline} holds no rows to compare with" +
                        (f" for --metric {', '.join(metrics)}" if metrics else "") +
                        "; write one from trusted results with --update, or point --baseline at the right file")
    sha_old = base.dropna(subset=["checkpoint_sha256"]).groupby("model")["checkpoint_sha256"].first() \
        if "checkpoint_sha256" in base.columns else pd.Series(dtype=str)
    sha_new = cur.dropna(subset=["checkpoint_sha256"]).groupby("model")["checkpoint_sha256"].first()
    for model in sorted(set(sha_old.index) & set(sha_new.index)):
        if sha_old[model] != sha_new[model]:
            notes.append(f"{model}: checkpoint changed ({str(sha_old[model])[:12]} -> {str(sha_new[model])[:12]})")
    absent = sorted(set(base["model"].astype(str)) - set(cur["model"].astype(str)))
    if absent:
        notes.append(f"model(s) {', '.join(absent)} of the baseline are not in the results at all: evaluate them "
                     f"too, or check against a baseline of the models you ran")
    v_old, v_new = _one(base["versions"]), _one(cur["versions"])
    if v_old and v_new and v_old != v_new:
        notes.append(f"library versions differ: baseline {v_old}; results {v_new}")
    base_v = read_sidecar(baseline)
    rows = compare(cur, base, tolerance=tolerance, significant=significant, base_verdicts=base_v, notes=notes)
    norms = cur.drop_duplicates("attack").set_index("attack")["norm"]  # how each attack's eps is written
    rows = rows.assign(norm=rows["attack"].map(norms).fillna("")) if len(rows) else rows.assign(norm="")
    return CheckResult(rows, tolerance, significant, str(baseline), notes)


def _one(s: pd.Series) -> str:
    vals = sorted(set(x for x in s.astype(str) if x))
    return "; ".join(vals)


def update(results: Any, baseline: Union[str, Path], metrics: Optional[Sequence[str]] = None,
           ce_baseline: Optional[str] = None) -> pd.DataFrame:
    """Rewrite the baseline from the results (deliberately); returns what changed against the old one."""
    cur = current_rows(results, metrics, ce_baseline)
    if cur.empty:
        raise UserError("the results hold no rows to write" + (" for the chosen --metric" if metrics else ""))
    p = Path(baseline)
    check_update_target(p)
    if p.is_file():
        try:
            old = read_baseline(p)
        except UserError as exc:
            raise UserError(f"refusing to overwrite {p}: {exc}; choose another --baseline path") from None
    else:
        old = None
    changes = compare(cur, old if not metrics else old[old["metric"].isin(metrics)]) if old is not None \
        else cur.assign(status="new")
    records = cur.attrs.get("records")
    if old is not None and metrics:  # only the chosen metrics are rewritten; the others stay as they were
        keep = old[~old["metric"].isin(metrics)]
        cur = pd.concat([keep.reindex(columns=BASELINE_COLUMNS), cur], ignore_index=True)
    write_baseline(cur, p, records)
    return changes

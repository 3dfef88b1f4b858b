"""The worst-case row of the paper table: what it combines, and the rows it combines.

A worst case over attacks (``summaries.adversarial``) is only as meaningful as the attacks behind
it: "Worst case (4/255)" computed from PGD-10 runs next to a PGD row that shows PGD-20 reads as a
worst case of the attacks shown, and it is not. So the row names the attacks it combines, and
each combined condition whose own row the table does not already show (same attack, eps and
settings) gets a row right below it.
"""
from __future__ import annotations

from typing import List, Set, Tuple

import pandas as pd

from ...core.labels import eps_text


def worst_case_parts(text: str, rows: pd.DataFrame, acc: pd.DataFrame,
                     shown: Set[Tuple[str, float, str]]) -> Tuple[str, List[Tuple[str, pd.DataFrame]]]:
    """(the row's label naming what it combines, [(label, rows)] of the combined conditions not
    shown yet). ``rows``: the worst-case tidy rows of one setting at one eps; ``acc``: the table's
    accuracy rows; ``shown``: (attack, eps_key, settings_id) of the rows already in the table."""
    if rows.empty or "settings" not in rows.columns:
        return text, []
    eps = rows["eps_key"].iloc[0]
    parts = [p for p in str(rows["settings"].iloc[0]).split("+") if p]
    comps = acc[acc["settings_id"].isin(parts) & (acc["eps_key"] == eps) & (acc["attack"] != "worst-case")]
    if comps.empty:
        return text, []
    first = comps.drop_duplicates("settings_id")
    # the setting's short name (``PGD-10`` of ``PGD-10 (step 2.5·eps/10, ...)``), else the attack's label
    names = [s.split(" (")[0] or lab for lab, s in zip(first["attack_label"].astype(str), first["setting"].astype(str))]
    out = []
    for (_, r), name in zip(first.iterrows(), names):
        if (r["attack"], r["eps_key"], r["settings_id"]) in shown:
            continue
        setting = str(r["setting"]) or name
        out.append((f"↳ {setting} at {eps_text(r['eps_key'], str(r['norm']))}",
                    comps[comps["settings_id"] == r["settings_id"]]))
    return f"{text} over {' + '.join(names)}", out

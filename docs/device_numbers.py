"""The GPU figures of the docs, rendered from what a lent GPU machine ran (docs/generate_numbers.py calls these).

A GPU session copies its runs, as they came back, into ``docs/runs/devices/<machine>-<date>/``:

- ``doctor.json``: ``robustbench-pid doctor --device cuda --json FILE`` (the rows of docs/performance.md's
  GPU table);
- ``claims-digits/<column>/<protocol>/<row>/``: ``reproduce claims-digits --model M [--converge] --only ROW
  --chunk-size 120 --device cuda``, the same command as the CPU reference run under
  ``docs/runs/claims-digits/``;
- ``converge/<model>@<eps>/``: the ladder runs of ``scripts/bench_converge.py --device cuda`` (``evaluate
  --attack pgd --steps 20 --converge --limit 360``), compared with the CPU reference run's converged row at
  that eps: the same attack and ladder settings, but other work units (chunks of 512, not 120), so other
  random starts; only the converged condition is compared there (the worst case over the ladder, which
  should not depend on the starts), not PGD-20 alone.

Only ``records.parquet``, ``summary.csv`` and ``run.json`` are kept. Each GPU condition is set beside the
CPU one on the same samples: robust top-1 on each device, how many samples' verdicts differ, and for a
converged condition the ladder's status on each device (docs/devices.md).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
DEVICE_RUNS = ROOT / "docs" / "runs" / "devices"
CPU_CLAIMS = ROOT / "docs" / "runs" / "claims-digits"


def _cpu_counterpart(run: Path) -> Path:
    """The committed CPU run a device run is compared with."""
    rel = Path(*run.relative_to(DEVICE_RUNS).parts[1:])  # below the session folder
    if rel.parts[0] == "claims-digits":
        return CPU_CLAIMS.joinpath(*rel.parts[1:])
    model, eps = rel.parts[1].split("@")
    columns = sorted(CPU_CLAIMS.glob(f"{model}@*"))
    if len(columns) != 1:
        raise SystemExit(f"docs/device_numbers.py: no single CPU claims-digits column for {model!r}")
    return columns[0] / "converged" / f"pgd-{eps.split('-')[0]}"


def device_runs() -> Iterator[Tuple[Path, Path]]:
    """(device run, its CPU counterpart) for every complete device run, in a stable order."""
    from robustbench_pid.results.files.verify import is_complete

    for info in sorted(DEVICE_RUNS.glob("*/**/run.json")):
        if is_complete(info.parent):
            yield info.parent, _cpu_counterpart(info.parent)


def agreement(run: Path, cpu: Path) -> List[Dict]:
    """Per condition of ``run``: n, robust top-1 on the CPU and on the device, verdicts that differ, and the
    ladder's status on each (converged conditions)."""
    from robustbench_pid.results.store import load_records
    from robustbench_pid.results.summaries.converge import condition_status, condition_verdict

    a, b = load_records(cpu), load_records(run)
    info = [json.loads((d / "run.json").read_text()) for d in (cpu, run)]
    same_units = all(info[0][k] == info[1][k] for k in ("chunk_size", "batch_size", "seed"))
    out = []
    for (bench, attack, eps), g in b.groupby(["benchmark", "attack", "eps"], sort=False):
        if not same_units and bench != "converge":
            continue  # other unit boundaries: other random starts, so the difference is not the device's
        h = a[(a["benchmark"] == bench) & (a["attack"] == attack) & ((a["eps"] - eps).abs() < 1e-9)]
        dev = g.set_index(g["sample_id"].astype(str))["correct_top1"].astype(bool)
        ref = h.set_index(h["sample_id"].astype(str))["correct_top1"].astype(bool)
        shared = dev.index.intersection(ref.index)
        row = {"condition": f"{attack} {round(eps * 255)}/255" if eps else attack, "n": len(shared),
               "cpu": 100 * ref.loc[shared].mean(), "gpu": 100 * dev.loc[shared].mean(),
               "differ": int((ref.loc[shared] != dev.loc[shared]).sum()), "status": ""}
        row["why"] = ""
        if bench == "converge":
            row["status"] = f"{condition_status(h)} / {condition_status(g)}"
            if condition_status(h) != condition_status(g):  # e.g. other work units: the stop rule saw other chunks
                row["why"] = (f"CPU ({info[0]['chunk_size']}-sample units): {condition_verdict(h)[1]}; GPU "
                              f"({info[1]['chunk_size']}-sample units): {condition_verdict(g)[1]}")
        out.append(row)
    return out


def agreement_table() -> str:
    """docs/devices.md: each device run beside its CPU reference run."""
    lines, every = [], list(device_runs())
    for session in sorted(p for p in DEVICE_RUNS.iterdir() if p.is_dir()):
        runs = [(r, c) for r, c in every if session in r.parents]
        if not runs:
            continue
        info = json.loads((runs[0][0] / "run.json").read_text())
        v = info["versions"]
        lines += [f"{info['device_name']}, {str(info['finished'])[:10]}, torch {v['torch']}, timm {v['timm']}, "
                  f"pyautoattack {v.get('pyautoattack', '-')}, {info['precision']} (runs in "
                  f"`docs/runs/devices/{session.name}/`):", "",
                  "| run | condition | n | CPU robust top-1 | GPU robust top-1 | verdicts that differ | "
                  "ladder status CPU / GPU |", "|---|---|---|---|---|---|---|"]
        whys = []
        for run, cpu in runs:
            name = str(run.relative_to(session))
            for r in agreement(run, cpu):
                lines.append(f"| {name} | {r['condition']} | {r['n']} | {r['cpu']:.2f} | {r['gpu']:.2f} | "
                             f"{r['differ']} | {r['status'] or '-'} |")
                if r["why"]:
                    same = "the same samples broken" if r["differ"] == 0 else f"{r['differ']} verdicts differ"
                    whys.append(f"- {name}, {r['condition']} ({same}): {r['why']}.")
        lines.append("")
        if whys:
            lines += ["Where the ladder's status differs, the stop rule saw other work units (each unit's ladder "
                      "stops on its own, and the condition is converged only if its units' last full rungs together "
                      "broke at most the condition's tolerance):", "", *whys, ""]
    return "\n".join(lines) if lines else "No GPU run is committed yet."


def doctor_table() -> str:
    """docs/performance.md: every doctor run on a GPU, its header line and its rows as it printed them."""
    out = []
    for path in sorted(DEVICE_RUNS.glob("*/doctor.json")):
        d = json.loads(path.read_text())
        env, c = d["environment"], d["counts"]
        v, dev = env["versions"], env["device"]
        out += [f"`robustbench-pid doctor --device {d['device'].split(':')[0]} --json FILE`"
                f"{' --quick' if d['quick'] else ''} on {dev['name']} ({dev['memory_gib']} GiB, compute capability "
                f"{dev.get('capability', '-')}), {d['date_utc']} UTC; robustbench_pid {v['robustbench_pid']}, torch "
                f"{v['torch']}, timm {v['timm']}, CUDA build {v.get('cuda_build', '-')}, driver {v.get('driver', '-')}; "
                f"{c['PASS']} PASS, {c['WARN']} WARN, {c['FAIL']} FAIL, {c['SKIP']} SKIP "
                f"(`docs/runs/devices/{path.parent.name}/doctor.json`):", "",
                "| section | check | result | figures |", "|---|---|---|---|"]
        out += [f"| {r['section']} | {r['name']} | {r['verdict']} | {r['line'].replace('|', chr(92) + '|')} |"
                for r in d["checks"]]
        out.append("")
    return "\n".join(out) if out else "No doctor run on a GPU is committed yet."

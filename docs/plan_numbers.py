"""The planning figure of docs/scaling.md: PIDformer Table 1's attack rows on 50,000 images on one GPU,
computed (not measured here) from the pass counts the harness plans and the throughputs issue 10 quotes.

Arithmetic only, no run: ``robustbench_pid.run.speed.table1_estimate`` (what ``doctor`` and
``evaluate --dry-run --calibration`` price) at issue 10's H100 forward+backward rates, with the forward
rate taken as that rate x 2.0 and x 2.5 (a backward pass to the input, parameters frozen, costs about one
more forward; ``scripts/bench_e2e.py --plan-table1`` measures the ratio on the machine it runs on).
Rendered into docs/scaling.md by docs/generate_numbers.py (block ``scaling-plan``).
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ISSUE10_H100_FB = {"fp32": 3941.0, "bf16": 9300.0}  # img/s, PID DeiT-tiny, batch 256, 224 px (issue 10's author)
RATIOS = (2.0, 2.5)  # forward rate / forward+backward rate assumed
SHARDS = 4  # the seed papers ran on 4 GPUs


def plan_table() -> str:
    """One row per precision: the assumed forward rates, the hours on one GPU, SPSA's share, and 4 shards."""
    sys.path.insert(0, str(ROOT))
    from robustbench_pid.run.speed import table1_estimate

    head = ("| one H100 | r_fb img/s (issue 10) | r_fwd img/s (ratio " + " / ".join(f"{r:g}" for r in RATIOS) +
            ") | Table 1 attack rows, 50,000 images, one GPU | SPSA share | the same on " + str(SHARDS) +
            " GPUs splitting the units (wall) |")
    lines = [head, "|---|---|---|---|---|---|"]
    for prec, fb in ISSUE10_H100_FB.items():
        est = [table1_estimate(fb * r, fb) for r in RATIOS]
        hours = " / ".join(f"{e['seconds'] / 3600:.1f} h" for e in est)
        spsa = " / ".join(f"{100 * e['per_attack_s'].get('spsa', 0.0) / e['seconds']:.0f}%" for e in est)
        split = " / ".join(f"{e['seconds'] / SHARDS / 3600:.1f} h" for e in est)
        label = "fp32" if prec == "fp32" else "bf16 (`--precision bf16`, attack passes only)"
        lines.append(f"| {label} | {fb:,.0f} | {' / '.join(f'{fb * r:,.0f}' for r in RATIOS)} | **{hours}** | "
                     f"{spsa} | {split} |")
    e = table1_estimate(ISSUE10_H100_FB["fp32"] * RATIOS[0], ISSUE10_H100_FB["fp32"])
    rest = (e["seconds"] - e["per_attack_s"].get("spsa", 0.0)) / 3600
    lines += ["", f"Per image: {e['fwd_passes']:,.0f} forward + {e['fb_passes']:,.0f} forward+backward passes; "
                  f"everything but SPSA (FGSM + PGD sweep, SLD, noise, the clean pass) is {rest:.1f} h of the fp32 "
                  f"figure at ratio {RATIOS[0]:g}."]
    return "\n".join(lines)


if __name__ == "__main__":
    print(plan_table())

"""How large a step the gradient-trust probe may take (``benchmarks/ladder/probes.py`` ``gradients_mislead``): per
zoo model and eps, how many clean-correct test digits the probe flags on the plain model (false alarms: its
gradients are healthy) and on its sign-flipped twin (every one should be flagged), for steps of eps/4, eps/16,
eps/64 and the probe's own 2^-14 pixels. Why it exists: a step of eps/4 is beyond the linear regime of the zoo's
transformers, and the probe's step was chosen from this table.

    python scripts/probe_step.py                       # all 360 test digits, five cells
    python scripts/probe_step.py --limit 120 --models deit
"""
from __future__ import annotations

import argparse
import copy
import sys
from typing import List

import torch


CELLS = (("deit", "4/255"), ("deit", "1/255"), ("pid_deit", "2/255"), ("deit_at", "8/255"), ("pid_deit_at", "16/255"))


def main(argv: List[str] = None) -> int:
    import robustbench_pid as rbp
    from robustbench_pid.benchmarks.ladder.probes import PROBE_STEP, gradients_mislead
    from robustbench_pid.core.labels import parse_eps
    from robustbench_pid.models.gradient_wrappers import SignFlipped

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--limit", type=int, default=360)
    p.add_argument("--models", nargs="+", default=None, help="only these models' cells")
    a = p.parse_args(argv)
    ds = rbp.load_dataset("digits", split="test")
    n = min(a.limit, len(ds))
    x = torch.stack([ds[i][0] for i in range(n)])
    y = torch.tensor([int(ds[i][1]) for i in range(n)])
    print("| model | eps | clean-correct | step | flagged, plain model | flagged, sign-flipped twin |")
    print("|---|---|---|---|---|---|")
    for name, e in CELLS:
        if a.models and name not in a.models:
            continue
        net = rbp.load_model(name)
        eps = parse_eps(e)
        with torch.no_grad():
            ok = net(x).argmax(1) == y
        xs, ys = x[ok], y[ok]
        for label, step in (("eps/4", eps / 4), ("eps/16", eps / 16), ("eps/64", eps / 64), ("2^-14", PROBE_STEP)):
            counts = []
            for m in (net, SignFlipped(copy.deepcopy(net))):
                flags = torch.cat([gradients_mislead(m, xs[i:i + 120], ys[i:i + 120], step)
                                   for i in range(0, len(xs), 120)])
                counts.append(int(flags.sum()))
            print(f"| {name} | {e} | {len(xs)} | {label} | {counts[0]} | {counts[1]} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

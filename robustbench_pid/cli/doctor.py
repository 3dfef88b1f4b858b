"""``doctor``: does this installation run the harness right on this device, and how fast?"""
from __future__ import annotations

import argparse
from pathlib import Path

NAME = "doctor"
HELP = ("self-check of this installation on a device: environment, correctness (smoke evaluation against the CPU, "
        "bf16 and --compile against fp32, resume), speed (DeiT-tiny / PID DeiT-tiny images/s, the --calibration "
        "pair and a Table 1 estimate); a PASS/WARN/FAIL table, exit 1 on any FAIL")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N (default auto)")
    p.add_argument("--quick", action="store_true",
                   help="about a minute on a CPU (CI): small smoke runs and one tiny 224 px batch; the compiled rows "
                        "are skipped")
    p.add_argument("--json", type=Path, metavar="FILE",
                   help="write everything (versions, device, each check's verdict and figures, images/s, the "
                        "calibration pair) to FILE")


def run(args: argparse.Namespace) -> int:
    from ..errors import UserError

    if args.json is not None and not args.json.parent.is_dir():
        raise UserError(f"--json {args.json}: the folder {args.json.parent} does not exist; create it or give "
                        f"another path")
    if args.json is not None and args.json.is_dir():  # found now, not after minutes of checks
        raise UserError(f"--json {args.json} is a folder; give a file path, e.g. {args.json / 'doctor.json'}")
    from ..doctor import run_doctor

    return run_doctor(args.device, quick=args.quick, json_path=args.json).exit_code

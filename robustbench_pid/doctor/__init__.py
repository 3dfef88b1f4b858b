"""``robustbench-pid doctor``: does this machine run the harness right, and how fast?

A table of checks, each PASS / WARN / FAIL with one line, in three sections: the environment
(versions, device, bf16, ``torch.compile``, cores and workers), correctness (the embedded models'
smoke evaluation on the device against the CPU, bf16 and ``--compile`` against fp32, resume after an
interrupted unit) and speed (random-init DeiT-tiny and PID DeiT-tiny at 224 px, measured with
``robustbench_pid.run.speed``: the same code as the scripts in ``benchmarks/``). Any FAIL makes the
exit status 1. A check that raises is a FAIL whose line is the error, so one broken part never
hides the others.
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, TextIO, Tuple

from .base import VERDICTS, Check, Outcome, Settings  # noqa: F401 - the names checks and tests use

CheckFn = Callable[[Settings, Dict[str, Any]], Outcome]


def plan(settings: Settings) -> List[Tuple[str, str, CheckFn]]:
    """(section, name, check) in the order they run; later checks read what earlier ones stored."""
    from . import correctness, environment, speed_checks

    return [*environment.CHECKS, *correctness.CHECKS, *speed_checks.CHECKS]


@dataclass
class Report:
    checks: List[Check] = field(default_factory=list)
    state: Dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return 1 if any(c.verdict == "FAIL" for c in self.checks) else 0

    def counts(self) -> Dict[str, int]:
        return {v: sum(c.verdict == v for c in self.checks) for v in VERDICTS}

    def to_json(self, settings: Settings) -> Dict[str, Any]:
        return {"doctor": 1, "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
                "quick": settings.quick, "device": str(settings.device),
                "environment": self.state.get("environment", {}), "counts": self.counts(),
                "exit_code": self.exit_code, "checks": [asdict(c) for c in self.checks],
                "speed": self.state.get("speed", {}), "calibration": self.state.get("calibration", {})}


def run_one(section: str, name: str, fn: CheckFn, settings: Settings, state: Dict[str, Any]) -> Check:
    t = time.perf_counter()
    try:
        verdict, line, data = fn(settings, state)
        if verdict not in VERDICTS:
            raise ValueError(f"check returned verdict {verdict!r}")
    except Exception as exc:  # noqa: BLE001 - a broken part is a FAIL row, the others still run
        tb = traceback.extract_tb(exc.__traceback__)[-1]
        verdict, line = "FAIL", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} " \
                                f"(at {Path(tb.filename).name}:{tb.lineno})"
        data = {"error": repr(exc)}
    return Check(section, name, verdict, line, round(time.perf_counter() - t, 2), data)


def row(c: Check) -> str:
    return f"{c.section:11} {c.name:22} {c.verdict:4}  {c.line}  [{c.seconds:.1f} s]"


def run_doctor(device: str = "auto", quick: bool = False, json_path: Optional[Path] = None,
               out: Optional[TextIO] = None, settings: Optional[Settings] = None) -> Report:
    """Run every check, print the table as it goes, write ``json_path``; the report's ``exit_code``
    is 1 on any FAIL."""
    from ..runtime.device import pick_device
    from ..run.speed import machine

    out = out or sys.stdout
    dev = pick_device(device)  # a device that is not there: one error line, exit 2 (bad input)
    report = Report()
    with tempfile.TemporaryDirectory(prefix="rbp_doctor_") as tmp:
        s = settings or Settings.for_device(dev, quick, Path(tmp))
        if settings is not None:
            s.tmp = Path(tmp)
        print(f"robustbench-pid doctor{' --quick' if s.quick else ''} on {dev}: {machine()}", file=out, flush=True)
        print(f"{'section':11} {'check':22} {'':4}  result", file=out)
        t0 = time.perf_counter()
        checks = plan(s)
        for k, (section, name, fn) in enumerate(checks, 1):
            # which check is running, on stderr: some take minutes on a CPU, and the table row comes at its end
            print(f"[{k}/{len(checks)}] {section} {name} ...", file=sys.stderr, flush=True)
            c = run_one(section, name, fn, s, report.state)
            report.checks.append(c)
            print(row(c), file=out, flush=True)
        n = report.counts()
        print(f"{len(report.checks)} checks: {n['PASS']} PASS, {n['WARN']} WARN, {n['FAIL']} FAIL, {n['SKIP']} SKIP "
              f"in {time.perf_counter() - t0:.0f} s; exit {report.exit_code}", file=out, flush=True)
        if json_path is not None:
            try:
                from ..results.files.run_files import atomic_write_bytes

                atomic_write_bytes(Path(json_path), (json.dumps(report.to_json(s), indent=2, default=str) + "\n")
                                   .encode(), durable=False)  # a symlink at the path is replaced, not followed
            except OSError as exc:
                from ..errors import UserError

                raise UserError(f"--json {json_path}: cannot write it ({exc.strerror or exc}); the table above is "
                                f"complete, re-run with a writable path to keep the figures") from None
            print(f"wrote {json_path}", file=out)
    return report

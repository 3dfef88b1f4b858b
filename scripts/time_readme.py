"""How long the README's first commands take: each run once, as written, on this machine; wall seconds, dated,
the machine named. The README states no time of its own: its block ``readme-times`` is this script's output.

    python scripts/time_readme.py                  # run every command, print the table
    python scripts/time_readme.py --only doctor    # one of them (repeatable)
    python scripts/time_readme.py --render         # run them and write the table into README.md
    python scripts/time_readme.py --render --note "2 cores shared with other jobs"   # what the machine line cannot say

Each command runs in a fresh temporary folder (its ``results/`` lands there), with the clone's ``.venv/bin``
programs, so the figures are what a new user waits on this machine. Not a test and not a benchmark ratio: one
run per command on a machine that may be shared, which the table's machine line (load average) says.
"""
from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCK = "readme-times"
# (name, the command exactly as README.md spells it): tests/test_time_claims.py checks each is in README.md
COMMANDS: List[Tuple[str, str]] = [
    ("quickstart", ".venv/bin/evaluate --model pid_deit --attack pgd"),
    ("digits study", ".venv/bin/robustbench-pid reproduce digits-smoke --model pid_deit --limit 100"),
    ("claims audit", ".venv/bin/robustbench-pid reproduce claims-digits --all-columns --only clean --only pgd-3 "
                     "--limit 16"),
    ("doctor", ".venv/bin/robustbench-pid doctor --quick"),
]


def run_command(cmd: str, root: Path = ROOT) -> Tuple[float, int]:
    """(wall seconds, exit status) of ``cmd`` run in a fresh temporary folder with the clone's programs."""
    argv = shlex.split(cmd)
    argv[0] = str(root / argv[0])
    with tempfile.TemporaryDirectory(prefix="rbp_time_") as tmp:
        t = time.perf_counter()
        p = subprocess.run(argv, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return time.perf_counter() - t, p.returncode


def fmt_wall(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def render(timings: Dict[str, Tuple[float, int]], machine: str, note: str = "") -> str:
    """The block's body: one row per command timed, then the machine and date line (``note``: what the machine line
    cannot say, e.g. that other jobs shared its cores)."""
    lines = ["| command | wall time | exit |", "|---|---|---|"]
    for name, cmd in COMMANDS:
        if name in timings:
            s, rc = timings[name]
            lines.append(f"| `{cmd}` | {fmt_wall(s)} | {rc} |")
    lines += ["", f"Measured once each by `python scripts/time_readme.py --render` on {machine}"
                  + (f" ({note})" if note else "") + "."]
    return "\n".join(lines)


ROW = re.compile(r"^\| `(?P<cmd>[^`]+)` \| (?P<wall>[^|]+) \| (?P<rc>-?\d+) \|$")
DATED = re.compile(r"^Measured once each by `python scripts/time_readme\.py --render` on .+\d{4}-\d\d-\d\d \d\d:\d\d UTC")


def block_problems(text: str, block: str = BLOCK) -> List[str]:
    """Why README's block is out of step with the commands it times (empty: in step): each command of ``COMMANDS``
    measured once, as README spells it, exit 0, and the machine line dated. A changed command leaves its old row
    behind, so the block must be rendered again (``--render``) on some machine."""
    start = re.search(rf"<!-- numbers:{re.escape(block)} [^\n]*-->\n", text)
    end = text.find(f"<!-- /numbers:{block} -->")
    if start is None or end < start.end():
        return [f"no block {block!r}"]
    body = text[start.end():end].strip().splitlines()
    rows = {m["cmd"]: m["rc"] for m in (ROW.match(ln) for ln in body) if m}
    want = [cmd for _, cmd in COMMANDS]
    problems = [f"not measured: {cmd}" for cmd in want if cmd not in rows]
    problems += [f"measured, but no longer a README command here: {cmd}" for cmd in rows if cmd not in want]
    problems += [f"exit {rc}: {cmd}" for cmd, rc in rows.items() if rc != "0"]
    if not any(DATED.match(ln) for ln in body):
        problems.append("no dated machine line")
    return problems


def replace_block(text: str, body: str, block: str = BLOCK) -> str:
    """``text`` with the block ``block`` (its marker lines kept) holding ``body``; a missing block is an error."""
    start = re.search(rf"<!-- numbers:{re.escape(block)} [^\n]*-->\n", text)
    end = text.find(f"<!-- /numbers:{block} -->")
    if start is None or end < start.end():
        raise SystemExit(f"error: {README} has no block {block!r} (<!-- numbers:{block} ... --> ... "
                         f"<!-- /numbers:{block} -->); add the two marker lines where the table goes")
    return text[:start.end()] + body + "\n" + text[end:]


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help=f"time only this command (repeatable): {', '.join(n for n, _ in COMMANDS)}")
    p.add_argument("--render", action="store_true", help="write the table into README.md's block " + BLOCK)
    p.add_argument("--note", default="", help="said after the machine line, e.g. 'its 2 cores shared with other jobs'")
    args = p.parse_args(argv)
    names = [n for n, _ in COMMANDS]
    unknown = [n for n in args.only if n not in names]
    if unknown:
        p.error(f"--only {unknown[0]!r}: not one of {', '.join(names)}")
    sys.path.insert(0, str(ROOT))
    from robustbench_pid.run.speed import machine

    timings: Dict[str, Tuple[float, int]] = {}
    for name, cmd in COMMANDS:
        if args.only and name not in args.only:
            continue
        print(f"{name}: {cmd} ...", file=sys.stderr, flush=True)
        timings[name] = run_command(cmd)
        print(f"{name}: {fmt_wall(timings[name][0])}, exit {timings[name][1]}", file=sys.stderr, flush=True)
    body = render(timings, machine(), args.note)
    print(body)
    if args.render:
        text = replace_block(README.read_text(), body)
        problems = block_problems(text)
        if problems:  # a partial or failed measurement is not written over the block
            print(f"error: {README} not written: {'; '.join(problems)}", file=sys.stderr)
            return 1
        README.write_text(text)
        print(f"wrote {README} (block {BLOCK})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One prepared GPU session (issue 48, item 3): every GPU figure the docs still lack, in one call, within a budget.

    python scripts/gpu_check.py --dry          # print the plan (steps, commands, time caps, files); write nothing
    python scripts/gpu_check.py                # run it; every log and figure under $OUT (default ./gpu_check_out)
    python scripts/gpu_check.py --only decode,e2e-fp32 --budget-s 300   # some steps, another budget

Steps, in priority order (a step starts only with at least ``MIN_STEP_S`` of the budget left and runs at most its
cap plus what earlier steps saved, never into the later steps' caps, so the whole script ends within
``--budget-s``, default 540):

  doctor          ``robustbench-pid doctor --device cuda --json``: environment, CUDA vs CPU verdicts, bf16 and compile
                  agreement, PID / softmax per precision, decode images/s (PIL workers and --decode gpu)
  cuda-tests      the tests that need CUDA and the device-agreement tests (tests/test_devices.py, the CUDA cases of
                  test_cost / test_symvit / test_sharding, test_compile, test_attacks_half_precision); junit XML
  decode-tests    tests/test_gpu_decode.py: the tensor decoder against PIL on the CPU, and (on CUDA) nvjpeg's
  decode          scripts/bench_decode.py: decode images/s CPU vs GPU, the model's forward rate, pixel and verdict
                  agreement of the two decoders
  e2e-*           scripts/bench_e2e.py: ``evaluate`` against a plain loop per scenario and decoder, fp32, bf16 and
                  bf16 + compile (sizes below: what fits the budget, not the paper's 50,000 images)

Without CUDA it runs the steps that do not need it (decode-tests), says for each other step that it is skipped
and why, and exits 0. ``$OUT/status.json`` lists every step: command, cap, status (ok, failed, timed out, skipped
and why), seconds, log file and figure files. A failed step does not stop the others.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
BUDGET_S = 540  # one device call's share of a 15-minute session, start-up left out
MIN_STEP_S = 20  # a step with less time left than this is skipped (budget), not started and killed
E2E_N = 512  # images of the end-to-end tree: the fixed cost per command is paid once per row; this fits the budget
CUDA_TESTS = ["tests/test_devices.py",
              "tests/test_cost.py::test_one_attention_layer_counts_the_same_on_every_cuda_kernel",
              "tests/test_symvit.py::test_rpc_runs_on_gpu_and_matches_cpu",
              "tests/test_sharding.py::test_torchrun_ranks_each_take_their_own_gpu",
              "tests/test_compile.py", "tests/test_attacks_half_precision.py"]


@dataclass
class Step:
    name: str
    cap_s: int
    args: List[str]  # after the interpreter
    needs_cuda: bool = True
    files: List[str] = field(default_factory=list)  # figure files it writes under $OUT
    what: str = ""


def steps(out: Path, workers: int, tree: Path) -> List[Step]:
    """The session's steps, highest priority first (the caps add up to the default budget)."""
    py_test = ["-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider", "--durations=15"]

    def e2e(n: int) -> List[str]:  # a tree per size: bench_e2e reuses a tree that exists, whatever its size
        return ["scripts/bench_e2e.py", "--n", str(n), "--tree", f"{tree}_{n}", "--batch-size", "256",
                "--workers", str(workers)]
    return [
        Step("doctor", 170, ["-m", "robustbench_pid", "doctor", "--device", "cuda", "--json", str(out / "doctor.json")],
             files=["doctor.json"], what="doctor on cuda: the GPU rows of docs/performance.md"),
        Step("cuda-tests", 90, [*py_test, f"--junitxml={out / 'cuda_tests.xml'}", *CUDA_TESTS],
             files=["cuda_tests.xml"], what="tests that need CUDA + device-agreement tests"),
        Step("decode-tests", 25, [*py_test, f"--junitxml={out / 'decode_tests.xml'}", "tests/test_gpu_decode.py"],
             needs_cuda=False, files=["decode_tests.xml"], what="--decode gpu's tensor path against PIL (CPU and CUDA)"),
        Step("decode", 45, ["scripts/bench_decode.py", "--n", "2048", "--workers", str(workers), "--batch-size", "256",
                            "--json", str(out / "decode.json")],
             files=["decode.json"], what="decode images/s CPU vs GPU, forward rate, agreement"),
        Step("e2e-fp32", 75, [*e2e(E2E_N), "--scenarios", "clean,pgd", "--decode", "cpu,gpu", "--precision", "fp32",
                              "--json", str(out / "e2e_fp32.json")],
             files=["e2e_fp32.json"], what="evaluate / plain loop, fp32 eager, clean and PGD-20, CPU and GPU decode"),
        Step("e2e-bf16-compile", 80, [*e2e(E2E_N), "--scenarios", "pgd", "--decode", "cpu", "--precision", "bf16", "--compile",
                                      "--json", str(out / "e2e_bf16_compile.json")],
             files=["e2e_bf16_compile.json"], what="evaluate / plain loop, bf16 + compile, PGD-20 (vs e2e-fp32: >= 3x)"),
        Step("e2e-bf16", 25, [*e2e(E2E_N), "--scenarios", "clean,pgd", "--decode", "gpu", "--precision", "bf16",
                              "--json", str(out / "e2e_bf16.json")],
             files=["e2e_bf16.json"], what="evaluate / plain loop, bf16 eager, GPU decode"),
        Step("e2e-sweep", 30, [*e2e(256), "--scenarios", "sweep", "--decode", "cpu", "--precision",
                               "fp32", "--json", str(out / "e2e_sweep.json")],
             files=["e2e_sweep.json"], what="evaluate / plain loop, fp32, FGSM + PGD-20 at 1..6/255 on 256 images"),
    ]


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry", action="store_true", help="print the plan and write nothing")
    ap.add_argument("--only", help="comma-separated step names (default: all, in priority order)")
    ap.add_argument("--budget-s", type=int, default=BUDGET_S, help=f"seconds for all steps (default {BUDGET_S})")
    a = ap.parse_args(argv)
    a.out = Path(os.environ.get("OUT") or "gpu_check_out")
    if a.budget_s < MIN_STEP_S:
        fail(f"--budget-s must be >= {MIN_STEP_S}, got {a.budget_s}")
    return a


def fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def cuda_available() -> bool:
    """Asked in a child process: this script imports no torch (its own start stays quick, its memory free)."""
    proc = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                          capture_output=True, text=True, cwd=REPO)
    return proc.stdout.strip() == "True"


def select(all_steps: List[Step], only: Optional[str]) -> List[Step]:
    if not only:
        return all_steps
    names = [n.strip() for n in only.split(",") if n.strip()]
    known = {s.name for s in all_steps}
    bad = [n for n in names if n not in known]
    if bad or not names:
        fail(f"--only {only!r}: unknown step {', '.join(bad) or '(none given)'}; steps: {', '.join(sorted(known))}")
    return [s for s in all_steps if s.name in names]


def run_step(step: Step, out: Path, limit_s: float) -> Dict[str, object]:
    """Run one step with its log under ``out``; killed at ``limit_s`` (its log keeps what it printed)."""
    log = out / f"{step.name}.log"
    cmd = [sys.executable, *step.args]
    t = time.perf_counter()
    with open(log, "w") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, timeout=limit_s).returncode
            status = "ok" if rc == 0 else f"failed (exit {rc})"
        except subprocess.TimeoutExpired:
            status = f"timed out after {limit_s:.0f} s"
    return {"status": status, "seconds": round(time.perf_counter() - t, 1), "log": log.name,
            "files": [n for n in step.files if (out / n).is_file()]}


def main(argv: Optional[Sequence[str]] = None) -> int:
    a = parse_args(argv)
    tree = Path(tempfile.gettempdir()) / "gpu_check_tree"  # JPEGs stay outside $OUT (not brought back)
    workers = 0 if (os.cpu_count() or 1) <= 2 else min(14, (os.cpu_count() or 1) - 2)
    plan = select(steps(a.out, workers, tree), a.only)
    if a.dry:
        print(f"gpu_check plan: {len(plan)} steps, caps {sum(s.cap_s for s in plan)} s in all, budget {a.budget_s} s; "
              f"logs and figures under {a.out}/ (status.json lists every step)")
        for s in plan:
            print(f"  {s.name:17} cap {s.cap_s:>3} s  {'CUDA' if s.needs_cuda else 'any '}  {s.what}")
            print(f"      {' '.join(['python', *s.args])}")
            print(f"      writes {s.name}.log{''.join(', ' + f for f in s.files)}")
        print("nothing was run or written (--dry)")
        return 0
    cuda = cuda_available()
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    status: Dict[str, Dict[str, object]] = {}
    for k, s in enumerate(plan):
        left = a.budget_s - (time.perf_counter() - t0)
        # time an earlier step saved goes to this one; the later steps keep their caps
        limit = max(min(float(s.cap_s), left), left - sum(later.cap_s for later in plan[k + 1:]))
        entry: Dict[str, object] = {"command": " ".join(["python", *s.args]), "cap_s": s.cap_s, "what": s.what}
        if s.needs_cuda and not cuda:
            entry.update(status="skipped", why="needs a CUDA device (torch.cuda.is_available() is False here)")
        elif left < MIN_STEP_S:
            entry.update(status="skipped", why=f"budget: {left:.0f} s left of {a.budget_s} s")
        else:
            entry.update(run_step(s, a.out, limit))
        status[s.name] = entry
        why = f": {entry['why']}" if "why" in entry else f" in {entry['seconds']} s (log {entry['log']})"
        print(f"{s.name:17} {str(entry['status']).upper() if entry['status'] == 'skipped' else entry['status']}{why}",
              flush=True)
        (a.out / "status.json").write_text(json.dumps({"cuda": cuda, "budget_s": a.budget_s, "steps": status},
                                                      indent=1))
    ran = [n for n, e in status.items() if e["status"] != "skipped"]
    print(f"gpu_check: {len(ran)} of {len(plan)} steps ran in {time.perf_counter() - t0:.0f} s; "
          f"{'no CUDA device here: the GPU steps were skipped; ' if not cuda else ''}see {a.out / 'status.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

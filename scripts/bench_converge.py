"""Converged robust accuracy (``--converge``) against AutoAttack standard and a stronger reference
ensemble, on the embedded digits models, measured side by side (the same cells, the same device).

Per model and eps it runs (each a resumable run folder under ``--out``):
- ``MODEL-converge``: ``evaluate --attack pgd --steps 20 --converge`` (the ladder, rung 0 = PGD-20);
- ``MODEL-autoattack``: ``evaluate --attack autoattack`` (standard version, pyautoattack);
- the reference ensemble: AutoAttack's per-sample result, then on the samples AutoAttack left robust
  APGD-CE with 5 restarts of 250 iterations and Square with 10,000 queries (``MODEL-reference.csv``).
It prints, per model and eps, the converged value and its status, AutoAttack, the reference, PGD-20,
forward/backward passes per sample of the ladder and of AutoAttack, and the ladder/AutoAttack
wall-time ratio (compute seconds of their work units, this machine, this run), and writes them to
``MODEL-bench.csv``. ``--render`` then writes the generated block of docs/attacks.md from the files in
``--out`` (no evaluation): the table above, PID DeiT minus softmax DeiT under PGD-20 and converged
with McNemar's exact test on the shared samples, and each indicator's precision and recall for "a
later rung of the ladder broke this sample".

    python scripts/bench_converge.py --models deit pid_deit --eps 4/255 --limit 48   # measure
    python scripts/bench_converge.py --models deit --eps 1/255 --chunk-size 120       # resumable in pieces
    python scripts/bench_converge.py --models deit_at --eps 8/255 --phases autoattack reference  # the slow part
    python scripts/bench_converge.py --models cnn_at --eps 48/255 --draw 1 --phases ladder  # another draw
    python scripts/bench_converge.py --render                                         # the docs blocks
    python scripts/bench_converge.py --check                                          # exit 1 if the block is stale
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import List, Optional

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

import converge_doc as doc  # noqa: E402  (the docs block: result side, no torch)
import converge_draws as draws  # noqa: E402  (the draws block: result side, no torch)
from converge_doc import OUT, cell_dir  # noqa: E402
REFERENCE = {"apgd_strong": {"steps": 250, "restarts": 5, "loss": "ce"}, "square": {"n_queries": 10000}}


def _unit_seconds(run: Path, benchmark: str, attack: str, eps: float) -> float:
    """Compute seconds of the run's work units of ``attack``; once the units are gone (they are not committed),
    the whole run's ``compute_seconds`` from run.json (its short clean pass included). Only the units its plan
    lists: a folder resumed into a larger run may also hold the units of the smaller one's layout."""
    total, found = 0.0, False
    plan = run / "plan.json"
    planned = {u["key"] for u in json.loads(plan.read_text())["units"]} if plan.is_file() else None
    for p in (run / "units").glob("*.json"):
        if planned is not None and p.stem not in planned:
            continue
        u = json.loads(p.read_text())
        if u.get("benchmark") == benchmark and u.get("attack") == attack and abs(float(u["eps"]) - eps) < 1e-9:
            total, found = total + float(u.get("seconds", 0.0)), True
    if not found:
        return float(json.loads((run / "run.json").read_text()).get("compute_seconds") or 0.0)
    return total


def reference(model_name: str, aa: pd.DataFrame, eps: float, limit: int, device: str = "cpu",
              block: int = 0, parts: Path = None) -> Optional[pd.DataFrame]:
    """AutoAttack's verdicts, then the reference's extra attacks on the samples it left robust, on ``device``
    (the generator stays on the CPU, as in a run: the draws do not depend on the device).

    ``block`` > 0 attacks those samples in blocks of that many (block b seeded with b), each written to
    ``parts`` when done, so a killed reference resumes at its first unfinished block; 0 attacks them all
    at once, seeded with 0 (the cells made before blocks existed). Blocks are claimed as a run's units are,
    so several processes share one reference: each attacks the blocks nobody holds, and ``None`` comes back
    to a process that finds blocks still held by another live one (the last to finish assembles the result)."""
    import torch

    import robustbench_pid as rbp
    from robustbench_pid.run.claims import Claims

    model = rbp.load_model(model_name).to(device)
    ds = rbp.load_dataset("digits", split="test")
    ids = [str(s) for s in ds.sample_ids[:limit]]
    robust = aa.set_index(aa["sample_id"].astype(str))["correct_top1"].astype(bool).reindex(ids).fillna(False)
    idx = [i for i, s in enumerate(ids) if robust[s]]
    out = pd.DataFrame({"sample_id": ids, "eps": eps, "aa_correct": robust.values, "reference_correct": robust.values,
                        "extra_forward": 0.0, "extra_backward": 0.0})
    blocks = [idx[k:k + block] for k in range(0, len(idx), block)] if block > 0 else [idx]
    if parts is None:
        t0 = time.time()
        for b, members in enumerate(blocks):
            _attack_block(model, ds, out, members, eps, device, torch.Generator().manual_seed(b))
        out.attrs["seconds"] = time.time() - t0
        return out
    parts.mkdir(parents=True, exist_ok=True)
    names = [f"block-{b}-of-{len(blocks)}" for b in range(len(blocks))]
    with Claims(parts) as claims:
        for b, members in enumerate(blocks):
            part = parts / f"{names[b]}.csv"
            if part.is_file() or not claims.try_claim(names[b]):
                continue
            try:
                if not part.is_file():  # another process may have finished it since the check above
                    t0 = time.time()
                    _attack_block(model, ds, out, members, eps, device, torch.Generator().manual_seed(b))
                    done = out.loc[members, ["sample_id", "reference_correct", "extra_forward", "extra_backward"]]
                    done.assign(seconds=time.time() - t0).to_csv(part.with_suffix(".tmp"), index=False)
                    part.with_suffix(".tmp").replace(part)
            finally:
                claims.release(names[b])
    missing = [n for n in names if not (parts / f"{n}.csv").is_file()]
    if missing:
        print(f"reference: {', '.join(missing)} held by another process; the one that finishes last writes the cell")
        return None
    seconds = 0.0
    for b, members in enumerate(blocks):
        part = parts / f"{names[b]}.csv"
        done = pd.read_csv(part, dtype={"sample_id": str})
        if done["sample_id"].tolist() != [ids[i] for i in members]:
            raise SystemExit(f"{part} holds other samples than its block: delete {parts} and re-run")
        for col in ("reference_correct", "extra_forward", "extra_backward"):
            out.loc[members, col] = done[col].to_numpy(dtype=out[col].dtype)
        seconds += float(done["seconds"].iloc[0])
    out.attrs["seconds"] = seconds
    return out


def _attack_block(model, ds, out: pd.DataFrame, members: List[int], eps: float, device: str, gen) -> None:
    """The reference's extra attacks, in order, each on the block's samples still robust."""
    import torch

    from robustbench_pid.attacks import make_attack

    for name, params in REFERENCE.items():
        left = [i for i in members if out.loc[i, "reference_correct"]]
        if not left:
            continue
        x = torch.stack([ds[i][0] for i in left]).to(device)
        y = torch.tensor([int(ds[i][1]) for i in left]).to(device)
        attack = make_attack(name, eps=eps, **params)
        x_adv = attack(model, x, y, bounds=(0.0, 1.0), generator=gen)
        with torch.no_grad():
            ok = (model(x_adv).argmax(1) == y).tolist()
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()
        tel = attack.telemetry
        for j, i in enumerate(left):
            out.loc[i, "reference_correct"] = bool(ok[j])
            out.loc[i, "extra_forward"] += float(tel.forward[j]) + 1
            out.loc[i, "extra_backward"] += float(tel.backward[j])


def _device_label(device) -> str:
    from robustbench_pid.run.provenance import device_name

    return device_name(device) if device.type == "cuda" else f"CPU ({os.cpu_count()} cores)"


def _run_device(run_dir: Path) -> str:
    """The device a finished run was made on: the GPU's name, or "CPU"."""
    info = json.loads((run_dir / "run.json").read_text())
    return (info.get("device_name") or "cuda") if str(info.get("device", "cpu")).startswith("cuda") else "CPU"


PHASES = ("ladder", "autoattack", "reference")


def measure(model: str, e: str, limit: int, out: Path, device: str = "cpu",
            chunk_size: int = 0, phases=PHASES, draw: int = 0) -> Optional[pd.DataFrame]:
    """One cell: the ladder, then AutoAttack, then the reference, each timed per work unit on this device.
    ``chunk_size`` (0: the run's default, 512) cuts a new run into work units of that many samples, and the
    reference into blocks of that many, so a run killed part-way keeps what it finished (a finished run or
    reference is reused whatever its chunking). Several processes may run one cell: they share its units and
    blocks, and ``None`` comes back to each one but the last, which writes the cell's bench row. ``phases``
    limits what runs (AutoAttack and the reference on a robust model are the hours; the ladder is minutes): the
    bench row is written once all three exist. ``draw`` k >= 1 runs the ladder with seed k into its own run folder
    and bench row (``converge_draws``), against the same AutoAttack and reference."""
    import torch

    import robustbench_pid as rbp
    from robustbench_pid.core.labels import parse_eps
    from robustbench_pid.results.files.verify import is_complete
    from robustbench_pid.results.summaries.converge import condition_status
    from robustbench_pid.runtime.device import pick_device

    device, eps, cell = str(pick_device(device)), parse_eps(e), cell_dir(out, model, e)
    conv_dir, aa_dir = cell / draws.run_name(draw), cell / "autoattack"
    for phase, run_dir, kw in (("ladder", conv_dir, dict(attack="pgd", steps=20, converge=True, seed=draw)),
                               ("autoattack", aa_dir, dict(attack="autoattack"))):
        if phase in phases and not is_complete(run_dir):  # a finished run is reused, from whichever device made it
            t = time.time()
            sizes = {"chunk_size": chunk_size} if chunk_size else {}
            rbp.evaluate(model=model, eps=[e], limit=limit, out=run_dir, device=device, **sizes, **kw)
            print(f"{model} {e}: {run_dir.name} run, wall {time.time() - t:.0f} s")
    cached = cell / "reference.csv"
    ref = pd.read_csv(cached) if cached.is_file() else pd.DataFrame()
    if "reference" in phases and len(ref) != limit and is_complete(aa_dir):
        # the reference is AutoAttack + extra attacks with fixed seeds: reused, not re-run
        aa = rbp.load_records(aa_dir)
        a = aa[aa["attack"] == "autoattack"]
        ref = reference(model, a, eps, limit, device, block=chunk_size, parts=cell / "reference-parts")
        if ref is None:  # blocks held by another process, which writes the cell when it is done
            return None
        ref["seconds"], ref["block"] = ref.attrs["seconds"], chunk_size
        _write_csv(ref.sort_values("sample_id", kind="stable"), cached)  # the blocks stay: their seconds are evidence
    done = dict(zip(PHASES, (is_complete(conv_dir), is_complete(aa_dir), len(ref) == limit)))
    if "reference" not in phases and not done["reference"]:  # a row without the reference says "not run" there
        done["reference"] = True
        ref = pd.DataFrame({"reference_correct": [float("nan")] * limit, "extra_forward": float("nan"),
                            "extra_backward": float("nan"), "seconds": float("nan")})
    if not all(done.values()):
        print(f"{model} {e}: {', '.join(k for k, v in done.items() if not v)} still to run; no bench row yet")
        return None
    conv, aa = rbp.load_records(conv_dir), rbp.load_records(aa_dir)
    c = conv[conv["benchmark"] == "converge"]
    p = conv[conv["attack"] == "pgd"]
    a = aa[aa["attack"] == "autoattack"]
    s_conv = _unit_seconds(conv_dir, "converge", "converge", eps)
    s_aa = _unit_seconds(aa_dir, "adversarial", "autoattack", eps)
    made_on = {d: _run_device(d) for d in (conv_dir, aa_dir)}
    here = _device_label(torch.device(device))
    if len({*made_on.values(), here.split(" (")[0]}) == 1:
        where, ratio = here, (s_conv / s_aa if s_aa else float("nan"))
    else:  # a ladder reused from another machine: its seconds are not comparable with AutoAttack's here
        aa_here = made_on[aa_dir] == here.split(" (")[0]
        where = (f"ladder on {made_on[conv_dir]}, " + (f"AutoAttack and reference on {here}" if aa_here else
                                                      f"AutoAttack on {made_on[aa_dir]}, reference on {here}"))
        ratio = float("nan")
    row = pd.DataFrame([{
        "model": model, "eps": e, "n": len(c), "device": where,
        "pgd20": 100 * p["correct_top1"].mean(), "converged": 100 * c["correct_top1"].astype(bool).mean(),
        "status": condition_status(c), "autoattack": 100 * a["correct_top1"].mean(),
        "reference": 100 * ref["reference_correct"].mean(),
        "ladder_fwd": c["passes_forward"].mean(), "ladder_bwd": c["passes_backward"].mean(),
        "aa_fwd": a["passes_forward"].fillna(0).mean(), "aa_bwd": a["passes_backward"].fillna(0).mean(),
        "ref_extra_fwd": ref["extra_forward"].mean(), "ref_extra_bwd": ref["extra_backward"].mean(),
        "ladder_seconds": s_conv, "aa_seconds": s_aa, "ref_extra_seconds": float(ref["seconds"].iloc[0]),
        "wall_ratio": ratio,
        "ladder_chunk": int(json.loads((conv_dir / "run.json").read_text()).get("chunk_size", 512)),
        "aa_chunk": int(json.loads((aa_dir / "run.json").read_text()).get("chunk_size", 512)),
        "ref_block": int(ref["block"].iloc[0]) if "block" in ref.columns else 0,
        "rungs": ";".join(dict.fromkeys(c["converge_rungs"].astype(str)))}])
    _write_csv(row, cell / draws.bench_name(draw))
    return row


def _write_csv(df: pd.DataFrame, path: Path) -> None:
    """Whole or not at all, so two processes finishing one cell together cannot leave a torn file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    df.to_csv(tmp, index=False)
    tmp.replace(path)


def main(argv: List[str] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["deit", "pid_deit"])
    p.add_argument("--eps", default="4/255", help="comma-separated, e.g. 1/255,2/255,...,6/255")
    p.add_argument("--limit", type=int, default=360)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--device", default="auto", help="auto (a GPU when there is one), cpu, cuda, cuda:N")
    p.add_argument("--chunk-size", type=int, default=0,
                   help="samples per work unit of a run not yet made (0: the default, 512); smaller units "
                        "survive a killed run on a slow machine")
    p.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES),
                   help="what to run of each cell (default: all three); the bench row is written once all exist")
    p.add_argument("--draw", type=int, default=0,
                   help="the ladder's random draw: k >= 1 runs it with --seed k into its own run folder and bench row "
                        "(the draws block); 0, the grid of the converge block")
    p.add_argument("--render", action="store_true", help="write the docs block from --out (no evaluation)")
    p.add_argument("--check", action="store_true", help="exit 1 if the docs block is not --render's output")
    args = p.parse_args(argv)
    if args.draw < 0:
        p.error(f"--draw must be a whole number >= 0 (a seed), got {args.draw}")
    if args.check:
        ok, ok_draws = doc.check_doc(args.out), draws.check(args.out)
        print("docs/attacks.md converge block: " + ("up to date" if ok else "stale (run --render)"))
        print("docs/attacks.md converge-draws block: " + ("up to date" if ok_draws else "stale (run --render)"))
        return 0 if ok and ok_draws else 1
    args.out.mkdir(parents=True, exist_ok=True)
    if args.render:
        block = doc.render(args.out)
        doc.write_doc(block)
        print(block)
        print(draws.write(args.out))
        return 0
    import torch

    torch.set_num_threads(1)
    for m in args.models:
        for e in (e.strip() for e in args.eps.split(",") if e.strip()):
            df = measure(m, e, args.limit, args.out, args.device, args.chunk_size, tuple(args.phases), args.draw)
            if df is not None:
                print(df.drop(columns=["rungs"]).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

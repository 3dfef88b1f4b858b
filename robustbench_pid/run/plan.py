"""A run's plan: its work units, their content-hash keys, and how they are written to plan.json.

A unit's key hashes everything that determines its records (what it computes, on which samples,
with which model, data and settings), so a finished unit can be reused by any later run whose
plan holds the same key, and two runs with different settings can never share a unit.
No torch here: ``merge`` reads plans in processes that never load a model.
"""
from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any, Dict, List, Sequence

from ..results.files.units import content_hash
from ..specs import Unit

PLAN_VERSION = 1


def unit_key(ctx: Any, u: Unit) -> str:
    m = ctx.model.info
    return content_hash({
        "v": 1, "benchmark": u.benchmark, "attack": u.attack, "eps": u.eps, "params": u.params,
        "condition": u.condition, "samples": ctx.dataset.sample_ids[ctx.indices[u.start]] if u.stop > u.start else None,
        "start": u.start, "stop": u.stop, "n_total": len(ctx.indices),
        "arch": m["arch"], "arch_kwargs": m["arch_kwargs"], "checkpoint_sha256": m.get("checkpoint_sha256"),
        "dataset": ctx.spec.dataset, "split": ctx.spec.split, "protocol": ctx.spec.protocol,
        "seed": ctx.spec.seed, "batch_size": ctx.batch_size, "precision": ctx.spec.precision,
        "bench_opts": ctx.spec.benchmark_options,
        **({"analyze": sorted(ctx.spec.analyze)} if ctx.spec.analyze else {}),  # units then write more files
        **({"save_adv": True} if getattr(ctx.spec, "save_adv", False) else {}),  # so do these (their images)
        # another decoder gives other pixels: another measurement (cpu, the default, keeps the keys it had)
        **({"decode": ctx.spec.decode} if getattr(ctx.spec, "decode", "cpu") != "cpu" else {}),
        **({"evidence": [ctx.spec.indicators, ctx.spec.trace, ctx.spec.agreement]}
           if ctx.spec.indicators or ctx.spec.trace or ctx.spec.agreement else {}),
        # data objects (rbp.evaluate(data=...)) are known by their content, not by a name
        **({"data_sha256": ctx.dataset.content_sha256} if getattr(ctx.dataset, "content_sha256", None) else {}),
    })


def plan_units(ctx: Any) -> List[Unit]:
    """The benchmark's units with their keys (a benchmark planning one unit twice is a bug)."""
    from ..benchmarks import get_benchmark  # the benchmarks package imports torch; merge never plans

    if getattr(ctx.spec, "analyze", None):
        from ..probes.units import check_model

        check_model(ctx)  # before anything is written: a model the probe cannot read is refused here
    units = get_benchmark(ctx.spec.benchmark).plan(ctx)
    if not units:  # nothing to compute: a run folder would be left "running" forever
        from ..errors import UserError

        raise UserError(f"benchmark {ctx.spec.benchmark!r} plans no work for these settings (no samples or no "
                        f"conditions); check --benchmark, --attack and the dataset")
    units = [replace(u, key=unit_key(ctx, u)) for u in units]
    seen: Dict[str, Unit] = {}
    twice: List[str] = []
    for u in units:
        if u.key in seen:  # the same condition listed twice (--eps 4/255,4/255, a suite repeating an eps)
            label = condition_label(u)
            if label not in twice:
                twice.append(label)
            continue
        seen[u.key] = u
    if twice:
        print(f"note: {', '.join(twice)}: listed more than once with the same settings; evaluated once",
              file=sys.stderr)
    return list(seen.values())


def condition_label(u: Unit) -> str:
    """``pgd eps 4/255`` (eps in k/255 when it is one) for messages about a condition."""
    from ..core.labels import eps_text

    return f"{u.attack}" + (f" eps {eps_text(u.eps, 'linf')}" if u.eps else "") + (f" {u.condition}" if u.condition else "")


def plan_hash(units: Sequence[Unit]) -> str:
    return content_hash([u.key for u in units])


def shard_units(units: Sequence[Unit], i: int, n: int) -> List[Unit]:
    """Every n-th unit: each shard gets a mix of clean (cheap) and attack (costly) units."""
    return [u for j, u in enumerate(units) if j % n == i]

"""Pin RobustBench's published numbers per model-zoo entry: ``robustbench_pid/core/_data/robustbench_entries.json``.

The PyPI wheel ships no ``model_info`` files, so the leaderboard's clean and AutoAttack accuracy of an entry (shown
beside a ``robustbench:NAME`` run's own numbers) come from RobustBench's repository: this script reads every
``model_info/<dataset>/<threat>/<NAME>.json`` of a clone at the commit the other RobustBench facts were read at
(``core/_data/robustbench.json``, ``source.commit``; a clone at another commit is refused), and writes, per entry,
the fields a comparison needs as the files give them (strings of percent, as RobustBench writes them).

    git clone https://github.com/RobustBench/robustbench && git -C robustbench checkout <commit>
    python scripts/robustbench_entries.py --repo robustbench           # write the pinned table
    python scripts/robustbench_entries.py --repo robustbench --check   # exit 1 if the pinned table differs
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "robustbench_pid" / "core" / "_data" / "robustbench_entries.json"
FACTS = ROOT / "robustbench_pid" / "core" / "_data" / "robustbench.json"
KEEP = ("clean_acc", "autoattack_acc", "external", "eps", "unreliable", "corruptions_acc")


def build(repo: Path) -> dict:
    source = json.loads(FACTS.read_text())["source"]
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        raise SystemExit(f"error: {repo} is not a git clone of RobustBench ({head.stderr.strip()})")
    if head.stdout.strip() != source["commit"]:
        raise SystemExit(f"error: {repo} is at {head.stdout.strip()[:12]}, not the commit the pinned facts were read "
                         f"at ({source['commit'][:12]}): git -C {repo} checkout {source['commit']}")
    files = sorted((repo / "model_info").glob("*/*/*.json"))
    if not files:
        raise SystemExit(f"error: no model_info/<dataset>/<threat>/<NAME>.json under {repo}")
    entries = {}
    for f in files:
        info = json.loads(f.read_text())
        dataset, threat, name = f.parts[-3], f.parts[-2], f.stem
        entries[f"{dataset}/{threat}/{name}"] = {k: info[k] for k in KEEP if k in info}
    return {"source": {"repository": source["repository"], "commit": source["commit"],
                       "files": f"model_info/*/*/*.json ({len(files)} files)",
                       "generated_by": "scripts/robustbench_entries.py"},
            "entries": entries}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repo", type=Path, required=True, help="a clone of RobustBench's repository at the pinned commit")
    p.add_argument("--check", action="store_true", help="exit 1 if the pinned table is not what the clone gives")
    a = p.parse_args(argv)
    text = json.dumps(build(a.repo), indent=1, sort_keys=True) + "\n"
    if a.check:
        same = OUT.is_file() and OUT.read_text() == text
        print(f"{OUT.relative_to(ROOT)}: {'up to date' if same else 'differs from the clone (run without --check)'}")
        return 0 if same else 1
    OUT.write_text(text)
    n = len(json.loads(text)["entries"])
    print(f"wrote {OUT.relative_to(ROOT)}: {n} entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())

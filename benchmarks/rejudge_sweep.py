"""Re-judge a sweep's release documents with this checkout's judge and registry, and list every control departure.

    python benchmarks/rejudge_sweep.py                                         # runs/sweep/, runs/sweep-<exp>.json
    python benchmarks/rejudge_sweep.py --sweep /work/main/runs/sweep --tables /work/main/runs

For each release document the sweep kept (``<sweep>/release-<version>/<experiment>.json``) and each
experiment: the classification this checkout's judge gives beside the one in the sweep table, and every
control key (a key base and head agree on, in any scenario) on which the release observes what neither side
observes, before any rule, with the ``not_deciding`` rule of experiments.toml that sets it aside there, or NOT SET
ASIDE. That is how the control rules are derived, and re-derived after a probe changes its keys: a departure
on a pristine release that no rule sets aside would make a backport of the fix into that release read
"deviates".

The base and head results are those the table was judged against (its ``parameters.references``), read from
``--references`` (default results/) and checked against the SHA-256 the table records; their receipts are
not checked for staleness, so this runs while the harness changes.

Exit 0 when every classification is unchanged and every control departure is set aside; 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pdevidence import registry  # noqa: E402
from pdevidence.core.files import sha256_file  # noqa: E402
from pdevidence.documents import results  # noqa: E402
from pdevidence.documents.observations import shown  # noqa: E402
from pdevidence.documents.tables import SweepTable  # noqa: E402
from pdevidence.documents.vocabulary import Classification  # noqa: E402
from pdevidence.judge import classify  # noqa: E402
from pdevidence.judge.compare import expected_file  # noqa: E402


def references(exp: registry.Experiment, table: SweepTable, directory: Path) -> tuple[dict, dict]:
    """The base and head results the table was judged against, checked by the SHA-256 it records."""
    docs = []
    for side in registry.SIDES:
        name = expected_file(exp, side, "release")
        path = directory / name
        recorded = (table.parameters.references if table.parameters else {}).get(name)
        if recorded is None or not path.exists() or sha256_file(path) != recorded:
            sys.exit(f"{path}: not the {side} result the sweep table of {exp.name} was judged against "
                     f"(it records {recorded}); pass --references with the directory holding it")
        docs.append(results.load(path, experiment=exp.name, side=side))
    return docs[0], docs[1]


def covering(rules: list[registry.NotDeciding], sid: str, key: str) -> str | None:
    """The first rule holding on the release that sets ``sid.key`` aside."""
    return next((r.id for r in rules if sid in r.keys and (r.keys[sid] is None or key in r.keys[sid])), None)


def rejudge(exp: registry.Experiment, table: SweepTable, sweep: Path, base: dict, head: dict) -> int:
    """Print each release's classification now and then, and its control departures; the number of problems."""
    problems = 0
    for entry in table.releases:
        path = sweep / f"release-{entry.version}" / f"{exp.name}.json"
        if not path.exists():
            print(f"{exp.name:<10} {entry.version:<8} {entry.classification.value}: no release document (not probed)")
            continue
        doc = results.load(path, experiment=exp.name)
        now = classify.classify(doc, base, head, exp).classification
        changed = now is not entry.classification
        problems += changed
        said = f"{entry.classification.value} -> {now.value}  CHANGED" if changed else now.value
        rules = classify.not_deciding(doc, exp)
        # A tree without the vulnerable path has no controls to depart on: the judge reads no behaviour there.
        found = {} if now is Classification.NOT_AFFECTED else \
            classify.departures(doc, base, head, classify.control_scenarios(base, head, exp))
        lines = []
        for sid, keys in found.items():
            by_rule: dict[str | None, list[str]] = {}
            for key, values in keys.items():
                by_rule.setdefault(covering(rules, sid, key), []).append(f"{key} {shown(values.tree)}")
            for rule, shown_keys in by_rule.items():
                problems += rule is None
                lines.append(f"{sid}: {', '.join(shown_keys)}: {f'set aside by {rule}' if rule else 'NOT SET ASIDE'}")
        print(f"{exp.name:<10} {entry.version:<8} {said}" + "".join(f"\n{'':<20}{line}" for line in lines))
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the project whose registry judges (default: this one)")
    parser.add_argument("--sweep", type=Path, help="the sweep's release documents (release-<version>/<experiment>.json; "
                        "default <root>/runs/sweep)")
    parser.add_argument("--tables", type=Path, help="the sweep tables (sweep-<experiment>.json; default <root>/runs)")
    parser.add_argument("--references", type=Path,
                        help="the base and head results the tables were judged against (default <root>/results)")
    parser.add_argument("--experiment", action="append", help="only this experiment (repeatable)")
    args = parser.parse_args()
    reg = registry.load(args.root)
    problems = 0
    for name in args.experiment or list(reg.experiments):
        exp = reg.experiment(name)
        table = SweepTable.load((args.tables or args.root / "runs") / f"sweep-{name}.json")
        refs = references(exp, table, args.references or args.root / "results")
        problems += rejudge(exp, table, args.sweep or args.root / "runs" / "sweep", *refs)
    print(f"{problems} problem(s): classifications changed or control departures no rule sets aside"
          if problems else "every classification unchanged; every control departure set aside by a rule")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

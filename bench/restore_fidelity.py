"""Restore fidelity over many generated namespaces: the property test of issue 42 at scale.

Each example is a namespace drawn by hypothesis (budgethub_session.fidelity.programs:
builtins, containers with shared references and cycles, numpy arrays and views,
pandas objects, cell-defined dataclasses, Enum, ``__slots__`` and property classes,
closures, partials, open files, and things that cannot be kept: a generator, a lock,
a pipe). It is defined in a real kernel of one Jupyter Server with the budgethub
extensions, checkpointed by the agent, restored into a fresh kernel of a second
server, and compared there (values, types, identity relations, memory sharing).
An example is mismatched when a variable differs, a relation is lost or new, or a
variable that is not kept is not named in the report and the restore note.

Run: ``python -m bench.restore_fidelity [--examples N]`` (on this venv: the session
package from images/session is installed in it).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

FIGURES = (
    "restore_fidelity.mismatched_examples",
    "restore_fidelity.examples",
    "restore_fidelity.restore_median_s",
)
EXAMPLES = 40


def run(examples: int) -> dict[str, Any]:
    from budgethub_session.fidelity import Outcome, Program, check, programs
    from budgethub_session.localserver import LocalServer
    from hypothesis import HealthCheck, Phase, given, settings

    outcomes: list[tuple[Program, Outcome]] = []
    base = Path(tempfile.mkdtemp(prefix="bench-fidelity-"))
    with LocalServer(base / "root", home=base / "home-a") as first:
        with LocalServer(
            base / "root", home=base / "home-b", restore_dir=first.state_dir
        ) as second:

            @settings(
                max_examples=examples,
                deadline=None,
                database=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(program=programs())
            def one(program: Program) -> None:
                path = f"bench/ex{len(outcomes)}.ipynb"
                outcomes.append((program, check(first, second, program, path)))

            one()
    return summarize(outcomes)


def summarize(outcomes: list[tuple[Any, Any]]) -> dict[str, Any]:
    variables = sum(len(o.names) for _, o in outcomes)
    not_kept = [why for _, o in outcomes for why in o.not_kept.values()]
    kinds: dict[str, int] = {}
    for why in not_kept:
        kind = why.split(":", 1)[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    bad = [(p, o) for p, o in outcomes if o.mismatches]
    for program, outcome in bad:
        print("--- mismatched example:\n" + program.source()[-2500:])
        for line in outcome.mismatches:
            print("   ", line[:600])
    seconds = [o.seconds for _, o in outcomes]
    print(
        f"restore_fidelity: {len(outcomes)} examples, {variables} variables; "
        f"{len(bad)} mismatched; {len(not_kept)} named as not kept "
        f"({', '.join(f'{k} {n}' for k, n in sorted(kinds.items())) or 'none'}); "
        f"{sum(len(o.reopened) for _, o in outcomes)} open files reopened; "
        f"checkpoint -> restored first cell median {statistics.median(seconds):.2f} s"
    )
    return {
        "restore_fidelity.mismatched_examples": float(len(bad)),
        "restore_fidelity.examples": float(len(outcomes)),
        "restore_fidelity.restore_median_s": round(statistics.median(seconds), 3),
    }


def collect(argv: list[str]) -> dict[str, float]:
    parser = argparse.ArgumentParser(prog="python -m bench.restore_fidelity")
    parser.add_argument("--examples", type=int, default=EXAMPLES)
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    figures = run(args.examples)
    print(f"restore_fidelity: {time.perf_counter() - t0:.0f} s in all")
    return figures


def main() -> None:
    import sys

    collect(sys.argv[1:])


if __name__ == "__main__":
    main()

"""`budgethub replay STORE_URL [--since WHEN] [--until WHEN] [--policy NAME] [--set K=V,...]
[--json PATH] [--plot PNG]`: a live store's history through the simulator (docs/replay.md).

Prints how well the simulator predicted the period, request by request, and the usual
outcome table for what really happened, its replay, and each what-if run (``--policy``,
``--set``; several values of a setting make a sweep). Bad input is one line naming the
flag, before the store is read where the flag allows it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from scheduler_core.errors import InputError
from scheduler_core.registry import POLICIES
from scheduler_core.research.commands.sweep import add_set_flag, grid, parse_axis
from scheduler_core.research.evaluation import Axis, fmt_wait, headline_table
from scheduler_core.research.replay import (
    CAUSES,
    compare,
    forecast_accuracy,
    outcome,
    outcome_row,
    plan,
    simulate,
    with_min_runtime,
)
from scheduler_core.research.replay_store import history_span, open_store, read_history
from scheduler_core.settings import DAY, Settings, parse_duration
from scheduler_core.store.admin import ADMIN_KEYS

MIN_RUNTIME = "min_runtime"
"""The what-if no setting holds: every request's protected minimum runtime (a request
keeps the one it was given at submit, so ``default_min_runtime`` would change none);
the scheduler still caps it by class (``debug_min_runtime``, ``max_min_runtime``)."""

_AGE = re.compile(r"^\s*\d+(\.\d+)?\s*(s|m|min|h|d|w)\s*$")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "replay",
        help="replay a live store's history in the simulator and compare",
        description=(
            "Turn a Hub store's history into a simulator scenario, run it, and compare "
            "request by request; --policy and --set try other settings on the same history."
        ),
    )
    parser.add_argument(
        "store", metavar="STORE_URL", help="sqlite:///FILE, a file, or a PostgreSQL URL"
    )
    parser.add_argument(
        "--since", metavar="WHEN", help="period start (default: --until less 7 days)"
    )
    parser.add_argument("--until", metavar="WHEN", help="period end (default: now)")
    parser.add_argument("--policy", help="also run the history under this policy")
    add_set_flag(
        parser, "also run under this setting (several values: a sweep; repeat for more settings)"
    )
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON")
    parser.add_argument("--plot", metavar="PATH.png", help="plot live against simulated waits")
    parser.set_defaults(func=run)


def parse_when(text: str, flag: str, now: float) -> float:
    """Epoch seconds from ISO 8601 (UTC unless it says), Unix seconds, ``now``, or an age
    (``7d``: that long before now)."""
    value = text.strip()
    if value == "now":
        return now
    if _AGE.match(value):
        return now - parse_duration(value)
    try:
        number = float(value)
    except ValueError:
        pass
    else:
        if math.isfinite(number):
            return number
    try:
        moment = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(
            flag,
            f"{text!r} is not a time (use 2026-12-01, 2026-12-01T08:00Z, Unix seconds, "
            "now, or an age such as 7d)",
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.timestamp()


def iso(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%MZ")


def period(args: argparse.Namespace, now: float) -> tuple[float, float, bool]:
    """(since, until, whether until was cut to now)."""
    until = now if args.until is None else parse_when(args.until, "--until", now)
    since = until - 7 * DAY if args.since is None else parse_when(args.since, "--since", now)
    if since >= now:
        raise InputError("--since", f"{iso(since)} is in the future (now is {iso(now)})")
    if since >= until:
        raise InputError("--since", f"{iso(since)} is not before --until {iso(until)}")
    cut = until > now
    return since, min(until, now), cut


def what_ifs(
    args: argparse.Namespace,
) -> tuple[list[Axis], list[tuple[str, dict[str, str], dict[str, Any]]]]:
    """The what-if runs the flags ask for: their axes and every combination."""
    if args.policy is not None and args.policy not in POLICIES:
        known = ", ".join(sorted(POLICIES))
        raise InputError("--policy", f"unknown policy {args.policy!r} (known: {known})")
    axes = [_axis(text) for text in args.sets]
    names = [name for name, _, _ in axes]
    for name in names:
        if names.count(name) > 1:
            raise InputError(f"--set {name}", "is given twice")
    prefix = f"{args.policy} " if args.policy is not None else ""
    combos = grid(axes) if axes else []
    resolved = [(prefix + label, written, parsed) for label, written, parsed in combos]
    if args.policy is not None and not resolved:
        resolved = [(f"policy {args.policy}", {}, {})]
    return axes, resolved


def _axis(text: str) -> Axis:
    """``--set`` of a setting (`sweep.parse_axis`), or of `MIN_RUNTIME`."""
    key, sep, values = text.partition("=")
    if key.strip() != MIN_RUNTIME or not sep:
        try:
            return parse_axis(text)
        except InputError as error:  # name the what-if the settings do not list
            reason = error.reason.replace("(known: ", f"(known: {MIN_RUNTIME}, ", 1)
            raise InputError(error.where, reason) from None
    written = [v.strip() for v in values.split(",") if v.strip()]
    if not written:
        raise InputError(f"--set {MIN_RUNTIME}", "give at least one value")
    try:
        return MIN_RUNTIME, written, [parse_duration(v) for v in written]
    except ValueError as error:
        raise InputError(f"--set {MIN_RUNTIME}", str(error)) from None


def run(args: argparse.Namespace) -> int:
    now = time.time()
    since, until, cut = period(args, now)
    axes, runs = what_ifs(args)
    read_started = time.perf_counter()
    source = open_store(args.store)
    try:
        window = max([0.0, *(v for _, _, p in runs for k, v in p.items() if k == "lookback")])
        history = read_history(source, since, until, window)
        read_s = time.perf_counter() - read_started
        if not history.requests:
            first, last = history_span(source)
            held = (
                "the store holds no request"
                if first is None
                else f"its requests were submitted from {iso(first)} to {iso(last or first)}"
            )
            raise InputError(
                "--since",
                f"no request was submitted, running or waiting from {iso(since)} to "
                f"{iso(until)}; {held}",
            )
    finally:
        source.close()
    report = replay_report(history, args.policy, runs)
    report["period"]["cut_to_now"] = cut
    report["timings_s"] = {"read": round(read_s, 2), **report["timings_s"]}
    print_report(report)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=1)
            handle.write("\n")
        print(f"\nreport: {args.json}")
    if args.plot:
        from scheduler_core.research.replayplot import plot_waits

        plot_waits(args.plot, report)
        print(f"plot: {args.plot}")
    return 0


def replay_report(
    history: Any, policy: str | None, runs: Sequence[tuple[str, dict[str, str], dict[str, Any]]]
) -> dict[str, Any]:
    """The whole report (docs/replay.md lists its keys)."""
    started = time.perf_counter()
    laps = [started]
    the_plan = plan(history)
    laps.append(time.perf_counter())
    simulated = simulate(the_plan)
    laps.append(time.perf_counter())
    live_out, replay_out = outcome("live", the_plan.live), outcome("replay", simulated)
    laps.append(time.perf_counter())
    compared = compare(the_plan, simulated, live_out, replay_out)
    laps.append(time.perf_counter())
    outcomes = [outcome_row("live", live_out), outcome_row("replay", replay_out)]
    for label, written, parsed in runs:
        changes = {k: v for k, v in parsed.items() if k != MIN_RUNTIME}
        if policy is not None:
            changes["name"] = policy
        settings: Settings = history.settings.replace(**changes)
        varied = the_plan
        if MIN_RUNTIME in parsed:
            varied = with_min_runtime(the_plan, parsed[MIN_RUNTIME])
        simulated_run = simulate(varied, settings, pinned=set(changes))
        row = outcome_row(label, simulated_run, written, parsed)
        row["admin_applicable"] = sorted(k for k in parsed if k in ADMIN_KEYS)
        outcomes.append(row)
    settings_json = {
        k: v.value if hasattr(v, "value") else v for k, v in _fields(history.settings).items()
    }
    return {
        "generated": round(time.time(), 3),
        "store": history.store,
        "schema": history.schema,
        "period": {
            "since": history.since,
            "until": history.until,
            "since_iso": iso(history.since),
            "until_iso": iso(history.until),
            "seconds": history.until - history.since,
        },
        "policy": history.settings.name,
        "settings": settings_json,
        "history": {
            "requests": len(history.requests),
            "submitted_in_period": len(the_plan.scenario.requests),
            "running_at_start": len(the_plan.adopted),
            "queued_at_start": len(the_plan.queued),
            "node_events": len(the_plan.scenario.events),
            "admin_changes": len(the_plan.admin),
            "hub_starts": len(history.hub_starts),
            "missing": list(history.missing),
        },
        **compared,
        "forecast": forecast_accuracy(the_plan),
        "outcomes": outcomes,
        "wall_s": round(time.perf_counter() - started, 2),
        "timings_s": {
            name: round(b - a, 2)
            for name, a, b in zip(
                ("plan", "simulate", "outcomes", "compare", "what_ifs"),
                laps,
                [*laps[1:], time.perf_counter()],
                strict=True,
            )
        },
    }


def _fields(settings: Settings) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(settings)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _signed(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) < 0.5:
        return fmt_wait(0.0)
    return ("+" if value > 0 else "-") + fmt_wait(abs(value))


def print_report(report: Mapping[str, Any]) -> None:
    """The report as a table on stdout."""
    span = report["period"]
    history = report["history"]
    print(f"budgethub replay {report['store']} (schema {report['schema']})")
    cut = " (cut to now)" if span.get("cut_to_now") else ""
    seconds = span["seconds"]
    length = fmt_wait(seconds) if seconds < DAY else f"{seconds / DAY:.1f} days"
    print(
        f"period {span['since_iso']} to {span['until_iso']}{cut} ({length}), "
        f"live policy {report['policy']}"
    )
    print(
        f"history: {history['requests']} requests ({history['submitted_in_period']} submitted "
        f"in the period, {history['running_at_start']} running and {history['queued_at_start']} "
        f"waiting at its start), {history['node_events']} node changes, "
        f"{history['admin_changes']} changes of settings or shares, "
        f"{history['hub_starts']} Hub starts"
    )
    for line in history["missing"]:
        print(f"  not in the store: {line}")
    c = report["comparison"]
    print()
    print("live against simulated, request by request")
    print(
        f"  start order       {_pct(c['order_agreement'])} of {c['order_pairs']:,} pairs in "
        f"the same order ({c['order_ties']:,} pairs started in the same second on one side)"
    )
    wait, absolute = c["wait_error_s"], c["wait_abs_error_s"]
    print(
        f"  wait error        median {_signed(wait['p50'])}, p90 {_signed(wait['p90'])} "
        f"(simulated less live, {wait['n']} requests started in both)"
    )
    print(
        f"  |wait error|      median {fmt_wait(absolute['p50'])}, p90 {fmt_wait(absolute['p90'])}"
    )
    print(f"  same node         {_pct(c['same_node'])}   same funding {_pct(c['same_funding'])}")
    pre = c["preemptions"]
    print(
        f"  preemptions       live {pre['live']}, simulated {pre['simulated']}"
        + (
            ""
            if pre["same_set"]
            else f"; only live: {_few(pre['only_live'])}; "
            f"only simulated: {_few(pre['only_simulated'])}"
        )
    )
    if c["causes"]:
        print("  differences by cause")
        for cause, count in c["causes"].items():
            print(f"    {count:>6}  {cause}: {CAUSES.get(cause, cause)}")
    print(f"  {'team':<16}{'live GPU-h':>12}{'sim GPU-h':>12}{'error':>9}")
    for name, team in c["teams"].items():
        print(
            f"  {name:<16}{team['live_gpu_h']:>12.2f}{team['simulated_gpu_h']:>12.2f}"
            f"{_pct(team['error']):>9}"
        )
    forecast = report["forecast"]
    if forecast is not None:
        err, abs_err = forecast["start_error_s"], forecast["start_abs_error_s"]
        print()
        print(
            f"forecast at submit: start error (actual less forecast) median {_signed(err['p50'])}, "
            f"p90 {_signed(err['p90'])}; |error| median {fmt_wait(abs_err['p50'])}, "
            f"p90 {fmt_wait(abs_err['p90'])} ({forecast['n']} requests); funding as forecast "
            f"{_pct(forecast['funding_agreement'])} of {forecast['funding_n']}"
        )
    print()
    print("outcomes (live: what happened; replay: the simulator on the same history)")
    print(headline_table([(row["label"], row["headline"]) for row in report["outcomes"]]))
    timings = report.get("timings_s") or {}
    if timings:
        print()
        print(
            "took " + ", ".join(f"{name.replace('_', '-')} {s:g} s" for name, s in timings.items())
        )


def _few(ids: Sequence[str], limit: int = 5) -> str:
    if not ids:
        return "none"
    more = f" and {len(ids) - limit} more" if len(ids) > limit else ""
    return ", ".join(ids[:limit]) + more

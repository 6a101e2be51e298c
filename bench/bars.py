"""The bars and aims of `make bench` (bench/bars.toml), and the judging of figures against them.

``load()`` reads and checks bars.toml: a bad entry raises ``BarsError`` naming the
figure and the field. ``judge(figures)`` gives one ``Verdict`` per declared figure
(or per id in ``expected``): a figure with a ``baseline`` is judged as its ratio to
that figure, measured in the same run; one with no bar is printed, not judged; one
that no module produced is ``missing``. ``table()`` lays the verdicts out, and
``exit_status()`` is what `python -m bench` exits with: 2 if a figure is missing, 1
if one is outside its bar, 0 otherwise.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PATH = Path(__file__).resolve().with_name("bars.toml")
FIELDS = ("what", "unit", "direction", "bar", "aim", "baseline", "command")
REQUIRED = ("what", "unit", "direction", "command")
DIRECTIONS = ("max", "min")
ID = re.compile(r"^[a-z][a-z0-9_]*\.[a-z][a-z0-9_]*$")

OK = "ok"
OUTSIDE = "OUTSIDE"
UNJUDGED = "no bar"
MISSING = "MISSING"


class BarsError(ValueError):
    """A malformed bars.toml: the message names the figure and the field."""

    def __init__(self, figure: str, field: str, problem: str) -> None:
        super().__init__(f"bars.toml: [{figure}] {field}: {problem}")
        self.figure = figure
        self.field = field


@dataclass(frozen=True)
class Bar:
    id: str
    what: str
    unit: str
    direction: str
    command: str
    bar: float | None = None
    aim: float | None = None
    baseline: str | None = None

    @property
    def module(self) -> str:
        return self.id.split(".", 1)[0]

    def within(self, value: float, limit: float, baseline: float | None) -> bool:
        """Is ``value`` within ``limit`` (a ratio to ``baseline`` where there is one)?
        Compared as value <= limit x baseline (``min``: >=), so 0 against 0 holds and
        a NaN never does."""
        bound = limit if baseline is None else limit * baseline
        if math.isnan(value) or math.isnan(bound):
            return False
        return value <= bound if self.direction == "max" else value >= bound


@dataclass(frozen=True)
class Verdict:
    bar: Bar
    value: float | None
    """The figure as measured (None: missing)."""
    baseline: float | None = None
    """The baseline figure's value, where the bar has one."""
    status: str = OK
    aim_met: bool | None = None
    """None where there is no aim or nothing to compare."""

    @property
    def ratio(self) -> float | None:
        """``value / baseline`` where the bar has a baseline (NaN for 0 / 0)."""
        if self.value is None or self.baseline is None:
            return None
        if self.baseline == 0:
            return math.nan if self.value == 0 else math.copysign(math.inf, self.value)
        return self.value / self.baseline


def _number(figure: str, field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BarsError(figure, field, f"must be a number, not {value!r}")
    if math.isnan(value):
        raise BarsError(figure, field, "must be a number, not NaN")
    return float(value)


def _text(figure: str, field: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise BarsError(figure, field, f"must be a non-empty string, not {value!r}")
    return value


def parse(document: Mapping[str, Any]) -> dict[str, Bar]:
    """The bars of a parsed bars.toml (``[module.figure]`` tables), checked."""
    entries: dict[str, Any] = {}
    for module, table in document.items():
        if not isinstance(table, dict) or not table:
            raise BarsError(module, "table", "not a [module.figure] table")
        for name, entry in table.items():
            figure = f"{module}.{name}"
            if not isinstance(entry, dict):
                raise BarsError(figure, "table", f"{name} = {entry!r} is not a figure's table")
            entries[figure] = entry
    bars: dict[str, Bar] = {}
    for figure, entry in entries.items():
        if not ID.match(figure):
            raise BarsError(figure, "id", "must read module.figure (lower case, digits, _)")
        for field in entry:
            if field not in FIELDS:
                raise BarsError(figure, field, f"unknown field (fields: {', '.join(FIELDS)})")
        for field in REQUIRED:
            if field not in entry:
                raise BarsError(figure, field, "missing")
        direction = _text(figure, "direction", entry["direction"])
        if direction not in DIRECTIONS:
            raise BarsError(figure, "direction", f"must be 'max' or 'min', not {direction!r}")
        bar = _number(figure, "bar", entry["bar"]) if "bar" in entry else None
        aim = _number(figure, "aim", entry["aim"]) if "aim" in entry else None
        if bar is not None and aim is not None:
            looser = aim > bar if direction == "max" else aim < bar
            if looser:
                raise BarsError(figure, "aim", f"{aim:g} is looser than the bar {bar:g}")
        baseline = None
        if "baseline" in entry:
            baseline = _text(figure, "baseline", entry["baseline"])
            if baseline == figure:
                raise BarsError(figure, "baseline", "a figure is not its own baseline")
            if baseline not in entries:
                raise BarsError(figure, "baseline", f"{baseline!r} is no figure in bars.toml")
            if "baseline" in entries[baseline]:
                raise BarsError(figure, "baseline", f"{baseline!r} has a baseline itself")
        bars[figure] = Bar(
            id=figure,
            what=_text(figure, "what", entry["what"]),
            unit=_text(figure, "unit", entry["unit"]),
            direction=direction,
            command=_text(figure, "command", entry["command"]),
            bar=bar,
            aim=aim,
            baseline=baseline,
        )
    return bars


def load(path: Path = PATH) -> dict[str, Bar]:
    """bars.toml, checked; BarsError names the figure and field of a bad entry."""
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise BarsError(path.name, "toml", str(error)) from None
    return parse(document)


def judge(
    figures: Mapping[str, float],
    bars: Mapping[str, Bar] | None = None,
    expected: Iterable[str] | None = None,
) -> list[Verdict]:
    """One verdict per bar in ``expected`` (default: every bar), in bars.toml's order."""
    bars = load() if bars is None else bars
    wanted = set(bars) if expected is None else set(expected)
    out = []
    for figure, bar in bars.items():
        if figure not in wanted:
            continue
        value = figures.get(figure)
        baseline = figures.get(bar.baseline) if bar.baseline else None
        if value is None or (bar.baseline is not None and baseline is None):
            out.append(Verdict(bar, None if value is None else float(value), status=MISSING))
            continue
        value = float(value)
        base = None if baseline is None else float(baseline)
        if bar.bar is None:
            status = UNJUDGED
        else:
            status = OK if bar.within(value, bar.bar, base) else OUTSIDE
        aim_met = None if bar.aim is None else bar.within(value, bar.aim, base)
        out.append(Verdict(bar, value, base, status, aim_met))
    return out


def exit_status(verdicts: Iterable[Verdict]) -> int:
    """2 if a figure is missing, else 1 if one is outside its bar, else 0."""
    statuses = {v.status for v in verdicts}
    if MISSING in statuses:
        return 2
    return 1 if OUTSIDE in statuses else 0


# --- printing --------------------------------------------------------------------


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if unit == "fraction":
        return f"{value:.1%}"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "%":
        return f"{value:.2f} %"
    magnitude = abs(value)
    digits = 0 if magnitude >= 100 else 1 if magnitude >= 10 else 2
    return f"{value:,.{digits}f} {unit}"


def limit_text(bar: Bar, limit: float | None) -> str:
    if limit is None:
        return "-"
    sign = "<=" if bar.direction == "max" else ">="
    shown = fmt(limit, "x") if bar.baseline else fmt(limit, bar.unit)
    return f"{sign} {shown}"


def value_text(verdict: Verdict) -> str:
    bar = verdict.bar
    if verdict.value is None:
        return "-"
    if bar.baseline is None:
        return fmt(verdict.value, bar.unit)
    ratio = verdict.ratio
    shown = "both 0" if ratio is not None and math.isnan(ratio) else fmt(ratio, "x")
    return f"{shown} ({fmt(verdict.value, bar.unit)} / {fmt(verdict.baseline, bar.unit)})"


def status_text(verdict: Verdict) -> str:
    if verdict.status == MISSING:
        what = "not produced"
        if verdict.value is not None:
            what = f"baseline {verdict.bar.baseline} not produced"
        return f"{MISSING} ({what})"
    if verdict.aim_met is None:
        return verdict.status
    return f"{verdict.status}, aim {'met' if verdict.aim_met else 'missed'}"


def table(verdicts: Iterable[Verdict]) -> list[str]:
    """``figure  value  bar  aim  verdict``, one line per figure."""
    rows = [
        (
            v.bar.id,
            value_text(v),
            limit_text(v.bar, v.bar.bar),
            limit_text(v.bar, v.bar.aim),
            status_text(v),
        )
        for v in verdicts
    ]
    header = ("figure", "value", "bar", "aim", "verdict")
    widths = [max(len(row[k]) for row in [header, *rows]) for k in range(4)]
    lines = []
    for row in [header, *rows]:
        cells = [f"{row[k]:<{widths[k]}}" if k == 0 else f"{row[k]:>{widths[k]}}" for k in range(4)]
        lines.append("  ".join([*cells, row[4]]))
    return lines


def listing(bars: Mapping[str, Bar]) -> list[str]:
    """Every bar, for `python -m bench --list`."""
    lines = []
    for bar in bars.values():
        parts = [f"bar {limit_text(bar, bar.bar)}" if bar.bar is not None else "no bar"]
        if bar.aim is not None:
            parts.append(f"aim {limit_text(bar, bar.aim)}")
        if bar.baseline:
            parts.append(f"as a ratio to {bar.baseline}")
        lines.append(f"{bar.id}: {', '.join(parts)} ({bar.unit}; {bar.command})")
        lines.append(f"    {bar.what}")
    return lines

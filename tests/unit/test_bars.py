"""bench/bars.toml and bench/bars.py: every figure `make bench` measures is declared with
its bar, every declared figure is produced by a module, and judging holds its bars
(a figure over a max bar is outside, ratios to a same-run baseline, missing figures)."""

from __future__ import annotations

import ast
import importlib
import math
from pathlib import Path

import pytest

from bench import bars
from bench.family import Cell, Job, Outcome

BENCH = Path(bars.__file__).resolve().parent


def declared_figures() -> dict[str, tuple[str, ...]]:
    """Each bench module's FIGURES, read from its source (no import: spawn needs docker)."""
    out: dict[str, tuple[str, ...]] = {}
    for path in sorted(BENCH.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            if any(isinstance(t, ast.Name) and t.id == "FIGURES" for t in targets):
                assert isinstance(node, ast.Assign)
                out[path.stem] = tuple(ast.literal_eval(node.value))
    return out


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bars.toml"
    path.write_text(text, encoding="utf-8")
    return path


GOOD = """
[demo.latency_ms]
what = "a timing"
unit = "ms"
direction = "max"
bar = 10.0
aim = 5.0
command = "python -m bench.demo"
"""


# --- bars.toml, as checked in ------------------------------------------------------


def test_bars_toml_parses_and_every_figure_is_produced_by_its_module() -> None:
    declared = bars.load()
    produced = declared_figures()
    assert declared, "bars.toml declares nothing"
    by_module = {figure: module for module, ids in produced.items() for figure in ids}
    for figure, bar in declared.items():
        assert figure in by_module, f"{figure}: no bench module lists it in FIGURES"
        assert by_module[figure] == bar.module, (figure, by_module[figure])
        assert f"bench.{bar.module}" in bar.command, (figure, bar.command)
    for module, ids in produced.items():
        assert len(set(ids)) == len(ids), f"bench/{module}.py lists a figure twice"
        for figure in ids:
            assert figure in declared, f"bench/{module}.py produces {figure}, not in bars.toml"


def test_every_module_that_declares_figures_can_collect_them() -> None:
    runner = importlib.import_module("bench.__main__")
    for module in declared_figures():
        assert module in runner.NAMES, f"bench/{module}.py is not run by python -m bench"
        source = (BENCH / f"{module}.py").read_text(encoding="utf-8")
        assert "def collect(" in source, f"bench/{module}.py has no collect()"


def test_the_bars_the_readme_states_are_there() -> None:
    declared = bars.load()
    expected = {
        "cycle.steady_median_ms": ("max", 2.0, 1.0, None),
        "month.simulated_s": ("max", 8.0, 3.0, None),
        "month.worst_team_daily": ("min", 0.90, None, None),
        "compare.wall_s": ("max", 300.0, None, None),
        "family.debug_p90_s": ("max", 60.0, None, None),
        "family.occupancy": ("min", 0.97, None, None),
        "family.worst_team_daily": ("min", 0.95, None, None),
        "family.legacy_debug_ratio": ("min", 5.0, None, None),
        "family.lost_over_legacy_points": ("max", 1.0, None, None),
        "family.goodput_under_legacy_points": ("max", 1.0, 0.0, None),
        "spawn.budget_s": ("max", 1.10, None, "spawn.dockerspawner_s"),
        "spawn.budget_over_bare_s": ("max", None, 1.15, "spawn.bare_container_s"),
        "spawn.grant_max_ms": ("max", 100.0, None, None),
        "snapshot.settled_slices_free_s": ("max", 30.0, 10.0, None),
        "snapshot.hot_restore_s": ("max", 30.0, None, None),
        "service.api_p95_ms": ("max", 100.0, 20.0, None),
        "service.page_p95_ms": ("max", 100.0, 20.0, None),
    }
    for figure, (direction, bar, aim, baseline) in expected.items():
        got = declared[figure]
        assert (got.direction, got.bar, got.aim, got.baseline) == (
            direction,
            bar,
            aim,
            baseline,
        ), figure
    assert declared["cycle.cold_start_median_ms"].bar is None  # the README states none


# --- judging --------------------------------------------------------------------------


def test_a_figure_over_a_max_bar_is_outside_and_fails_the_run() -> None:
    declared = bars.parse({"demo": {"latency_ms": {**_entry(), "bar": 10.0}}})
    [within] = bars.judge({"demo.latency_ms": 10.0}, declared)
    assert within.status == bars.OK
    [over] = bars.judge({"demo.latency_ms": 10.01}, declared)
    assert over.status == bars.OUTSIDE
    assert bars.exit_status([within]) == 0
    assert bars.exit_status([within, over]) == 1
    assert "OUTSIDE" in bars.table([over])[1]


def test_a_min_bar_and_the_aim() -> None:
    declared = bars.parse(
        {"demo": {"share": {**_entry(), "unit": "fraction", "direction": "min", "bar": 0.9}}}
    )
    [low] = bars.judge({"demo.share": 0.899}, declared)
    [high] = bars.judge({"demo.share": 0.95}, declared)
    assert (low.status, high.status) == (bars.OUTSIDE, bars.OK)
    declared = bars.parse({"demo": {"latency_ms": {**_entry(), "bar": 10.0, "aim": 5.0}}})
    [missed] = bars.judge({"demo.latency_ms": 7.0}, declared)
    [met] = bars.judge({"demo.latency_ms": 4.0}, declared)
    assert (missed.status, missed.aim_met) == (bars.OK, False)  # an aim is never judged
    assert met.aim_met is True
    assert bars.exit_status([missed]) == 0


def test_a_figure_with_no_bar_is_printed_not_judged() -> None:
    declared = bars.parse({"demo": {"latency_ms": _entry()}})
    [verdict] = bars.judge({"demo.latency_ms": 1e9}, declared)
    assert verdict.status == bars.UNJUDGED
    assert bars.exit_status([verdict]) == 0


def test_nan_is_never_within_a_bar() -> None:
    declared = bars.parse({"demo": {"latency_ms": {**_entry(), "bar": 10.0}}})
    [verdict] = bars.judge({"demo.latency_ms": math.nan}, declared)
    assert verdict.status == bars.OUTSIDE


def ratio_bars(**extra: object) -> dict[str, bars.Bar]:
    return bars.parse(
        {
            "spawn": {
                "stock_s": _entry(),
                "ours_s": {**_entry(), "baseline": "spawn.stock_s", "bar": 1.10, **extra},
            }
        }
    )


def test_a_timing_with_a_baseline_is_judged_as_its_ratio() -> None:
    declared = ratio_bars(aim=0.9)
    # 2.4 s is far over any absolute reading of 1.10, but 1.09x the baseline: within.
    verdicts = {
        v.bar.id: v for v in bars.judge({"spawn.ours_s": 2.4, "spawn.stock_s": 2.2}, declared)
    }
    ours = verdicts["spawn.ours_s"]
    assert ours.status == bars.OK and ours.aim_met is False
    assert ours.ratio == pytest.approx(2.4 / 2.2)
    assert verdicts["spawn.stock_s"].status == bars.UNJUDGED
    # The same timing against a faster baseline of the same run is outside.
    [ours] = bars.judge({"spawn.ours_s": 2.4, "spawn.stock_s": 2.0}, declared, ["spawn.ours_s"])
    assert ours.status == bars.OUTSIDE
    assert "1.20x" in bars.value_text(ours)


def test_ratios_against_a_zero_baseline() -> None:
    declared = ratio_bars()
    [both] = bars.judge({"spawn.ours_s": 0.0, "spawn.stock_s": 0.0}, declared, ["spawn.ours_s"])
    assert both.status == bars.OK  # 0 <= 1.10 x 0
    assert bars.value_text(both).startswith("both 0")
    [slower] = bars.judge({"spawn.ours_s": 1.0, "spawn.stock_s": 0.0}, declared, ["spawn.ours_s"])
    assert slower.status == bars.OUTSIDE and slower.ratio == math.inf


def test_a_missing_figure_or_baseline_exits_2() -> None:
    declared = ratio_bars()
    verdicts = bars.judge({"spawn.stock_s": 2.0}, declared)
    assert {v.bar.id: v.status for v in verdicts} == {
        "spawn.stock_s": bars.UNJUDGED,
        "spawn.ours_s": bars.MISSING,
    }
    assert bars.exit_status(verdicts) == 2
    [ours] = bars.judge({"spawn.ours_s": 2.0}, declared, ["spawn.ours_s"])
    assert ours.status == bars.MISSING
    assert "baseline spawn.stock_s" in bars.status_text(ours)
    # Missing outranks outside: the run did not check everything.
    over = bars.judge({"spawn.ours_s": 9.0, "spawn.stock_s": 1.0}, declared)
    assert bars.exit_status([*over, *verdicts]) == 2


def test_only_the_expected_figures_are_judged() -> None:
    declared = bars.parse({"a": {"x": _entry()}, "b": {"y": {**_entry(), "bar": 1.0}}})
    verdicts = bars.judge({"a.x": 1.0}, declared, ["a.x"])
    assert [v.bar.id for v in verdicts] == ["a.x"]
    assert bars.exit_status(verdicts) == 0


# --- a malformed bars.toml names the figure and the field --------------------------


def _entry() -> dict[str, object]:
    return {"what": "a timing", "unit": "ms", "direction": "max", "command": "python -m bench.x"}


@pytest.mark.parametrize(
    ("replace", "field"),
    [
        ('bar = "ten"', "bar"),
        ("bar = true", "bar"),
        ("aim = 50.0", "aim"),  # looser than the max bar of 10
        ('direction = "up"', "direction"),
        ('what = ""', "what"),
        ('baseline = "demo.nothing"', "baseline"),
        ('baseline = "demo.latency_ms"', "baseline"),
        ('colour = "red"', "colour"),
    ],
)
def test_a_malformed_entry_is_named_by_figure_and_field(
    tmp_path: Path, replace: str, field: str
) -> None:
    key = replace.split(" = ")[0]
    lines = [line for line in GOOD.splitlines() if not line.startswith(f"{key} =")]
    text = "\n".join([*lines, replace]) + "\n"
    with pytest.raises(bars.BarsError) as raised:
        bars.load(write(tmp_path, text))
    assert raised.value.figure == "demo.latency_ms"
    assert raised.value.field == field
    assert f"[demo.latency_ms] {field}:" in str(raised.value)


@pytest.mark.parametrize("field", ["what", "unit", "direction", "command"])
def test_a_required_field_missing_is_named(tmp_path: Path, field: str) -> None:
    text = "\n".join(line for line in GOOD.splitlines() if not line.startswith(f"{field} ="))
    with pytest.raises(bars.BarsError, match=rf"\[demo.latency_ms\] {field}: missing"):
        bars.load(write(tmp_path, text))


def test_not_toml_and_not_a_figure_table_are_errors(tmp_path: Path) -> None:
    with pytest.raises(bars.BarsError, match="toml"):
        bars.load(write(tmp_path, "[demo.latency_ms\n"))
    with pytest.raises(bars.BarsError, match=r"\[demo.latency_ms\] table"):
        bars.load(write(tmp_path, "[demo]\nlatency_ms = 3\n"))
    assert set(bars.load(write(tmp_path, GOOD))) == {"demo.latency_ms"}


# --- python -m bench ----------------------------------------------------------------


def test_python_m_bench_exits_by_the_worst_verdict(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    runner = importlib.import_module("bench.__main__")
    figures = {
        "cycle.steady_median_ms": 1.2,
        "cycle.steady_p95_ms": 1.3,
        "cycle.cold_start_median_ms": 147.7,
    }
    monkeypatch.setattr(runner, "collector", lambda name: lambda argv: dict(figures))
    assert runner.main(["--only", "cycle"]) == 0
    out = capsys.readouterr().out
    assert "cycle.steady_median_ms" in out and "month." not in out
    figures["cycle.steady_median_ms"] = 2.5
    assert runner.main(["--only", "cycle"]) == 1
    assert "OUTSIDE its bar: cycle.steady_median_ms" in capsys.readouterr().out
    del figures["cycle.cold_start_median_ms"]
    assert runner.main(["--only", "cycle"]) == 2
    assert "MISSING cycle.cold_start_median_ms" in capsys.readouterr().out
    assert runner.main(["--list"]) == 0
    assert "spawn.budget_s: bar <= 1.10x" in capsys.readouterr().out


def test_a_module_that_fails_leaves_its_figures_missing_and_the_rest_judged(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    runner = importlib.import_module("bench.__main__")

    def service(argv: list[str]) -> dict[str, float]:
        return {"service.api_p95_ms": 9.0, "service.page_p95_ms": 11.0}

    def broken(argv: list[str]) -> dict[str, float]:
        raise RuntimeError("no engine")

    monkeypatch.setattr(runner, "collector", lambda name: broken if name == "cycle" else service)
    assert runner.main(["--only", "service,cycle"]) == 2
    captured = capsys.readouterr()
    assert "cycle failed" in captured.err and "RuntimeError: no engine" in captured.err
    assert "service.api_p95_ms" in captured.out
    assert "MISSING cycle.steady_median_ms, cycle.steady_p95_ms" in captured.out
    [rebuild] = [line for line in captured.out.splitlines() if line.startswith("service.rebuild")]
    assert "MISSING" in rebuild  # the module ran but did not produce it


# --- the modules' figures -----------------------------------------------------------


def _outcome(policy: str, seed: int, debug_p90_s: float, worst_daily: float = 0.95) -> Outcome:
    return Outcome(
        job=Job(Cell(88, 1.0, 0.35), seed, policy, 7, 0),
        requests=100,
        debug_p90_s=debug_p90_s,
        all_p50_s=0.0,
        occupancy=0.97,
        worst_team="evals",
        worst_daily=worst_daily,
        wall_s=0.1,
    )


def test_family_figures_are_the_worst_run_and_the_legacy_ratio_per_seed() -> None:
    from bench import family

    budget = [_outcome("budget", 1, 100.0, 0.93), _outcome("budget", 2, 0.0, 0.91)]
    legacy = [_outcome("legacy", 1, 400.0), _outcome("legacy", 2, 0.0)]
    got = family.figures(budget, legacy)
    assert set(got) == set(family.FIGURES)
    assert got["family.debug_p90_s"] == 100.0
    assert got["family.worst_team_daily"] == 0.91
    # Seed 1: 4x (outside the 5x bar), whatever seed 2 (both 0, held) gives.
    assert got["family.legacy_debug_ratio"] == 4.0
    [ratio] = bars.judge(got, expected=["family.legacy_debug_ratio"])
    assert ratio.status == bars.OUTSIDE
    both_zero = family.figures(budget[1:], legacy[1:])
    assert both_zero["family.legacy_debug_ratio"] == math.inf
    assert not family.verdict(budget, legacy).legacy  # the table says the same


def test_spawn_figures_cover_its_figures() -> None:
    spawn = pytest.importorskip("bench.spawn")
    results = {
        "sequential_median_s": {"budget": 2.09, "dockerspawner": 2.43},
        "ratio_budget_to_dockerspawner": 0.86,
        "bare_container_median_s": 1.35,
        "concurrent_10": {
            "budget": {"spawn_median_s": 11.7, "stop_median_s": 3.6},
            "dockerspawner": {"spawn_median_s": 14.8, "stop_median_s": 6.5},
        },
        "grant_latency_ms": {"n": 21, "median": 6.5, "max": 39.3},
        "hub_api_idle_ms": {"p50": 8.4, "p99": 11.6},
        "hub_api_500_queued": {"api_p99_ms": 12.0},
    }
    got = spawn.figures(results)
    assert set(got) == set(spawn.FIGURES)
    verdicts = {v.bar.id: v for v in bars.judge(got, expected=spawn.FIGURES)}
    assert verdicts["spawn.budget_s"].ratio == pytest.approx(2.09 / 2.43)
    assert verdicts["spawn.budget_over_bare_s"].aim_met is False  # 1.55x against 1.15x
    assert bars.exit_status(verdicts.values()) == 0


def test_snapshot_figures_cover_its_figures_and_an_unlogged_time_fails() -> None:
    snapshot = pytest.importorskip("bench.snapshot")
    case = {
        "slices_free_logged_s": 1.58,
        "restore_available_s": 7.55,
        "disk_floor_s": 2.01,
    }
    got = snapshot.figures([{**case, "hot": False}, {**case, "hot": True}])
    assert set(got) == set(snapshot.FIGURES)
    verdicts = {v.bar.id: v for v in bars.judge(got, expected=snapshot.FIGURES)}
    assert verdicts["snapshot.settled_slices_free_s"].aim_met is True
    assert verdicts["snapshot.hot_restore_vs_disk_s"].ratio == pytest.approx(7.55 / 2.01)
    assert bars.exit_status(verdicts.values()) == 0
    unlogged = snapshot.figures([{**case, "hot": True, "slices_free_logged_s": None}])
    [hot] = bars.judge(unlogged, expected=["snapshot.hot_slices_free_s"])
    assert hot.status == bars.OUTSIDE

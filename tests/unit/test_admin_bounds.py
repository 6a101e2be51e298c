"""Issue 41: every admin field has bounds that make sense, checked like the
configuration and named in the refusal; figures print at a sensible precision whatever
the value; durations are written as the spawn form writes them."""

from __future__ import annotations

import math

import pytest

from harness import builders
from scheduler_core.model import Team
from scheduler_core.settings import BOUNDS, Settings
from scheduler_core.teams import SHARE_MIN
from spawner import admin
from spawner.hub.config import ConfigError
from spawner.hub.embedded import BudgetScheduler
from spawner.hub.spawner import DEFAULT_PROFILES
from spawner.profiles import (
    FormError,
    capped,
    human_duration,
    parse_profiles,
    profile_facts,
    render_form,
    resolve,
)
from spawner.readmodel.service import app, charts
from spawner.readmodel.status import amount, number, percent, plural

POOLS = builders.pools()
TEAMS = [Team("nlp", {"gpu": 0.5, "cpu": 0.5}), Team("vision", {"gpu": 0.3, "cpu": 0.5})]


@pytest.mark.parametrize(
    "value", [1e-300, 0.0009, 5e-324, math.nan, math.inf, -0.0, 1.0000001]
)  # fmt: skip
def test_a_share_is_0_or_from_a_thousandth_to_1(value: float) -> None:
    if value == 0.0:  # -0.0 is 0: no share
        assert admin.change_team(TEAMS, POOLS, "nlp", share={"gpu": value})
        return
    with pytest.raises(admin.AdminError) as caught:
        admin.change_team(TEAMS, POOLS, "nlp", share={"gpu": value})
    assert caught.value.field == "share.gpu"


@pytest.mark.parametrize("value", [0, 0.001, 0.5])
def test_shares_at_the_bounds_are_taken(value: float) -> None:
    teams = admin.change_team(TEAMS, POOLS, "nlp", share={"gpu": value})
    assert {t.name: t.share["gpu"] for t in teams}["nlp"] == value


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("max_min_runtime", 0),
        ("max_min_runtime", 59),
        ("max_min_runtime", "8d"),
        ("max_min_runtime", math.nan),
        ("lookback", "59m"),
        ("lookback", math.inf),
        ("lookback", "366d"),
    ],
)
def test_a_setting_out_of_bounds_names_the_setting(key: str, value: object) -> None:
    with pytest.raises(admin.AdminError) as caught:
        admin.check_setting(key, value)
    assert caught.value.field == key
    assert "between" in caught.value.reason or "duration" in caught.value.reason


@pytest.mark.parametrize(
    ("key", "value", "seconds"),
    [("max_min_runtime", "1m", 60), ("max_min_runtime", "7d", 7 * 86400),
     ("lookback", "1h", 3600), ("lookback", "365d", 365 * 86400)],
)  # fmt: skip
def test_settings_at_the_bounds_are_taken(key: str, value: object, seconds: float) -> None:
    assert admin.check_setting(key, value) == seconds


def test_a_stored_value_out_of_the_new_bounds_is_ignored_with_the_reason() -> None:
    merged = admin.effective(TEAMS, Settings(), POOLS, [], {"max_min_runtime": 0.0})
    assert merged.settings.max_min_runtime == Settings().max_min_runtime
    assert merged.ignored and "max_min_runtime" in merged.ignored[0]


# -- the configuration has the admin's bounds (one definition: scheduler_core) ------------


@pytest.mark.parametrize(
    ("share", "field", "reason"),
    [(1e-300, "teams.vision.share", "must be 0 or at least 0.001"),
     ({"gpu": 0.0009}, "teams.vision.share.gpu", "must be 0 or at least 0.001"),
     ({"cpu": 1.5}, "teams.vision.share.cpu", "must be at most 1"),
     (math.nan, "teams.vision.share", "must be a number")],
)  # fmt: skip
def test_a_configured_share_out_of_the_admins_bounds_names_the_team(
    share: object, field: str, reason: str
) -> None:
    teams = [{"name": "nlp", "share": 0.5}, {"name": "vision", "share": share}]
    with pytest.raises(ConfigError) as caught:
        BudgetScheduler(teams=teams).cluster()
    assert str(caught.value).startswith(f"c.BudgetScheduler.{field}: {reason}")
    bad = share if not isinstance(share, dict) else next(iter(share.values()))
    with pytest.raises(admin.AdminError):  # the admin is refused the same value
        admin.check_share("share", bad)


def test_configured_shares_at_the_bounds_are_taken() -> None:
    teams = [
        {"name": "nlp", "share": SHARE_MIN},
        {"name": "vision", "share": {"gpu": 0, "cpu": 0.999}},
    ]
    config = BudgetScheduler(teams=teams, nodes=[{"name": "n", "pool": "gpu", "gpus": 1}])
    shares = {t.name: dict(t.share) for t in config.cluster().teams}
    assert shares == {"nlp": {"gpu": 0.001, "cpu": 0.001}, "vision": {"gpu": 0.0, "cpu": 0.999}}


def test_other_team_errors_name_the_team_too() -> None:
    teams = [{"name": "nlp", "share": 0.5}, {"name": "vision", "parent": "nobody"}]
    with pytest.raises(ConfigError, match=r"^c.BudgetScheduler.teams.vision.parent: unknown"):
        BudgetScheduler(teams=teams).cluster()


@pytest.mark.parametrize(
    ("key", "value"),
    [("max_min_runtime", 0.0), ("max_min_runtime", 59.0), ("max_min_runtime", 8 * 86400.0),
     ("lookback", 3599.0), ("lookback", 366 * 86400.0)],
)  # fmt: skip
def test_a_configured_setting_out_of_the_admins_bounds_is_refused(key: str, value: float) -> None:
    with pytest.raises(ConfigError) as caught:
        BudgetScheduler(**{key: value}).core_settings()
    assert str(caught.value).startswith(f"c.BudgetScheduler.{key}: must be between ")
    with pytest.raises(admin.AdminError) as refused:  # the admin is refused the same value
        admin.check_setting(key, value)
    assert str(caught.value).endswith(refused.value.reason)


def test_a_bound_set_through_policy_settings_is_refused_too() -> None:
    with pytest.raises(ConfigError, match="c.BudgetScheduler.max_min_runtime: must be between"):
        BudgetScheduler(policy_settings={"max_min_runtime": "30s"}).core_settings()


@pytest.mark.parametrize(("key", "seconds"), [("max_min_runtime", 60.0), ("lookback", 3600.0),
                                             ("max_min_runtime", 7 * 86400.0)])  # fmt: skip
def test_configured_settings_at_the_bounds_are_taken(key: str, seconds: float) -> None:
    assert getattr(BudgetScheduler(**{key: seconds}).core_settings(), key) == seconds


def test_the_admin_and_the_configuration_share_one_definition() -> None:
    assert admin.LIMITS is BOUNDS


# -- the form states the admin's max_min_runtime ------------------------------------------


def test_the_form_states_the_admins_cap_not_only_the_configured_one() -> None:
    configured = parse_profiles(DEFAULT_PROFILES, Settings(), ["gpu", "cpu"])
    notebook = next(p for p in configured if p.slug == "gpu-notebook")
    assert "; protected 1 h by default, at most 8 h)" in render_form([notebook], ["nlp"], {})
    [lowered] = capped([notebook], 2 * 3600.0)  # the admin set max_min_runtime to 2h
    form = render_form([lowered], ["nlp"], {})
    assert "; protected 1 h by default, at most 2 h)" in form and "8 h" not in form
    with pytest.raises(FormError, match="3 h is over the cap of 2 h") as caught:
        resolve({"profile": "gpu-notebook", "min_runtime": "3h"}, [lowered], ["nlp"])
    assert caught.value.field == "min_runtime"
    [tiny] = capped([notebook], 60.0)  # below the profile's default: the default drops too
    assert profile_facts(tiny).endswith("protected 1 min by default")
    assert resolve({"profile": "gpu-notebook"}, [tiny], ["nlp"]).min_runtime == 60.0
    [debug] = capped([p for p in configured if p.slug == "debug"], 2 * 3600.0)
    assert debug.max_min_runtime == 900.0  # a cap above the profile's own changes nothing


@pytest.mark.parametrize(
    ("value", "text"),
    [(2.142857, "2.14"), (3.142857, "3.14"), (0.857143, "0.86"), (3.0, "3"), (0.5, "0.5"),
     (0.0, "0"), (1e-300, "<0.01"), (1e300, ">999,999,999"), (math.nan, "—")],
)  # fmt: skip
def test_gpu_amounts_have_at_most_two_decimals(value: float, text: str) -> None:
    assert amount(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.5, "50%"), (0.001, "0.1%"), (0.025, "2.5%"), (1e-300, "<0.1%"), (0.0, "0%"),
     (1e300, ">999,999%"), (None, "—")],
)  # fmt: skip
def test_percentages_are_short_whatever_the_fraction(value: float | None, text: str) -> None:
    assert percent(value) == text


def test_ratios_and_plurals() -> None:
    assert number(0.456) == "0.46" and number(1e300) == ">999,999" and number(None) == "—"
    assert number(1234.5) == "1,234"
    assert plural(1, "request") == "1 request" and plural(2, "request") == "2 requests"
    assert plural(0, "request") == "0 requests" and plural(7.0, "day") == "7 days"


@pytest.mark.parametrize("seconds", [45, 60, 900, 3600, 5400, 8 * 3600, 7 * 86400])
def test_the_service_writes_durations_as_the_spawn_form_does(seconds: float) -> None:
    assert app.duration(seconds) == human_duration(seconds)


def test_a_waited_time_is_rounded_before_it_is_written() -> None:
    assert app.duration(3725.4) == "62 min"
    assert app.duration(12.6) == "13 s"
    assert app.duration(3 * 3600 + 1000) == "3 h"
    assert app.duration(None) == "—"


def test_an_empty_chart_says_no_usage_yet() -> None:
    days = [(86400.0 * i, 0.0, 0.0) for i in range(30)]
    owed = str(charts.owed_delivered(days, "CPU", "t"))
    assert "no usage yet" in owed and "e-09" not in owed and "e-0" not in owed
    lines = str(charts.usage_lines([("nlp", [(0.0, 0.0), (1.0, 0.0)])], "CPU", "t"))
    assert "no usage yet" in lines and "e-0" not in lines


def test_owed_and_delivered_have_a_legend() -> None:
    days = [(86400.0 * i, 3600.0 * 24, 3600.0 * i) for i in range(30)]
    svg = str(charts.owed_delivered(days, "GPU", "t"))
    assert 'class="legend"' in svg
    assert "delivered (GPU·h per day)" in svg and "owed: the share" in svg


def test_the_ratio_chart_keeps_a_tiny_share_and_a_huge_ratio_short() -> None:
    svg = str(charts.ratio_bars([("nlp", 1e300, 1e-7), ("cv", 0.5, 0.5)], "r"))
    assert "nlp (&lt;0.1%)" in svg or "nlp (<0.1%)" in svg
    assert ">999,999" in svg and len(svg) < 3000

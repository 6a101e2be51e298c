"""Every spawn option of the wrong type gets a refusal naming the field (issue 41).

The REST API takes any JSON for ``user_options``; a dict, a list, a number, a bool or
null in a field the form sends as a string must come back as a ``FormError`` that
names the field and says what it must be, never as Python's own words ("expected
string or bytes-like object, got 'dict'") and never as an unhandled TypeError (a 500).
A value the user sent is shown cut short, so a 5,000-character name does not come back
(or reach the log) whole.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from scheduler_core.settings import Settings
from spawner.hub.spawner import DEFAULT_PROFILES
from spawner.profiles import FORM_FIELDS, FormError, parse_profiles, resolve, snapshot_choice

PROFILES = parse_profiles(DEFAULT_PROFILES, Settings(), ["gpu", "cpu"])
TEAMS = ["nlp"]

WRONG: dict[str, Any] = {
    "a mapping": {"a": 1},
    "a list": [[1]],
    "a boolean": True,
    "a number": 1.5,
}
"""Values of a wrong type; a list of one value is a form field's shape, so the list case
is a list inside it."""

STRING_FIELDS = ("profile", "slices", "team", "storage", "restore")
"""Fields whose value is a name (a number is wrong too)."""


def _refusal(options: dict[str, Any]) -> FormError:
    with pytest.raises(FormError) as caught:
        snapshot_choice(options)
        resolve(
            {k: v for k, v in options.items() if k not in {"restore", "fresh"}}, PROFILES, TEAMS
        )
    return caught.value


@pytest.mark.parametrize("kind", list(WRONG))
@pytest.mark.parametrize(
    "field", sorted(FORM_FIELDS | {"restore", "fresh"}), ids=lambda field: field
)
def test_an_option_of_the_wrong_type_is_refused_naming_the_field(field: str, kind: str) -> None:
    value = WRONG[kind]
    if (kind == "a number" and field not in STRING_FIELDS) or (
        kind == "a boolean" and field == "fresh"
    ):
        # numbers are right for gpus, priority, min_runtime and fresh; true/false for fresh
        value, kind = {"x": 1}, "a mapping"
    base: dict[str, Any] = {"profile": "dataprep"} if field == "storage" else {}
    error = _refusal({**base, field: value})
    assert error.field == field, error
    assert kind in error.reason, error
    assert "expected string" not in error.reason and "bytes-like" not in error.reason
    assert "unhashable" not in error.reason


@pytest.mark.parametrize("field", sorted(FORM_FIELDS | {"restore", "fresh"}))
def test_null_is_no_choice_and_takes_the_default(field: str) -> None:
    assert snapshot_choice({field: None}) == (None, False)
    options = {field: None} if field in FORM_FIELDS else {}
    spec = resolve(options, PROFILES, TEAMS)
    assert (spec.profile.slug, spec.team, spec.priority) == ("gpu-notebook", "nlp", 0)


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("profile", 5, "must be a string, not a number"),
        ("profile", {"a": 1}, "must be a string, not a mapping"),
        ("slices", {"x": 1}, "must be a string, not a mapping"),
        ("min_runtime", {"a": 1}, "must be a duration"),
        ("min_runtime", float("nan"), "must be a finite duration"),
        ("min_runtime", float("inf"), "must be a finite duration"),
        ("gpus", 1.5, "must be a whole number, not 1.5"),
        ("priority", [1, 2], "expected one value, got 2"),
        ("fresh", {"a": 1}, "must be on or off, not a mapping"),
    ],
)
def test_the_reason_says_what_the_field_must_be(field: str, value: Any, words: str) -> None:
    error = _refusal({field: value})
    assert error.field == field
    assert words in error.reason, error.reason


def test_a_long_value_is_cut_short_in_the_reason() -> None:
    name = "x" * 5000
    for options in (
        {"profile": name},
        {"slices": name},
        {"team": name},
        {"gpus": name},
        {"min_runtime": name},
        {"restore": name},
        {"fresh": name},
        {name: 1},
    ):
        error = _refusal(options)
        assert len(str(error)) < 300, (sorted(options), len(str(error)))
        assert "5000 characters" in str(error), str(error)


def test_shown_cuts_long_text_and_keeps_short_text() -> None:
    from spawner.profiles import shown

    assert shown("gpu") == "'gpu'"
    assert shown(4) == "4"
    cut = shown("y" * 5000)
    assert len(cut) < 150 and cut.endswith("(5000 characters)") and "y" * 80 in cut


def _hub_record(message: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord("JupyterHub", level, __file__, 1, message, (), None)


def test_the_hubs_not_starting_line_for_a_refusal_is_one_short_warning() -> None:
    """JupyterHub logs a SpawnException from ``start()`` at ERROR with its whole message
    (``user.py``); a 4xx is the user's input: one WARNING, the message cut short."""
    from spawner.logfilters import QuietRefusalFilter

    message = "Cannot start: profile: unknown profile '" + "x" * 5000 + "' (offered: debug)."
    for cls in ("SpawnException", "Refusal"):  # the Hub's class, and the spawner's
        record = _hub_record(f"Not starting ann's server : 400 {cls}(reason=form): {message}")
        assert QuietRefusalFilter().filter(record)
        assert record.levelno == logging.WARNING and record.levelname == "WARNING"
        line = record.getMessage()
        assert line.startswith(
            "Spawn refused (400, form) for ann's server '': Cannot start: profile"
        )
        assert len(line) < 300, len(line)
    for other in (
        "Not starting ann's server : 500 SpawnException(reason=launch): engine down",
        "Not starting ann's server gpu: 503 SpawnException(reason=scheduler): not running",
        "Unhandled error starting ann's server: boom",
    ):
        record = _hub_record(other)
        assert QuietRefusalFilter().filter(record)
        assert record.levelno == logging.ERROR and record.getMessage() == other

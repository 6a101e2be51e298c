"""docs/configuration.md is generated from the traits (spawner/hub/configdoc.py): it must be
what the generator prints now, and name every configurable trait and policy setting."""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path

import pytest

from scheduler_core.settings import Settings
from spawner.hub import configdoc
from spawner.hub.embedded import BudgetScheduler

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_page_is_what_the_traits_say() -> None:
    """Fails when a trait or setting changed and the page was not regenerated."""
    current = PAGE.read_text(encoding="utf-8")
    assert current == configdoc.render(), (
        f"docs/configuration.md is stale; regenerate it with: {configdoc.COMMAND}"
    )


def test_check_exits_1_on_a_stale_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "configuration.md"
    stale.write_text("old\n", encoding="utf-8")
    assert configdoc.main(["--check", str(stale)]) == 1
    assert "spawner.hub.configdoc > docs/configuration.md" in capsys.readouterr().err
    stale.write_text(configdoc.render(), encoding="utf-8")
    assert configdoc.main(["--check", str(stale)]) == 0


def test_every_config_trait_and_setting_appears() -> None:
    text = configdoc.render()
    for label, cls, _ in configdoc.CLASSES:
        assert f"## `c.{label}`" in text
        own = dict(configdoc.own_traits(cls))
        for name, trait in cls.class_traits(config=True).items():
            if name in own:
                assert f"| `{name}` |" in text, f"c.{label}.{name} is missing"
            else:  # inherited from JupyterHub: not budgethub's to document
                assert not trait.this_class.__module__.startswith("spawner"), name
    for field in dataclasses.fields(Settings):
        assert f"| `{field.name}` |" in text, f"setting {field.name} is missing"
    assert configdoc.own_traits(BudgetScheduler), "no trait found at all"


def test_trait_defaults_match_the_settings() -> None:
    """A setting's trait starts at the setting's default, so the two tables agree."""
    traits = BudgetScheduler.class_traits(config=True)
    for field in dataclasses.fields(Settings):
        name = "policy" if field.name == "name" else field.name
        if name not in traits:
            continue
        default = field.default
        if isinstance(default, enum.Enum):
            default = default.value
        assert traits[name].default_value == default, name

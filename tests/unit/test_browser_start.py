"""bench.browser_start's split of a start into phases, from the page's navigations."""

from __future__ import annotations

import pytest

from bench.browser_start import PHASES, Start, figures

URL = "http://127.0.0.1:8000"


def test_a_start_is_split_where_the_browser_moved_on() -> None:
    start = Start("ann", ready=16.0)
    for at, path in [
        (10.0, "/hub/spawn?_xsrf=x"),  # the form's POST: the clock starts here
        (11.0, "/hub/spawn-pending/ann?_xsrf=x"),
        (13.5, "/hub/spawn-pending/ann?_xsrf=x"),  # the ready event's reload
        (13.52, "/user/ann/"),
        (13.53, "/user/ann/lab?"),
        (13.55, "/hub/api/oauth2/authorize?client_id=jupyterhub-user-ann"),
        (13.6, "/user/ann/oauth_callback?code=c"),
        (13.7, "/user/ann/lab"),
    ]:
        start.marks.append((at, URL + path))
    phases = start.phases()
    assert list(phases) == list(PHASES)
    assert phases == pytest.approx({"post": 1.0, "server": 2.52, "login": 0.18, "lab": 2.3})
    assert sum(phases.values()) == pytest.approx(start.total) == pytest.approx(6.0)


def test_the_figures_are_the_lone_median_and_the_slowest_of_those_at_once() -> None:
    got = figures({"alone": [5.0, 7.0, 6.0], "together": [9.0, 12.0, 10.0, 11.0]})
    assert got == {"browser_start.alone_s": 6.0, "browser_start.together_s": 12.0}

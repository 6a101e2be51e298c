"""Policies by name: `register` adds one, `decide` runs the one a view's settings name.

The budget policy (policy/) and the baselines (baselines/) register themselves
when imported; importing `scheduler_core` imports them all. A policy is a pure
function ``(view, now) -> Decisions``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from scheduler_core.view import ClusterView, Decisions

__all__ = ["POLICIES", "Policy", "decide", "register"]

Policy = Callable[[ClusterView, float], Decisions]

POLICIES: dict[str, Policy] = {}
"""Policy name → decide function."""


_P = TypeVar("_P", bound=Policy)


def register(name: str) -> Callable[[_P], _P]:
    """Decorator: make the function the policy called ``name`` (its own signature kept,
    so a policy may take more, optional, arguments)."""

    def add(policy: _P) -> _P:
        POLICIES[name] = policy
        return policy

    return add


def decide(view: ClusterView, now: float) -> Decisions:
    """Run the policy the view's settings name."""
    try:
        policy = POLICIES[view.settings.name]
    except KeyError:
        known = ", ".join(sorted(POLICIES))
        raise ValueError(f"unknown policy {view.settings.name!r} (known: {known})") from None
    return policy(view, now)

"""Shape records: what one pool's pass already knows will not fit (R3) or find victims (R4).

Capacity only shrinks while a cycle places work, so a shape that did not fit keeps
not fitting, and so does any larger one; the records let a pass skip those
searches. They are dropped whenever room may have grown (a preemption, a hold that
ends), so they never change an answer, only its cost.
"""

from __future__ import annotations

from scheduler_core.kept import Shape

__all__ = ["Failures"]


class Failures:
    """Shapes that found no room this cycle, with the after-swap key they had.

    Capacity only shrinks while a cycle places work, so a shape that did not fit
    keeps not fitting, and so does any larger one; a preemption frees slices, and a
    hold that ends gives its nodes back to everyone, and both clear the record. For
    victim searches, a team whose key is no lower may preempt a subset of the
    sessions, so it fails as well. Answers are also
    remembered by shape number (`Queued.shape_id`), the common case of a queue
    holding many requests of one shape.
    """

    def __init__(self) -> None:
        self._seen: dict[tuple[object, ...], list[tuple[Shape, tuple[float, ...]]]] = {}
        self.exact: dict[int, tuple[float, ...]] = {}
        """Shape number → the lowest key at which that very shape is known to fail
        (read it directly for speed; it is only ever cleared in place)."""

    def add(self, shape: Shape, key: tuple[float, ...] = (), number: int | None = None) -> None:
        if not self.known(shape, key, number):
            self._seen.setdefault(shape.kind, []).append((shape, key))
            if number is not None:
                self.exact[number] = key

    def known(self, shape: Shape, key: tuple[float, ...] = (), number: int | None = None) -> bool:
        seen = self._seen
        if not seen:
            return False  # nothing failed since the last clear (``exact`` is empty too)
        at: tuple[float, ...] | None = None
        if number is not None:
            at = self.exact.get(number)
            if at is not None and key >= at:
                return True
        for failed, failed_at in seen.get(shape.kind, ()):
            if key >= failed_at and failed.covers(shape):
                if number is not None and (at is None or key < at):
                    self.exact[number] = key
                return True
        return False

    def clear(self) -> None:
        self._seen.clear()
        self.exact.clear()

"""bench.spawn prints each figure as it is measured, and --load-seconds 0 skips the
queued-load part (it used to crash at the end with `max() arg is an empty sequence`,
losing everything it had measured)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from harness import REPO


@pytest.mark.slow
def test_bench_spawn_prints_as_it_goes_and_can_skip_the_queued_load(engine):
    started = time.monotonic()
    command = [
        *(sys.executable, "-u", "-m", "bench.spawn"),
        *("--rounds", "1", "--users", "2", "--concurrent-rounds", "1"),
    ]
    arrived: list[tuple[float, str]] = []
    with subprocess.Popen(
        [*command, "--load-seconds", "0"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            arrived.append((time.monotonic() - started, line.rstrip()))
        assert process.wait(timeout=600) == 0, "\n".join(line for _, line in arrived)
    ended = time.monotonic() - started
    lines = [line for _, line in arrived]
    first = next(t for t, line in arrived if line.startswith("spawn round 1/1: budgethub"))
    assert ended - first > 5, arrived  # printed when measured, not at the end
    for figure in ("bare container", "2 at once, budget", "grant latency", "idle: p50"):
        assert any(figure in line for line in lines), (figure, lines)
    assert lines[-1] == "queued load skipped (--load-seconds 0)", lines
    assert not any("Traceback" in line for line in lines)

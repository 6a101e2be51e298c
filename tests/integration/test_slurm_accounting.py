"""Accounting on a real two-node cluster with slurmdbd over MariaDB (issue 48):
``AccountingStorageEnforce=associations``, each researcher's account in its team's Slurm
account. sacct shows every session under its user and its team's account."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from slurm_fixtures import ACCOUNTS, GROUPS, cluster_up, job_of, start

from harness.hub import wait_for
from harness.slurm import SlurmCluster


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    accounts = {team: [ACCOUNTS[u] for u in users] + ["root"] for team, users in GROUPS.items()}
    accounts["physics"] = ["bhsession", "root"]
    yield from cluster_up(accounts=accounts)


def test_sacct_shows_each_session_under_its_user_and_its_teams_account(slurm_hub, slurm):
    hub = slurm_hub()
    start(hub, "ann")
    start(hub, "gus")
    jobs = {user: job_of(slurm, user)["id"] for user in ("ann", "gus")}

    def accounted() -> dict[str, str]:
        out = slurm.run(
            "sacct", "-X", "-n", "-P", "-o", "JobID,User,Account", "-j", ",".join(jobs.values())
        )
        return {line.split("|")[0]: line for line in out.splitlines()}

    wait_for(lambda: len(accounted()) == 2, 30, "sacct to list both sessions")
    rows = accounted()
    assert rows[jobs["ann"]] == f"{jobs['ann']}|bhann|nlp", rows
    assert rows[jobs["gus"]] == f"{jobs['gus']}|bhgus|guests", rows

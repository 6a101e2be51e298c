"""The session's agent as the Hub sees it: idleness reports and a Hub restart.

Agents report whether their kernels are busy (``idle_poll``), and the idle session is
the victim rather than the newer busy one. After a Hub restart (sessions outlive it) the
agent's secret comes back with the spawner's state, so a preemption still checkpoints.
"""

from __future__ import annotations

from pathlib import Path

from snapshot_fixtures import activity, preempt, snapshot_hub, start

from harness.hub import containers, wait_for
from harness.kernels import Server
from harness.nodes import local_gpu_node


def test_agents_report_idleness_and_the_idle_session_is_the_victim(make_hub, tmp_path: Path):
    hub = snapshot_hub(make_hub, tmp_path, [local_gpu_node(gpus=2)], idle_poll=1.0)
    start(hub, "gus")  # the older session: more work to lose, but idle
    with Server(hub, "gus").open("idle.ipynb") as idle:
        assert idle.run("x = 1").error is None
    start(hub, "bo")
    busy = Server(hub, "bo").open("busy.ipynb")
    busy.submit("import time\ntime.sleep(600)")
    requests_of = {
        c.labels["org.budgethub.user"]: c.labels["org.budgethub.request"]
        for c in containers(hub.hub_name)
    }

    def reported() -> bool:
        seen = activity(hub)
        gus, bo = seen.get(requests_of["gus"]), seen.get(requests_of["bo"])
        return bool(gus and not gus["busy"] and gus["idle_since"] and bo and bo["busy"])

    wait_for(reported, 30, "the agents' activity to be recorded")
    snapshot = preempt(hub, victim="gus")  # the idle one goes, not the newer busy one
    assert hub.server_model("bo") is not None
    assert snapshot.report["kernel_state"] == "saved"
    busy.close()
    hub.stop_server("bo")
    hub.stop_server("ann")


def test_after_a_hub_restart_the_preemption_still_checkpoints(make_hub, tmp_path: Path):
    hub = snapshot_hub(make_hub, tmp_path, [local_gpu_node(gpus=1)])
    start(hub, "gus")
    with Server(hub, "gus").open("a.ipynb") as kernel:
        assert kernel.run("kept = 'across the restart'").error is None
    hub.stop()  # sessions outlive the Hub (cleanup_servers = False)
    hub.start()
    hub.wait_ready("gus")
    snapshot = preempt(hub)  # the agent's secret came back with the spawner's state
    assert snapshot.report["kernel_state"] == "saved", snapshot.report
    assert "a.ipynb:kept" in snapshot.saved
    hub.stop_server("ann")

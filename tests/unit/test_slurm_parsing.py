"""What the Slurm runtime reads from Slurm's commands and what it writes into a job, without
a cluster (the integration tests run the same code against a real one)."""

from __future__ import annotations

import json

import pytest

from scheduler_core.model import NodeGrant, Slice, SliceKind
from spawner.runtime.dockernodes import EngineConfig
from spawner.runtime.interface import Answer
from spawner.runtime.slurm import (
    GresEntry,
    SlurmConfigError,
    SlurmGpu,
    SlurmPartition,
    SlurmRuntime,
    SlurmSettings,
    comment,
    job_row,
    max_time,
    mig_profile,
    node_gpus,
    node_health,
    parse_accounts,
    parse_gres,
    parse_partitions,
    parse_record,
    slurm_seconds,
    slurm_time,
)
from spawner.runtime.spec import SessionIdentity, build_launch_spec


def test_a_record_keeps_values_with_spaces():
    line = (
        "NodeName=bhs1 Arch=x86_64 State=IDLE+DRAIN Gres=gpu:g0:1,gpu:g1:1 NodeAddr=10.0.0.2 "
        "Reason=disk swap [root@2026-12-06T03:06:21] CfgTRES=cpu=4,mem=8G"
    )
    record = parse_record(line)
    assert record["NodeName"] == "bhs1" and record["State"] == "IDLE+DRAIN"
    assert record["Reason"] == "disk swap [root@2026-12-06T03:06:21]"
    assert record["CfgTRES"] == "cpu=4,mem=8G"


@pytest.mark.parametrize(
    ("text", "entries"),
    [
        ("gpu:g0:1,gpu:g1:1", [GresEntry("gpu", "g0", 1), GresEntry("gpu", "g1", 1)]),
        ("gpu:a100:4(S:0-1)", [GresEntry("gpu", "a100", 4)]),
        ("gpu:2", [GresEntry("gpu", "", 2)]),
        ("gpu:h100:2(S:0),nic:1", [GresEntry("gpu", "h100", 2), GresEntry("nic", "", 1)]),
        ("(null)", []),
        ("", []),
    ],
)
def test_gres_lists(text, entries):
    assert parse_gres(text) == entries


@pytest.mark.parametrize(
    ("state", "answer"),
    [
        ("IDLE", Answer.OK),
        ("MIXED", Answer.OK),
        ("ALLOCATED", Answer.OK),
        ("IDLE+DRAIN", Answer.DRAINING),
        ("MIXED+DRAIN", Answer.DRAINING),
        ("DOWN", Answer.DOWN),
        ("DOWN+DRAIN", Answer.DOWN),
        ("IDLE*", Answer.TIMEOUT),
        ("DOWN*", Answer.TIMEOUT),
        ("IDLE+NOT_RESPONDING", Answer.TIMEOUT),
    ],
)
def test_node_states(state, answer):
    assert node_health(state) is answer


def test_a_job_row_carries_the_labels_of_its_comment():
    labels = {"org.budgethub.request": "ann//1", "org.budgethub.hub": "h"}
    row = job_row(f"12|RUNNING|None|bhs1|bhs1|{json.dumps(labels)}")
    assert row is not None and row.id == "12" and row.state == "RUNNING"
    assert row.labels == labels
    foreign = job_row("13|PENDING|Resources|||(null)")
    assert foreign is not None and foreign.labels == {}
    assert job_row("garbage") is None


POOLS = {"gpu": object(), "cpu": object()}


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ([], "slurm_partitions"),
        ({"tpu": "x"}, "slurm_partitions.tpu"),
        ({"gpu": 3}, "slurm_partitions.gpu"),
        ({"gpu": {"partition": ""}}, "slurm_partitions.gpu.partition"),
        ({"gpu": {"partition": "p", "gres": ""}}, "slurm_partitions.gpu.gres"),
        ({"gpu": {"partition": "p", "nodes": "n1"}}, "slurm_partitions.gpu.nodes"),
        ({"gpu": {"partition": "p", "colour": "red"}}, "slurm_partitions.gpu.colour"),
    ],
)
def test_bad_partition_settings_name_their_key(raw, key):
    with pytest.raises(SlurmConfigError) as error:
        parse_partitions(raw, POOLS)
    assert error.value.key == key


def runtime() -> SlurmRuntime:
    settings = SlurmSettings(session_env="/shared/env", time_limit="1-00:00:00")
    partition = SlurmPartition("gpu", settings, "hub")
    gpus = {
        "slurm:bhs2:0": SlurmGpu("gpu:g0:1", "gpu:g0:1", 0),
        "slurm:bhs2:1": SlurmGpu("gpu:g1:1", "gpu:g1:1", 1),
    }
    return SlurmRuntime(EngineConfig(node="bhs2", address="10.0.0.6"), partition, gpus)


def spec(*slices: Slice, restore: str | None = None):
    identity = SessionIdentity("ann", "", "ann//1", "nlp", "notebook", "hub")
    grant = NodeGrant("bhs2", slices, 1.5, 2.0)
    return build_launch_spec(
        identity,
        "budgethub/base:latest",
        grant,
        hub_env={"JUPYTERHUB_API_TOKEN": "s3cret 'quoted'"},
        port=61001,
        ip="10.0.0.6",
        nvidia=False,
        home="/shared/homes/hub/ann",
        restore_dir=restore,
        extra_env={"BUDGETHUB_STATE_DIR": "/home/jovyan/.budgethub/servers/default"},
    )


def whole(index: int) -> Slice:
    return Slice(f"slurm:bhs2:{index}", SliceKind.WHOLE, 1000)


def test_a_session_becomes_a_job_pinned_to_its_node_and_gpus():
    script, options = runtime().job_script(spec(whole(1), restore="/shared/snaps/k"))
    assert "--nodelist=bhs2" in options and "--partition=gpu" in options
    assert "--gres=gpu:g1:1" in options
    assert "--cpus-per-task=2" in options and "--mem=2048M" in options
    assert "--time=1-00:00:00" in options and "--export=NONE" in options
    comment = next(o for o in options if o.startswith("--comment="))
    labels = json.loads(comment.split("=", 1)[1])
    assert labels["org.budgethub.request"] == "ann//1"
    assert labels["org.budgethub.node"] == "bhs2"
    # Paths as the node sees them; Slurm, not the script, names the GPU.
    assert "export HOME=/shared/homes/hub/ann" in script
    assert "BUDGETHUB_STATE_DIR=/shared/homes/hub/ann/.budgethub/servers/default" in script
    assert "BUDGETHUB_RESTORE_DIR=/shared/snaps/k" in script
    assert "CUDA_VISIBLE_DEVICES" not in script
    assert "export JUPYTERHUB_API_TOKEN='s3cret '\"'\"'quoted'\"'\"''" in script
    assert "exec /shared/env/bin/jupyterhub-singleuser --ip=10.0.0.6 --port=61001" in script
    assert "--ServerApp.root_dir=/shared/homes/hub/ann" in script


def test_a_fraction_asks_slurm_for_no_gres_and_names_its_gpu():
    fraction = Slice("slurm:bhs2:1", SliceKind.FRACTION, 250)
    script, options = runtime().job_script(spec(fraction))
    assert not any(o.startswith("--gres") for o in options)
    assert "export CUDA_VISIBLE_DEVICES=1" in script


def test_a_gpu_slurm_does_not_have_is_refused():
    with pytest.raises(RuntimeError, match="Slurm has no GPU"):
        runtime().job_script(spec(whole(7)))


def test_a_job_carries_its_teams_account_and_the_qos():
    script, options = runtime().job_script(spec(whole(1)))
    assert "--account=nlp" in options and not any(o.startswith("--qos") for o in options)
    settings = SlurmSettings(accounts={"nlp": "nlp-lab"}, qos="interactive")
    mapped = SlurmRuntime(
        EngineConfig(node="bhs2", address="10.0.0.6"),
        SlurmPartition("gpu", settings, "hub"),
        runtime().gpus,
    )
    _, options = mapped.job_script(spec(whole(1)))
    assert "--account=nlp-lab" in options and "--qos=interactive" in options


@pytest.mark.parametrize("raw", [[], {"nlp": 3}, {"nlp": "two words"}])
def test_bad_accounts_name_their_key(raw):
    with pytest.raises(SlurmConfigError) as error:
        parse_accounts(raw)
    assert error.value.key.startswith("slurm_accounts")


def test_gpus_of_a_type_that_counts_several_are_asked_for_by_count():
    settings = SlurmSettings(session_env="/shared/env")
    gpus = {f"slurm:bhs2:{i}": SlurmGpu(None, "gpu:h100:1", i) for i in range(2)}
    counted = SlurmRuntime(
        EngineConfig(node="bhs2", address="10.0.0.6"), SlurmPartition("gpu", settings, "hub"), gpus
    )
    _, options = counted.job_script(spec(whole(0), whole(1)))
    assert "--gres=gpu:h100:2" in options
    _, options = runtime().job_script(spec(whole(0), whole(1)))
    assert "--gres=gpu:g0:1,gpu:g1:1" in options


def test_a_comment_is_one_field_whatever_its_labels_hold():
    text = comment({"org.budgethub.profile": "GPU notebook", "b": 'x"y'})
    assert " " not in text and json.loads(text)["org.budgethub.profile"] == "GPU notebook"


def test_a_fraction_holds_shards_where_the_node_has_them():
    gpus, binding = node_gpus(
        "bhs2", parse_gres("gpu:fake:2"), parse_gres("gpu:fake:2,shard:fake:200")
    )
    assert [g.index for g in gpus] == [0, 1]
    assert binding["slurm:bhs2:1"] == SlurmGpu(None, "gpu:fake:1", 1, 100, "shard:fake")
    settings = SlurmSettings(session_env="/shared/env")
    sharded = SlurmRuntime(
        EngineConfig(node="bhs2", address="10.0.0.6"),
        SlurmPartition("gpu", settings, "hub"),
        binding,
    )
    fraction = Slice("slurm:bhs2:1", SliceKind.FRACTION, 250)
    script, options = sharded.job_script(spec(fraction, whole(0)))
    assert "--gres=shard:fake:25,gpu:fake:1" in options
    assert "CUDA_VISIBLE_DEVICES" not in script  # Slurm names the GPU it shares


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("UNLIMITED", None),
        ("INFINITE", None),
        ("90", 5400.0),
        ("01:30", 90.0),
        ("09:00:00", 32400.0),
        ("7-00:00:00", 604800.0),
        ("1-12", 129600.0),
        ("2-01:30", 178200.0),
    ],
)
def test_slurm_times(text, seconds):
    assert slurm_seconds(text) == seconds
    if seconds is not None and seconds % 60 == 0:
        assert slurm_seconds(slurm_time(seconds)) == seconds


def test_a_session_never_asks_for_more_than_the_partitions_maxtime():
    rt = runtime()
    assert rt.partition.time_limit() == "1-00:00:00"
    rt.partition.max_time = 9 * 3600.0
    _, options = rt.job_script(spec(whole(1)))
    assert "--time=0-09:00:00" in options
    config = parse_partitions({"gpu": "gpu"}, POOLS)[0]
    assert max_time(config, {"MaxTime": "UNLIMITED"}, 8 * 3600.0) is None
    with pytest.raises(SlurmConfigError) as error:
        max_time(config, {"MaxTime": "01:00:00"}, 8 * 3600.0)
    assert error.value.key == "slurm_partitions.gpu.partition"
    assert "below max_min_runtime (0-08:00:00)" in error.value.reason


def test_mig_instances_as_autodetect_declares_them_are_budgethubs_mig_slices():
    assert mig_profile("1g.10gb") == "1g.10gb" and mig_profile("a100_3g.20gb") == "3g.20gb"
    assert mig_profile("nvidia_h100_80gb_hbm3_1g.10gb") == "1g.10gb"
    assert mig_profile("a100") is None and mig_profile("9g.90gb") is None  # 7 slices at most
    gres = parse_gres("gpu:fake:1,gpu:1g.10gb:2,gpu:2g.20gb:1,gpu:3g.40gb:2")
    gpus, binding = node_gpus("bhs1", gres, gres)
    whole_gpu, first, second = gpus  # 1+1+2+3 compute slices on one GPU, 3 on another
    assert (whole_gpu.index, whole_gpu.mig) == (0, ())
    assert [(m.uuid, m.profile) for m in first.mig] == [
        ("slurm:bhs1:1", "1g.10gb"),
        ("slurm:bhs1:2", "1g.10gb"),
        ("slurm:bhs1:3", "2g.20gb"),
        ("slurm:bhs1:4", "3g.40gb"),
    ]
    assert [m.uuid for m in second.mig] == ["slurm:bhs1:5"]  # Slurm's IDX, in its order
    assert binding["slurm:bhs1:3"] == SlurmGpu(None, "gpu:2g.20gb:1", 3)
    settings = SlurmSettings(session_env="/shared/env")
    node = SlurmRuntime(
        EngineConfig(node="bhs1", address="10.0.0.2"), SlurmPartition("gpu", settings, "h"), binding
    )
    mig = Slice(first.uuid, SliceKind.MIG, mig_uuid="slurm:bhs1:2", mig_profile="1g.10gb")
    _, options = node.job_script(spec(mig))
    assert "--gres=gpu:1g.10gb:1" in options  # by type: Slurm picks the instance

"""A Redis behind three Sentinels loses its primary mid-run: the replica is promoted, every program (the CPU worker,
two GPU workers, the enqueue command waiting for the run) finds the new primary by itself, and the run ends with
every video done or quarantined, no stage run twice and the statistics of a run without the fault.

The kinds of loss: the primary killed (SIGKILL); killed with the replica a second and a half behind (the writes the
primary acknowledged then are gone: claims, done marks, counts, messages); killed and started again, when it must
come back as a replica; and cut off (SIGSTOP) while the Sentinels promote the replica, then back (SIGCONT) still
believing itself the primary until a Sentinel turns it into a replica."""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.redis_client import connect
from tests.conftest import Workers, enqueue_and_watch, settings_env, wait_until
from tests.faults.conftest import assert_nothing_lost, env_for, record, stage_runs, twice
from tests.redis_servers import SentinelGroup

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# 4 s of depth per video, waited rather than computed: the primary goes while videos are mid-stage.
SLOW = "stages:\n  depth:\n    params: {seconds_per_frame: 0.25}\n"
# How long the replica is cut off from the primary before the primary dies, in the "behind" case: longer than a
# depth stage, so a stage's end (its done mark, its ack, the next stage's message, the counts) is among the writes
# the primary acknowledged and the promoted replica never had.
LAG_S = 6.0


@pytest.fixture
def group() -> Iterator[SentinelGroup]:
    folder = Path(tempfile.mkdtemp(prefix="ff-sentinel-"))
    group = SentinelGroup(folder)
    try:
        yield group  # started by the test
    finally:
        group.stop()
        shutil.rmtree(folder, ignore_errors=True)


def _promoted(group: SentinelGroup, old: int) -> int | None:
    port = group.primary_port()
    return port if port not in (None, old) and group.role(port) == ("master", "") else None


@pytest.mark.parametrize(
    "loss",
    [pytest.param("killed", marks=pytest.mark.ci_fault), "behind", "back", "cut-off"],
)
def test_the_primary_lost_mid_run_loses_nothing(loss, group, fault_raw, reference_stats, tmp_path):
    group.start()
    env = {**env_for(group.url), **settings_env(tmp_path, SLOW)}
    workers = Workers(env, tmp_path / "logs")
    out = tmp_path / "out"
    watcher = None
    try:
        for queue in ("cpu", "gpu0", "gpu1"):
            workers.start(queue, wait=False)
        for queue in ("cpu", "gpu0", "gpu1"):
            wait_until(lambda q=queue: workers.state(q) or workers.procs[q].poll() is not None, 90, f"{queue} up")
        watcher = enqueue_and_watch(fault_raw, out, env)
        wait_until(lambda: len(list(out.glob("work/*/depth.done.json"))) >= 1, 180, "the run to be under way")
        old, replica = group.primary_port(), group.ports[1]
        assert old == group.ports[0]
        lost_bytes = 0
        if loss == "behind":
            group.cut_replicas(old)  # the replica takes nothing more from the primary ...
            time.sleep(LAG_S)  # ... while the primary acknowledges the run's writes
            lost_bytes = _offset(group, old, "master_repl_offset") - _offset(group, replica, "slave_repl_offset")
            assert lost_bytes > 0
        offset_at_loss = _offset(group, old, "master_repl_offset")
        lost_at = time.time()
        group.kill(old, signal.SIGSTOP if loss == "cut-off" else signal.SIGKILL)
        wait_until(lambda: _promoted(group, old), 60, "the Sentinels to promote the replica", poll_s=0.2)
        promoted_s = time.time() - lost_at
        if loss == "back":
            group.start_server(old)  # as it was configured: a primary, with its own append-only file
        taken_bytes = 0
        if loss == "cut-off":
            group.kill(old, signal.SIGCONT)
            # Back, it is a primary until a Sentinel says otherwise, and runs what its clients sent it meanwhile:
            # writes that the new primary never sees (and that it drops itself once it replicates the new one).
            replication = group.client(old).info("replication")
            if replication["role"] == "master":
                taken_bytes = int(replication["master_repl_offset"]) - offset_at_loss
        if loss in ("back", "cut-off"):
            wait_until(lambda: group.role(old) == ("slave", "up"), 60, "the old primary to become a replica")
        output, _ = watcher.communicate(timeout=400)
        assert watcher.returncode == 0, output[-3000:]
        summary = json.loads((out / "run_summary.json").read_text())
        assert summary["done"] + len(summary.get("quarantined", [])) == 4, summary
        assert twice(workers.logs) == {}, twice(workers.logs)
        assert len(stage_runs(workers.logs)) == 4 * 5
        assert_nothing_lost(out, reference_stats)
        # Every worker reconnected by itself: alive, and heartbeating on the new primary.
        assert all(p.poll() is None for p in workers.procs.values())
        names = {f"ff:worker:{q}@test" for q in ("cpu", "gpu0", "gpu1")}
        wait_until(lambda: names <= _names(group), 30, "every worker's heartbeat on the new primary")
        record(
            f"Sentinel failover: primary {loss}",
            f"primary lost, replica promoted in {promoted_s:.1f} s"
            + (f", {lost_bytes} bytes of acknowledged writes lost ({LAG_S:.0f} s)" if lost_bytes else "")
            + (f", {taken_bytes} bytes written to the old primary once back" if loss == "cut-off" else "")
            + f"; {_recoveries(workers.logs)}",
            out,
            reference_stats,
            summary["finished"] - lost_at,
            workers.logs,
        )
    finally:
        if watcher and watcher.poll() is None:
            watcher.kill()
        workers.stop_all()


def _offset(group: SentinelGroup, port: int, field: str) -> int:
    return int(group.client(port).info("replication")[field])


def _names(group: SentinelGroup) -> set[str]:
    return set(connect(group.url, decode_responses=True).keys("ff:worker:*"))


def _recoveries(logs: Path) -> str:
    """What the workers put back after the loss, counted from their logs."""
    text = "".join(p.read_text(errors="replace") for p in logs.glob("*.log"))
    restored, requeued = text.count("restored the unacked entry"), text.count("] requeued message ")
    return f"unacked entries restored by their holders: {restored}, messages requeued by the reaper: {requeued}"

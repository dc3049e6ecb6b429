"""Every Redis key framefleet writes, named once (``ff:`` prefix; Celery's and kombu's own keys are theirs).

Per-item keys are a prefix plus an id; the modules that own the data build them. Who reads each
key, its size per video and its lifetime: docs/redis-keys.md.
"""

from __future__ import annotations

# liveness and ownership (tasks.workers.registry, tasks.delivery.leases, tasks.delivery.claims)
WORKER_PREFIX = "ff:worker:"  # + hostname: a worker's published state, with a TTL
WORKER_SEEN = "ff:worker-seen"  # hash hostname -> when its state was last published (unix s)
GPU_QUEUES = "ff:gpu-queues"  # set of every GPU queue a worker ever consumed
LEASE_PREFIX = "ff:lease:"  # + delivery tag: the in-flight message's lease
LEASE_OWNER_PREFIX = "ff:lease-owner:"  # + delivery tag: "hostname task_id", kept past the lease
ORPHAN_PREFIX = "ff:orphan:"  # + delivery tag: when the reaper first saw it with no lease and no owner
REAPER_LOCK = "ff:reaper-lock"
CLAIM_PREFIX = "ff:claim:"  # + root hash:video:stage: one live run of a video's stage
REBALANCE_LOCK = "ff:rebalance-lock"
WRITE_PROBE = "ff:write-probe"  # set for a second by a starting worker: does Redis take writes? (tasks.redis_refusal)
BELL_PREFIX = "ff:bell:"  # + queue: the doorbell workers block on; publishers ring it (tasks.delivery.transport)

# runs, results and records (tasks.observe.progress, tasks.records.quarantine, tasks.pipeline.oom,
# tasks.observe.metrics)
RUN_PREFIX = "ff:run:"  # + run id: the run's one lasting hash: per-stage counters and the fields below
RUN_RECORD_FIELD = "record"  # the run's record (its OUT, callback id), for status and cancel (tasks.run.runs)
RUN_AGGREGATED_FIELD = "aggregated"  # set NX once, by the task that sends the statistics callback
RUN_ENDED_FIELD = "ended"  # when the callback wrote the run's files: a task of the run arriving now is a duplicate
RUNS = "ff:runs"  # sorted set run id -> start time: the newest runs, without a scan of every key
RUNS_SENDING = "ff:runs-sending"  # set of run ids with a sent hash: the sweep's runs, without a scan (tasks.run.sweep)
# + run id + one of these: what a live run needs per video, gone soon after its files are written
RUN_TALLY_SUFFIX = ":tally"  # hash: the run's counters (videos finished, done, stage times in ms; tasks.run.tally)
RUN_FAILED_SUFFIX = ":failed"  # hash video id -> the failure record of a video of the run that failed
RUN_FINISHED_SUFFIX = ":finished"  # an earlier version's hash video id -> outcome, deflated (read at the run's end)
RUN_OUTCOME_DICT_SUFFIX = ":outcome-dict"  # an earlier version's: the first outcome, the others deflated against it
RUN_ORDER_SUFFIX = ":order"  # + ":" + shard: hash video mark (8 B) -> k: it was the k-th video to finish
RUN_PENDING_SUFFIX = ":pending"  # hash: the shared job, chunks of videos not sent yet (tasks.run.pending)
RUN_PENDING_SENT_SUFFIX = ":pending-sent"  # bitmap: bit i set once pending video i was sent
RUN_SENT_SUFFIX = ":sent"  # hash video id -> the job of a video sent (its chain began; tasks.run.sweep)
# + ":" + shard: set of 8-byte marks of finished task ids (a late duplicate is dropped; tasks.delivery.marks)
RUN_DONE_SUFFIX = ":done"
RUN_ATTEMPTS_SUFFIX = ":attempts"  # hash task id -> how many times it started, until it is done
RUN_STAGES_SUFFIX = ":stages"  # list of the run's stage spans (the report's and status's source)
RUN_SUMS_SUFFIX = ":sums"  # hash: the run's partial statistics merged so far, per track type (tasks.statistics.sums)
RUN_MERGED_SUFFIX = ":merged"  # + ":" + shard: hash video mark -> its file's stamp, once merged (tasks.statistics.sums)
PARTIALS_PREFIX = (
    "ff:partials:"  # + output-root hash: hash video id -> its partial statistics (tasks.statistics.partials)
)
QUARANTINED = "ff:quarantined"  # hash output-root hash -> how many videos OUT/quarantine.jsonl holds
OOM_LOG = "ff:oom"  # list of out-of-memory records, newest first
RUN_INFO_PREFIX = "ff:runinfo:"  # + run id: where an earlier version kept the run's record (read only)
LEGACY_STAGE_LOG = "ff:stages"  # an earlier version's global stage log, never expired: deleted at a run's end
LEGACY_QUARANTINE_PREFIX = "ff:quarantine:"  # + root hash: an earlier version's copy of a root's quarantine
CANCELLED_PREFIX = "ff:cancelled:"  # + run id: the run was cancelled (framefleet cancel)
OUT_LOCK_PREFIX = "ff:out:"  # + OUT's real path: the one live run holding that output folder (tasks.run.hold)
OUT_BEAT_PREFIX = "ff:out-beat:"  # + run id: its enqueuer is still sending it (a TTL of seconds; tasks.run.hold)
# set of the settings queues routing has sent to (worker_config.settings_match.settings_queue): where a task waits
# for a worker with its run's settings; read by the stall report, the sweep, the rebalancer and the autoscaler
SETTINGS_QUEUES = "ff:settings-queues"
REQUEUES_PREFIX = "ff:requeues:"  # + run id: list of requeues after a lost worker (tasks.delivery.requeues)
RESENT_PREFIX = "ff:resent:"  # + run id: list of videos the sweep sent again, with stage and time (tasks.run.sweep)
SWEEP_PREFIX = "ff:sweep:"  # + run id: hash video id -> when a sweep first found it nowhere (tasks.run.sweep)
SWEEP_LOCK = "ff:sweep-lock"  # held by the one sweep running across all hosts (tasks.run.sweep)
METRIC_COUNTS = "ff:metrics:counts"
METRIC_DURATIONS = "ff:metrics:stage-seconds"

# the autoscaler (tasks.autoscaler)
PROFILES = "ff:profiles"  # hash profile key -> learned peak
AUTOSCALE_LOG = "ff:autoscale"  # list of the autoscaler's decisions

"""Every Redis key framefleet writes, named once (``ff:`` prefix; Celery's and kombu's own keys are theirs).

Per-item keys are a prefix plus an id; the modules that own the data build them. TTLs are
the owners' business and are documented there.
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
DONE_PREFIX = "ff:done:"  # + task id: that task finished (a late duplicate is dropped)
ATTEMPTS_PREFIX = "ff:attempts:"  # + task id: how many times it started
REBALANCE_LOCK = "ff:rebalance-lock"

# runs, results and records (tasks.observe.progress, tasks.run.quarantine, tasks.pipeline.oom, tasks.observe.metrics)
RUN_PREFIX = "ff:run:"  # + run id: per-stage done/failed counters
# + run id + one of these (tasks.run.completion): the run's completion counter and its enqueue window
RUN_FINISHED_SUFFIX = ":finished"  # hash video id -> the video's outcome (its count: HLEN)
RUN_ORDER_SUFFIX = ":order"  # hash video id -> k: it was the k-th video to finish
RUN_PENDING_SUFFIX = ":pending"  # hash i -> the job of a video not sent yet (beyond the window)
RUN_AGGREGATED_SUFFIX = ":aggregated"  # set NX once, by the task that sends the statistics callback
PARTIALS_PREFIX = "ff:partials:"  # + output-root hash: hash video id -> its partial statistics (tasks.run.partials)
QUARANTINE_PREFIX = "ff:quarantine:"  # + output-root hash: the quarantined videos of that root
OOM_LOG = "ff:oom"  # list of out-of-memory records, newest first
STAGE_LOG = "ff:stages"  # list of stage spans (the report's source)
RUN_INFO_PREFIX = "ff:runinfo:"  # + run id: the run's record (its OUT, callback id), for status and cancel
CANCELLED_PREFIX = "ff:cancelled:"  # + run id: the run was cancelled (framefleet cancel)
# + run id + ":" + stage: a worker sent the run's stage on, having other settings (tasks.pipeline.same_settings)
SETTINGS_WAIT_PREFIX = "ff:settings-wait:"
REQUEUES_PREFIX = "ff:requeues:"  # + run id: list of requeues after a lost worker (tasks.delivery.requeues)
METRIC_COUNTS = "ff:metrics:counts"
METRIC_DURATIONS = "ff:metrics:stage-seconds"

# the autoscaler (tasks.autoscaler)
PROFILES = "ff:profiles"  # hash profile key -> learned peak
AUTOSCALE_LOG = "ff:autoscale"  # list of the autoscaler's decisions

"""Run a whole framefleet cluster on this machine for one dataset, then tear it down.

    framefleet run RAW_DIR --out OUT [--continue | --force] [--gpus 0,1] [--intermediates keep|drop] [--serve]
                   [--metadata FILE] [--require-text]

Uses $REDIS_URL when it answers, else a private redis-server on a free port of 127.0.0.1 with a
random password (its URL in OUT/logs/redis-auth.txt, mode 0600; every process of the run gets it
through its environment); starts one solo
worker per visible GPU and one solo CPU worker per core (without a GPU: one worker per core,
each hosting every stage, its models on the CPU), all supervised (a recycled or crashed worker
is replaced), Flower and the metrics exporter on 127.0.0.1. Flower's basic auth comes from
$FLOWER_BASIC_AUTH (user:password); without it a random password is made for this run and
written to OUT/logs/flower-auth.txt (mode 0600). Each run's logs are in OUT/logs/; the previous
run's move to OUT/logs/previous/. With --serve, Flower and the metrics stay up after the run until Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import redis

from tasks.autoscaler.supervisor import CPU_GROUP, Slot, Supervisor, cpu_worker_count, worker_argv
from tasks.cli import common as _cli
from tasks.cli import install_backends
from tasks.cli.common import parse_gpus
from tasks.cli.enqueue import (
    add_run_arguments,
    check_run_arguments,
    enqueue,
    follow,
    nothing_left,
    nothing_to_do,
    resender,
)
from tasks.cli.local_auth import REDIS_FILE, SECRET_FILES, flower_auth, redis_config, redis_url, write_secret
from tasks.cli.shutdown import Hurry
from tasks.gpu import open_probe
from tasks.observe.metrics import GpuSampler, start_exporter
from tasks.outputs import remote
from tasks.redis_client import free_port, get_redis, server_argv
from tasks.redis_refusal import write_refused
from tasks.run.dataset import DatasetError
from tasks.run.metadata import MetadataError
from tasks.workers import confinement, registry
from worker_config.settings import Settings, redact_url


def visible_gpus() -> int:
    """Count GPUs through NVML without touching CUDA; 0 when there is no NVML or no GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0


STAND_IN_MIB = 1024  # host memory a CPU stand-in for a GPU worker may take (synthetic models: ~350 MiB RSS)


def host_cores() -> int:
    return len(os.sched_getaffinity(0))


def available_mib() -> float:
    """MemAvailable of /proc/meminfo in MiB (infinity where it cannot be read)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("inf")


def stand_in_workers(cores: int, free_mib: float) -> int:
    """How many CPU stand-ins for gpu0 to start: one per core, as far as host memory allows, at least one."""
    return max(1, min(cores, int(free_mib // STAND_IN_MIB)))


def shares_cpu_queue(conf: Settings, args: argparse.Namespace) -> bool:
    """Whether a host without a GPU runs workers that consume gpu0 and cpu both (the default there).

    Not when a count of either kind is asked for, nor when a stage has an environment of its own
    (its worker can host that stage only).
    """
    return not (args.gpu_workers or args.cpu_workers or conf.own_env_stages()) and bool(conf.hosted_stages())


class Cluster:
    """The processes of a local run; ``stop`` ends every one of them, whatever state they are in."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.tmp: Path | None = None

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = open(self.logs / f"{name}.log", "ab")  # appended: a restarted process keeps its history
        proc = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        self.procs.append((name, proc))
        return proc

    def start_redis(self) -> str:
        if shutil.which("redis-server") is None:
            raise DatasetError(
                "no reachable Redis and no redis-server to start: install Redis "
                "(apt install redis-server) or set REDIS_URL"
            )
        self.tmp = Path(tempfile.mkdtemp(prefix="framefleet-redis-"))  # mode 0700: its files are this user's
        port = free_port()
        config, password = redis_config(self.tmp)
        self.start("redis", server_argv(port, self.tmp, config=config), dict(os.environ))
        url = redis_url(port, password)
        write_secret(self.logs / REDIS_FILE, url)  # for `framefleet status` and redis-cli while the run lasts
        client = redis.Redis.from_url(url)
        for _ in range(100):
            try:
                client.ping()
                return url
            except redis.ConnectionError:
                time.sleep(0.05)
        raise DatasetError(f"the private redis-server did not answer; see {self.logs / 'redis.log'}")

    def wait_for_workers(
        self, conf: Settings, names: list[str], timeout_s: float = 120, supervisor: Supervisor | None = None
    ) -> None:
        """Wait until every worker has loaded its models and registered, or one has failed to start
        START_ATTEMPTS times in a row (a supervised worker that exits while starting is restarted, as any other),
        or an unsupervised process has exited."""
        r = get_redis(conf.redis_url)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            live = {w["hostname"].split("@")[0] for w in registry.live_workers(r)}
            if set(names) <= live:
                return
            for slot in supervisor.slots if supervisor else []:
                if slot.name not in live and cannot_start(slot):
                    log = self.logs / (slot.name + ".log")
                    raise DatasetError(f"worker {slot.name} cannot start: {own_words(log)} (its log: {log})")
                if slot.failures >= START_ATTEMPTS and slot.name not in live:
                    raise DatasetError(
                        f"worker {slot.name} failed to start {slot.failures} times (last: {slot.last_exit}); "
                        f"see {self.logs / (slot.name + '.log')}"
                    )
            for name, proc in self.procs:
                if proc.poll() is not None:
                    raise DatasetError(
                        f"the {name} process exited ({proc.returncode}); see {self.logs / (name + '.log')}"
                    )
            time.sleep(0.2)
        raise DatasetError(f"workers {names} did not register within {timeout_s:.0f} s; see {self.logs}")

    def terminate(self) -> None:
        """Ask every process but Redis to stop (SIGTERM), without waiting."""
        for name, proc in reversed(self.procs):
            if proc.poll() is None and name != "redis":
                os.killpg(proc.pid, signal.SIGTERM)

    def stop(self, grace_s: float = 20.0, hurry: Callable[[], bool] = lambda: False) -> None:
        """Warm shutdown first (workers finish their task) for up to ``grace_s`` or until ``hurry()``, then
        SIGKILL whatever is left, Redis last."""
        self.terminate()
        deadline = time.monotonic() + grace_s
        waiting = [proc for name, proc in self.procs if name != "redis"]
        while any(p.poll() is None for p in waiting) and time.monotonic() < deadline and not hurry():
            time.sleep(0.1)
        for _name, proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)


def stop_local(cluster: Cluster, supervisor: Supervisor | None, hurry: Callable[[], bool]) -> None:
    """Stop every process of a local run, Redis last: Flower at once, the workers warm (each finishes its task,
    which writes to Redis) for up to 20 s or until ``hurry()``, then the rest and Redis."""
    cluster.terminate()  # Flower stops while the workers finish; Redis stays up until they have
    if supervisor is not None:
        supervisor.stop_all(20.0, hurry)
    cluster.stop(hurry=hurry)


START_ATTEMPTS = 3  # a worker that exits this many times in a row before it is ready ends the run (exit 2)


def cannot_start(slot: Slot) -> bool:
    """Whether ``slot``'s worker exited saying it cannot start here (EXIT_CANNOT_START: a model that does not
    load, bad settings), which the supervisor does not restart: waiting longer would change nothing."""
    return slot.proc is None and slot.restart_at is None and "cannot start" in slot.last_exit


def own_words(log: Path) -> str:
    """The worker's last ``framefleet:`` line in ``log`` (why it exits), or a pointer to the log."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return "see its log"
    said = [line.removeprefix("framefleet: ") for line in lines if line.startswith("framefleet: ")]
    return said[-1] if said else "see its log"


def named_redis(conf: Settings) -> str | None:
    """What names the Redis this run is to use (an environment variable or the settings' redis_url), or None
    when nothing does and a private redis-server is started."""
    for variable in ("REDIS_URL", "FRAMEFLEET_REDIS_URL"):
        if os.environ.get(variable):
            return variable
    default = Settings.model_fields["redis_url"].default
    return "redis_url in the settings" if conf.redis_url != default else None


def _keep(supervisor: Supervisor, stopping: threading.Event) -> None:
    """Replace workers that exit (recycled, crashed, past a deadline) until ``stopping`` is set."""
    while not stopping.wait(0.5):
        for what, slot, detail in supervisor.reap():
            print(f"worker {slot.name}: {what}: {detail}", file=sys.stderr, flush=True)


def rotate_logs(logs: Path) -> None:
    """Move an earlier run's logs to ``logs/previous/`` (replacing older ones), so a log holds one run."""
    earlier = [p for p in logs.glob("*") if p.is_file() and p.name not in SECRET_FILES]
    if not earlier:
        return
    previous = logs / "previous"
    shutil.rmtree(previous, ignore_errors=True)
    previous.mkdir(parents=True)
    for path in earlier:
        path.rename(previous / path.name)


def serve(flower_line: str, metrics_url: str) -> None:
    """Keep Flower and the metrics up until Ctrl-C (or SIGTERM)."""
    print(f"serving until Ctrl-C: {flower_line}; metrics {metrics_url}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            time.sleep(3600)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=_cli.HelpFormatter)
    add_run_arguments(parser)
    parser.add_argument("--gpus", type=parse_gpus, help="GPU indices to run workers on (default: all)")
    parser.add_argument(
        "--cpu-workers",
        type=int,
        default=0,
        help="solo CPU worker processes (default: one per core; without a GPU, see --gpu-workers)",
    )
    parser.add_argument(
        "--gpu-workers",
        type=int,
        default=0,
        help="solo workers per GPU queue (default: 1 per GPU; without a GPU, one worker per core as memory "
        "allows, each hosting every stage: gpu0's and cpu's, unless one of these two counts is given)",
    )
    parser.add_argument("--flower-port", type=int, default=0, help="default: a free port")
    parser.add_argument("--metrics-port", type=int, default=0, help="Prometheus exporter; default: a free port")
    parser.add_argument(
        "--serve", action="store_true", help="keep Flower and the metrics up after the run, until Ctrl-C"
    )
    _cli.add_config_argument(parser)
    args = parser.parse_args(argv)
    check_run_arguments(parser, args)
    conf = _cli.settings_from(args)
    if cannot := install_backends.missing(conf):  # before any process starts: no worker exits for it
        return _cli.fail(cannot[0])
    _cli.print_backends(conf)
    try:
        from tasks.run.dataset import check_folders, find_videos, first_video
        from tasks.run.metadata import DEFAULT_NAME, texts_for

        first_video(args.raw_dir)  # a missing or empty folder: the folder is walked once, by the enqueue
        check_folders(args.raw_dir, args.out, args.resume, args.force, args.add)
        from tasks.run import hold

        # A live run of OUT (on its Redis, whichever) is refused before any process starts; the enqueue takes
        # the lock itself.
        if (holder := hold.held_elsewhere(args.out, None)) is not None:
            raise hold.OutHeld(hold.refusal(args.out, *holder))
        if not args.force:  # before any process starts, as the rest of these checks
            from tasks.records import lineage

            lineage.check_same(args.out, conf, args.mixed)
        # A --continue with nothing left starts nothing, and leaves OUT's summary and report as they are.
        if args.resume and not args.add and (count := nothing_left(args.raw_dir, args.out, args.limit)):
            return nothing_to_do(args.raw_dir, args.out, count)
        # Before any process starts: a bad metadata file should cost no cluster start-up.
        if args.metadata is not None or args.require_text or (args.raw_dir / DEFAULT_NAME).is_file():
            videos = find_videos(args.raw_dir)
            texts_for(args.raw_dir, videos, args.metadata, args.require_text, selected=videos[: args.limit or None])
    except (DatasetError, MetadataError) as exc:
        return _cli.fail(str(exc))

    if (named := named_redis(conf)) is not None:
        try:
            get_redis(conf.redis_url).ping()
        except redis.RedisError as exc:
            # A Redis named on purpose that does not answer is an error: a private one would be another cluster.
            return _cli.fail(
                f"{named} names {redact_url(conf.redis_url)}, which does not answer ({type(exc).__name__}: {exc}); "
                f"start that Redis or correct the URL (its password too), or unset {named} for a private "
                "redis-server"
            )
    rotate_logs(args.out / "logs")
    cluster = Cluster(args.out / "logs")
    exporter, sampler, supervisor = None, None, None
    keeping = threading.Event()
    previous_sigterm = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        env = dict(os.environ)
        if named_redis(conf) is None:
            env["REDIS_URL"] = cluster.start_redis()
            env.pop("FRAMEFLEET_REDIS_URL", None)
            os.environ["REDIS_URL"] = env["REDIS_URL"]
            conf = _cli.settings_from(args)
            where = f"redis://{env['REDIS_URL'].rpartition('@')[2]}"  # the URL less its password
            print(f"Redis: a private redis-server at {where} (password in {cluster.logs / REDIS_FILE})")
        else:
            (cluster.logs / REDIS_FILE).unlink(missing_ok=True)  # an earlier run's private Redis is gone
            print("Redis: $REDIS_URL")
            if why := write_refused(get_redis(conf.redis_url)):  # full or read-only: no worker could start
                return _cli.redis_refused(why, args.raw_dir, args.out, command="run")
        gpus = args.gpus if args.gpus is not None else list(range(visible_gpus()))
        per_gpu = args.gpu_workers or 1
        # Supervised solo workers: per_gpu per GPU queue (and one per stage with its own environment), one
        # per core for the CPU queue; a worker's name is its queues ("+" between two) and a sequence number.
        pythons: dict[str, str | None] = {conf.cpu_queue: None}
        groups: list[tuple[int, str]] = []
        if not gpus:
            per_gpu = args.gpu_workers or stand_in_workers(host_cores(), available_mib())
            gpus = [0]
            if shares_cpu_queue(conf, args):
                # No GPU: the model stages run on the cores too. One process per core hosting every stage
                # uses each core with one process and one set of imports; a gpu0 stand-in and a cpu
                # worker per core would be twice the processes contending for the same cores.
                both = f"{conf.gpu_queue(0)}+{conf.cpu_queue}"
                pythons[both] = None
                groups += [(0, both)] * per_gpu
                print(f"no GPU found: {per_gpu} CPU worker(s), each hosting every stage ({conf.gpu_queue(0)} and cpu)")
            else:
                print(f"no GPU found: {per_gpu} CPU worker(s) stand in for gpu0")
        if not groups:
            for gpu in gpus:
                if conf.hosted_stages():
                    pythons[conf.gpu_queue(gpu)] = None
                    groups += [(gpu, conf.gpu_queue(gpu))] * per_gpu
                for stage in conf.own_env_stages():  # a worker per stage with its own environment
                    pythons[conf.stage_queue(stage, gpu)] = conf.stages[stage].python
                    groups.append((gpu, conf.stage_queue(stage, gpu)))
            groups += [(CPU_GROUP, conf.cpu_queue)] * (args.cpu_workers or cpu_worker_count())
        model_workers = sum(1 for group, _ in groups if group != CPU_GROUP)
        # Each model worker gets its share of the cores, so that together they do not oversubscribe them;
        # OpenCV's thread pool (preprocess, h5) the same share.
        threads = str(max(1, host_cores() // max(1, model_workers)))
        env.setdefault("FRAMEFLEET_TORCH_THREADS", threads)
        # The workers serve this run's folders and no other, whatever a message names (tasks.workers.confinement).
        env.update(confinement.run_env(args.raw_dir, args.out))
        if model_workers and all(group != CPU_GROUP for group, _ in groups):
            env.setdefault("OPENCV_FOR_THREADS_NUM", threads)
        supervisor = Supervisor(
            lambda group, name: worker_argv(
                (label := name.rsplit("-", 1)[0]).replace("+", ","), name, python=pythons[label]
            ),
            lambda group: env,
            cluster.logs,
            stop_grace_s=20.0,
        )
        for group, queue in groups:
            supervisor.start(group, queue)
        keeper = threading.Thread(target=_keep, args=(supervisor, keeping), name="supervisor", daemon=True)
        keeper.start()
        port = args.flower_port or free_port()
        flower_env, login = flower_auth(env, cluster.logs)
        cluster.start(
            "flower",
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tasks",
                "flower",
                "--address=127.0.0.1",
                f"--port={port}",
                "--max_tasks=10000",
            ],
            flower_env,
        )
        flower_line = f"Flower: http://127.0.0.1:{port}  ({login}; logs in {cluster.logs})"
        print(flower_line, flush=True)
        probe = open_probe()
        exporter = start_exporter(args.metrics_port, conf, probe=probe)
        print(f"Metrics: {exporter.url}", flush=True)
        if probe.mode != "none":
            sampler = GpuSampler(probe, cluster.logs / "gpu-samples.jsonl")
            sampler.start()
        cluster.wait_for_workers(conf, [slot.name for slot in supervisor.slots], supervisor=supervisor)
        record = enqueue(
            conf,
            args.raw_dir,
            args.out,
            args.limit,
            args.gpus,
            args.resume,
            args.force,
            add=args.add,
            keep=args.intermediates,
            metadata=args.metadata,
            require_text=args.require_text,
            window=args.window,
            mixed=args.mixed,
            command="run",
        )
        remote.push(args.out)  # an object-store OUT: the manifest and the run's records, before any video ends
        print(f"run {record['run_id']}: {_cli.plural(record['videos'], 'video')}", flush=True)
        # Not detachable: the workers stop with this process.
        code = follow(conf, record, args.out, detachable=False, resend=resender(conf, args, "run"))
        print(f"outputs: {remote.shown(args.out.resolve())}")
        if args.serve:
            serve(flower_line, exporter.url)
        else:
            print("Flower and the metrics stop with this cluster now (--serve keeps them up until Ctrl-C)")
        return code
    except (DatasetError, MetadataError) as exc:
        return _cli.fail(str(exc))
    except Exception as exc:  # Redis full or read-only: a clear stop; anything else is raised again
        return _cli.stop_if_redis_refused(exc, args.raw_dir, args.out, command="run")
    except KeyboardInterrupt:
        print(
            "\ninterrupted: stopping the local cluster (complete outputs are kept; --continue finishes the run)",
            file=sys.stderr,
        )
        return 130
    finally:
        # A second Ctrl-C (or a SIGTERM) while this runs hurries it: it must never leave a process behind.
        with Hurry() as hurry:
            if sampler is not None:
                sampler.stop()
            if exporter is not None:
                exporter.stop()
            keeping.set()
            if supervisor is not None:
                keeper.join(timeout=5)
            stop_local(cluster, supervisor, hurry)
        signal.signal(signal.SIGTERM, previous_sigterm)


if __name__ == "__main__":
    sys.exit(main())

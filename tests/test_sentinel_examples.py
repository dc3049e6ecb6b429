"""deploy/sentinel/: the compose and Kubernetes examples of a Redis behind three Sentinels agree with the URL they
tell every program to use, and the Kubernetes one is valid against the schemas (bundled, offline)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import redis
import yaml

from tasks import redis_urls
from tasks.redis_client import free_port, server_argv
from tests.conftest import wait_until
from tests.test_k8s_manifests import VERSIONS

FOLDER = Path(__file__).resolve().parent.parent / "deploy" / "sentinel"
EXAMPLES = ("compose.sentinel.yaml", "k8s-redis-sentinel.yaml")


def _url(name: str) -> str:
    (url,) = re.findall(r"(sentinel://\S+)", (FOLDER / name).read_text().split("\n\n")[0])
    return url.strip("\"'")


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_url_names_three_sentinels_and_the_master_they_monitor(name):
    found = redis_urls.sentinels(_url(name))
    assert len(found.hosts) == 3 and len(set(found.hosts)) == 3 and found.password == "PASSWORD"
    monitors = set(re.findall(r"sentinel monitor (\S+) \S+ 6379 (\d)", (FOLDER / name).read_text()))
    assert monitors == {(found.master_name, "2")}  # a quorum of 2 of the 3


def test_compose_runs_a_primary_a_replica_and_three_sentinels():
    services = yaml.safe_load((FOLDER / "compose.sentinel.yaml").read_text())["services"]
    hosts = {h for h, _ in redis_urls.sentinels(_url("compose.sentinel.yaml")).hosts}
    assert hosts == {s for s in services if s.startswith("sentinel-")}
    assert "--replicaof redis-primary 6379" in services["redis-replica"]["command"][-1]


@pytest.mark.parametrize("version", VERSIONS)
def test_the_kubernetes_example_is_valid(version):
    docs = [d for d in yaml.safe_load_all((FOLDER / "k8s-redis-sentinel.yaml").read_text()) if d]
    assert sorted((d["kind"], d["spec"].get("replicas")) for d in docs if d["kind"] == "StatefulSet") == [
        ("StatefulSet", 2),
        ("StatefulSet", 3),
    ]
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def _sentinel_conf(name: str) -> str:
    """The sentinel.conf an example's Sentinel writes, as its shell would (the heredoc between <<CONF and CONF)."""
    text = (FOLDER / name).read_text()
    lines = []
    for line in text.split("<<CONF\n", 1)[1].splitlines():
        if line.strip() == "CONF":
            break
        lines.append(line.strip())
    return "\n".join(lines).replace("$$", "$") + "\n"


@pytest.mark.parametrize("name", EXAMPLES)
def test_redis_server_runs_the_examples_sentinel_conf_and_finds_the_primary(name, tmp_path):
    """The example's sentinel.conf, its hostnames and ports made this machine's: a real Sentinel accepts every
    directive and names the primary it monitors."""
    primary_port, port = free_port(), free_port()
    primary = subprocess.Popen([*server_argv(primary_port, tmp_path), "--requirepass", "pw"], stdout=subprocess.DEVNULL)
    conf = _sentinel_conf(name)
    conf = re.sub(r"\$\(hostname\)(\.\S+)?", "localhost", conf).replace("$REDIS_PASSWORD", "pw")
    conf = re.sub(r"(sentinel monitor \S+) \S+ 6379", rf"\1 127.0.0.1 {primary_port}", conf)
    conf = conf.replace("port 26379", f"port {port}\nbind 127.0.0.1\ndir {tmp_path}")
    (tmp_path / "sentinel.conf").write_text(conf)
    log = tmp_path / "sentinel.log"
    sentinel = subprocess.Popen(["redis-server", str(tmp_path / "sentinel.conf"), "--sentinel"], stdout=log.open("wb"))
    try:
        client = redis.Redis(port=port, decode_responses=True, socket_timeout=2)
        master = redis_urls.sentinels(_url(name)).master_name

        def primary_named() -> object:
            if sentinel.poll() is not None:
                pytest.fail(f"the Sentinel refused {name}'s configuration:\n{log.read_text()}")
            try:
                return client.sentinel_get_master_addr_by_name(master)
            except redis.RedisError:
                return None

        assert wait_until(primary_named, 20, "the Sentinel to answer") == ("127.0.0.1", primary_port)
    finally:
        for proc in (sentinel, primary):
            proc.kill()
            proc.wait()

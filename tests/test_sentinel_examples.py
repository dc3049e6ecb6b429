"""deploy/sentinel/: the compose and Kubernetes examples of a Redis behind three Sentinels agree with the URL they
tell every program to use, and the Kubernetes one is valid against the schemas (bundled, offline)."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tasks import redis_urls
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

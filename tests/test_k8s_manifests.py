"""deploy/k8s/: valid against the Kubernetes schemas (bundled, offline) and wired together as the README says."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tasks.autoscaler.cli import parse_args
from tasks.observe.flower_guard import auth_problem, flower_args
from tests.test_compose import worker_options
from tests.test_deploy import compose_argv

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
# The oldest and newest Kubernetes minor versions whose schemas kubernetes-validate bundles and that we support.
VERSIONS = ("1.28.0", "1.37.0")
SECRET, SECRET_KEYS = "framefleet", {"redis-password", "flower-basic-auth"}
OUTPUT_ROOT, DATASET_ROOT = "/data/out", "/data/raw"


def documents() -> list[tuple[str, dict]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        docs += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return docs


def of_kind(kind: str) -> list[dict]:
    return [doc for _, doc in documents() if doc["kind"] == kind]


def workloads() -> list[dict]:
    return [doc for _, doc in documents() if doc["kind"] in ("Deployment", "StatefulSet")]


def gpu_pools() -> list[dict]:
    return [d for d in of_kind("Deployment") if "nvidia.com/gpu" in container(d)["resources"].get("limits", {})]


def container(workload: dict) -> dict:
    (only,) = workload["spec"]["template"]["spec"]["containers"]
    return only


def env_of(workload: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container(workload).get("env", [])}


def test_there_is_one_of_each_part():
    kinds = sorted(doc["kind"] for _, doc in documents())
    assert kinds.count("Namespace") == 1 and kinds.count("StatefulSet") == 1  # Redis
    names = {d["metadata"]["name"] for d in of_kind("Deployment")}
    assert {"framefleet-flower", "framefleet-cpu-worker"} <= names
    assert len(gpu_pools()) >= 2, "one Deployment per GPU node pool; the recipe shows two pools"


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_is_valid_against_the_kubernetes_schemas(version):
    # strict: a misspelt field (``replica:``) is an error, as `kubectl apply --validate=strict` makes it.
    for name, doc in documents():
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(
                f"{name}: {doc['kind']} {doc['metadata']['name']} is not valid Kubernetes {version}: "
                f"{exc.message} at {'.'.join(map(str, exc.path))}"
            )


def test_the_schema_check_catches_a_misspelt_field():
    (cpu,) = [d for d in of_kind("Deployment") if d["metadata"]["name"] == "framefleet-cpu-worker"]
    broken = {**cpu, "spec": {**cpu["spec"], "replica": 1}}
    with pytest.raises(kubernetes_validate.ValidationError, match="replica"):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


def test_everything_lives_in_the_namespace_and_selectors_match_their_pods():
    (namespace,) = of_kind("Namespace")
    for _, doc in documents():
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == namespace["metadata"]["name"], doc["metadata"]["name"]
    for workload in workloads():
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert workload["spec"]["selector"]["matchLabels"].items() <= labels.items()
    pod_labels = [w["spec"]["template"]["metadata"]["labels"] for w in workloads()]
    for service in of_kind("Service"):
        selector = service["spec"]["selector"]
        assert any(selector.items() <= labels.items() for labels in pod_labels), service["metadata"]["name"]


def test_secrets_come_from_the_one_documented_secret_and_claims_exist():
    claims = {c["metadata"]["name"]: c for c in of_kind("PersistentVolumeClaim")}
    readme = (ROOT / "deploy" / "README.md").read_text()
    for workload in workloads():
        for var in env_of(workload).values():
            ref = var.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["name"] == SECRET and ref["key"] in SECRET_KEYS, (workload["metadata"]["name"], ref)
        for volume in workload["spec"]["template"]["spec"].get("volumes", []):
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims
    for key in SECRET_KEYS:
        assert f"--from-literal={key}=" in readme, f"deploy/README.md must say how to create the secret key {key}"


def test_workers_share_one_output_claim_at_the_same_path_on_every_pod():
    (out_claim,) = [c for c in of_kind("PersistentVolumeClaim") if c["metadata"]["name"] == "framefleet-out"]
    assert out_claim["spec"]["accessModes"] == ["ReadWriteMany"]  # a video's stages run on different nodes
    workers = [w for w in workloads() if "FRAMEFLEET_OUTPUT_ROOT" in env_of(w)]
    assert {w["metadata"]["name"] for w in workers} >= {"framefleet-cpu-worker"} | {
        p["metadata"]["name"] for p in gpu_pools()
    }
    for workload in workers:
        env = env_of(workload)
        assert env["FRAMEFLEET_OUTPUT_ROOT"]["value"] == OUTPUT_ROOT
        assert env["FRAMEFLEET_DATASET_ROOT"]["value"] == DATASET_ROOT
        volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
        mounts = {m["mountPath"]: m for m in container(workload)["volumeMounts"]}
        out = volumes[mounts[OUTPUT_ROOT]["name"]]["persistentVolumeClaim"]
        assert out["claimName"] == "framefleet-out" and not out.get("readOnly")
        assert mounts[DATASET_ROOT].get("readOnly") is True
        assert env["REDIS_URL"]["value"] == "redis://:$(REDIS_PASSWORD)@framefleet-redis:6379/0"
        # Kubernetes expands $(VAR) only from variables declared before it.
        names = list(env)
        assert names.index("REDIS_PASSWORD") < names.index("REDIS_URL")


def test_redis_persists_and_never_evicts():
    (redis,) = of_kind("StatefulSet")
    args = container(redis)["command"]
    option = {args[i]: args[i + 1] for i in range(1, len(args) - 1) if args[i].startswith("--")}
    assert option["--appendonly"] == "yes" and option["--maxmemory-policy"] == "noeviction"
    assert option["--requirepass"] == "$(REDIS_PASSWORD)"
    (data,) = redis["spec"]["volumeClaimTemplates"]
    mount = {m["name"]: m["mountPath"] for m in container(redis)["volumeMounts"]}
    assert mount[data["metadata"]["name"]] == option["--dir"]


def test_flower_runs_the_compose_command_and_refuses_to_start_without_its_secret(monkeypatch):
    (flower,) = [d for d in of_kind("Deployment") if d["metadata"]["name"] == "framefleet-flower"]
    argv = container(flower)["command"]
    assert argv[1:] == compose_argv("flower")[1:]
    assert env_of(flower)["FLOWER_BASIC_AUTH"]["valueFrom"]["secretKeyRef"]["key"] == "flower-basic-auth"
    assert of_kind("Service") and all(
        s["spec"].get("type", "ClusterIP") == "ClusterIP" for s in of_kind("Service")
    )  # nothing public by default
    # The pod's own guard: without the secret's variable it would exit instead of serving unauthenticated.
    monkeypatch.delenv("FLOWER_BASIC_AUTH", raising=False)
    assert "FLOWER_BASIC_AUTH" in auth_problem("celery", flower_args(argv))


def test_cpu_worker_runs_the_compose_cpu_worker_command():
    (cpu,) = [d for d in of_kind("Deployment") if d["metadata"]["name"] == "framefleet-cpu-worker"]
    argv = container(cpu)["command"]
    assert worker_options(argv)["queues"] == ["cpu"]
    assert argv[1:] == compose_argv("worker-cpu")[1:]


@pytest.mark.parametrize("pool", [p["metadata"]["name"] for p in gpu_pools()])
def test_a_gpu_pool_is_one_autoscaler_pod_per_node_holding_every_gpu(pool):
    (deployment,) = [p for p in gpu_pools() if p["metadata"]["name"] == pool]
    spec = deployment["spec"]["template"]["spec"]
    main = container(deployment)
    gpus = main["resources"]["limits"]["nvidia.com/gpu"]
    assert isinstance(gpus, int) and gpus >= 1
    assert main["command"][:2] == ["python", "scripts/autoscaler.py"]
    args = parse_args(main["command"][2:])  # the autoscaler accepts its flags
    assert args.gpus is None  # all the GPUs the device plugin gave the pod
    # Warm stop: the pod's grace outlasts the autoscaler's own SIGTERM-to-SIGKILL wait for its workers.
    assert spec["terminationGracePeriodSeconds"] > args.stop_grace_s
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    (anti,) = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    assert anti["labelSelector"]["matchLabels"].items() <= spec_labels(deployment).items()
    pool_label = deployment["metadata"]["labels"]["framefleet.io/gpu-pool"]
    assert spec["nodeSelector"] == {"framefleet.io/gpu-pool": pool_label}
    assert "CUDA_VISIBLE_DEVICES" not in env_of(deployment)  # the device plugin and the queue name pin GPUs


def spec_labels(deployment: dict) -> dict:
    return deployment["spec"]["template"]["metadata"]["labels"]


def test_gpu_pools_are_distinct_node_pools():
    pools = [p["spec"]["template"]["spec"]["nodeSelector"]["framefleet.io/gpu-pool"] for p in gpu_pools()]
    assert len(set(pools)) == len(pools)

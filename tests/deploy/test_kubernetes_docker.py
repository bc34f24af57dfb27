"""The two-node overlay's pod specs, run for real under Docker as a kubelet
would run them: the LeaderWorkerSet's leader and worker templates, as
`kubectl kustomize` renders them, each started as a pod on a Docker network
with the CPU stand-in image and profile cpu-dev-2node (tensor parallel 2, one
CPU rank per pod, Gloo): they serve a completion through the leader, their
probes report started and ready as the manifest says, and a worker that dies
ends both pods' containers non-zero (the group's restart is LWS's job).

What of the kubelet (and of LWS's pod webhook) this reproduces, from the
rendered spec and nothing else:
- a pod sandbox that holds the pod's network namespace (its IP, hostname =
  pod name, and the DNS name LWS's headless Service gives it,
  NAME-GROUP.NAME.NAMESPACE), which every container of the pod joins;
  status.podIP is the sandbox's address, read once it has one, as the
  kubelet reads the CNI's;
- LWS's variables as its webhook sets them (LWS_LEADER_ADDRESS,
  LWS_GROUP_SIZE, LWS_WORKER_INDEX first in every container's env);
- env in order: values with $(VAR) expanded from the entries before them
  ($$ for a literal $, unknown references kept), valueFrom fieldRef
  (downward API) and secretKeyRef;
- command and args with $(VAR) expanded (command replaces the image's
  entrypoint, args its command);
- init containers run to completion, in order, before the containers;
- volumes: a memory emptyDir as a tmpfs of its sizeLimit (/dev/shm),
  claims (a volume claim template's claim is TEMPLATE-POD; a bound claim a
  directory or Docker volume), secrets as the kubelet writes them (the
  ..data symlink layout, defaultMode, group fsGroup with the read bits it
  adds, an optional secret that is missing as an empty directory),
  readOnly;
- the pod's securityContext (runAsUser, fsGroup and supplementalGroups as
  groups, seccomp Unconfined) and the container's capabilities;
- terminationGracePeriodSeconds as the SIGTERM-to-SIGKILL time;
- exec probes at their periodSeconds, timeoutSeconds and thresholds, the
  startup probe first and readiness only after it passed, as the container
  user, in the container.

What it does not (and cannot here): scheduling, the AMD device plugin and
amd.com/gpu (the stand-in runs on CPUs), resource limits, image pulls,
restarts (the restart policy, LWS recreating the group), Services and
EndpointSlices (the leader's API port is published on loopback instead),
cluster DNS search domains, the kubelet's own KUBERNETES_* variables, and
the node-local ownership changes fsGroup makes on claims (a Docker volume
keeps the image's owners).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import secrets
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support.docker_images import CPU_DEV_ENV, docker, http
from support.workers import free_port
from test_kubernetes import main_container, one, render

pytestmark = pytest.mark.docker
PREFIX = "k3rocm-test-k8s"
NETWORK = f"{PREFIX}-net"
NAMESPACE = "default"
API_KEY_SECRET = "kimi-k3-api-key"
READY_TIMEOUT = 900


# ---------------------------------------------------------------- a kubelet


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: $$ is a literal $, a reference to a
    variable not (yet) defined is left as it is."""

    def one_reference(match: re.Match) -> str:
        if match.group(1) == "$":
            return "$"
        return env.get(match.group(2), match.group(0))

    return re.sub(r"\$(\$|\(([^)]*)\))", one_reference, text)


def quantity_bytes(text: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(text[: -len(suffix)]) * factor
    return int(text)


@dataclass
class Probe:
    """One container's probes, run as the kubelet runs them."""

    container: str
    startup: dict | None
    readiness: dict | None
    started_at: float | None = None
    ready: bool = False
    ready_at: float | None = None
    results: list[tuple[float, str, bool, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run_once(self, probe: dict, kind: str) -> bool:
        timeout = probe.get("timeoutSeconds", 1)
        try:
            result = subprocess.run(
                ["docker", "exec", self.container, *probe["exec"]["command"]],
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            passed, said = result.returncode == 0, result.stdout.strip()
        except subprocess.TimeoutExpired:
            passed, said = False, f"timed out after {timeout} s"
        self.results.append((time.monotonic(), kind, passed, said))
        return passed

    def loop(self) -> None:
        started = time.monotonic()
        if self.startup is not None:
            self.stop.wait(self.startup.get("initialDelaySeconds", 0))
            failures = 0
            while not self.stop.is_set():
                if self.run_once(self.startup, "startup"):
                    break
                failures += 1
                if failures >= self.startup.get("failureThreshold", 3):
                    # The kubelet would kill and restart the container.
                    self.results.append((time.monotonic(), "startup", False, "KILL"))
                    return
                self.stop.wait(self.startup.get("periodSeconds", 10))
        self.started_at = time.monotonic() - started
        if self.readiness is None:
            return
        probe = self.readiness
        self.stop.wait(probe.get("initialDelaySeconds", 0))
        passes = fails = 0
        while not self.stop.is_set():
            if self.run_once(probe, "readiness"):
                passes, fails = passes + 1, 0
                if passes >= probe.get("successThreshold", 1) and not self.ready:
                    self.ready, self.ready_at = True, time.monotonic() - started
            else:
                passes, fails = 0, fails + 1
                if fails >= probe.get("failureThreshold", 3):
                    self.ready = False
            self.stop.wait(probe.get("periodSeconds", 10))


@dataclass
class Pod:
    """One pod of the LeaderWorkerSet group, from its rendered template."""

    name: str
    template: dict
    lws: dict[str, str]
    subdomain: str
    claims: dict[str, str]  # claim name -> host directory or Docker volume
    secret_data: dict[str, dict[str, str]]
    workdir: Path
    publish: tuple[tuple[int, int], ...] = ()
    ip: str | None = None
    probes: dict[str, Probe] = field(default_factory=dict)
    threads: list[threading.Thread] = field(default_factory=list)

    @property
    def spec(self) -> dict:
        return self.template["spec"]

    @property
    def sandbox(self) -> str:
        return f"{PREFIX}-{self.name}"

    def container_name(self, container: dict) -> str:
        return f"{PREFIX}-{self.name}-{container['name']}"

    def admitted(self, container: dict) -> dict:
        """The container as LWS's webhook leaves it: its variables first."""
        injected = [{"name": k, "value": v} for k, v in self.lws.items()]
        names = set(self.lws)
        own = [e for e in container.get("env", []) if e["name"] not in names]
        return {**container, "env": injected + own}

    def start_sandbox(self, image: str) -> None:
        ports = [f"--publish=127.0.0.1:{h}:{c}" for h, c in self.publish]
        docker(
            "run",
            "--detach",
            "--name",
            self.sandbox,
            "--network",
            NETWORK,
            "--hostname",
            self.name,
            "--network-alias",
            f"{self.name}.{self.subdomain}.{NAMESPACE}",
            *ports,
            "--entrypoint",
            "sleep",
            image,
            "infinity",
        )
        inspected = json.loads(docker("inspect", self.sandbox).stdout)[0]
        self.ip = inspected["NetworkSettings"]["Networks"][NETWORK]["IPAddress"]
        assert self.ip

    def field_ref(self, path: str) -> str:
        fields = {
            "metadata.name": self.name,
            "metadata.namespace": NAMESPACE,
            "status.podIP": self.ip,
        }
        label = re.fullmatch(r"metadata\.labels\['(.+)'\]", path)
        if label:
            return self.template["metadata"]["labels"][label.group(1)]
        assert path in fields, f"fieldRef {path} is not reproduced here"
        return fields[path]

    def environment(self, container: dict) -> dict[str, str]:
        env: dict[str, str] = {}
        for entry in container.get("env", []):
            if "value" in entry:
                env[entry["name"]] = expand(entry["value"], env)
                continue
            source = entry["valueFrom"]
            if "fieldRef" in source:
                env[entry["name"]] = self.field_ref(source["fieldRef"]["fieldPath"])
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                env[entry["name"]] = self.secret_data[ref["name"]][ref["key"]]
            else:
                raise AssertionError(f"valueFrom {source} is not reproduced here")
        return env

    def secret_volume(self, volume: dict) -> Path:
        """A secret volume as the kubelet writes it: the files in a
        timestamped directory, ..data pointing at it, each key a symlink
        through ..data; owned by root and the pod's fsGroup, which adds the
        group's read bits."""
        secret = volume["secret"]
        where = self.workdir / f"{self.name}-{volume['name']}"
        where.mkdir()
        data = self.secret_data.get(secret["secretName"])
        if data is None:
            assert secret.get("optional"), f"secret {secret['secretName']} missing"
            return where
        items = secret.get("items") or [{"key": k, "path": k} for k in data]
        group = self.spec["securityContext"].get("fsGroup", 0)
        mode = secret.get("defaultMode", 0o644) | (0o440 if group else 0)
        stamped = where / "..2026_12_02_00_00_00.000000000"
        stamped.mkdir()
        for item in items:
            target = stamped / item["path"]
            target.write_text(data[item["key"]])
            os.chown(target, 0, group)
            os.chmod(target, item.get("mode", mode))
            (where / item["path"]).symlink_to(f"..data/{item['path']}")
        (where / "..data").symlink_to(stamped.name)
        for directory in (where, stamped):
            os.chown(directory, 0, group)
            os.chmod(directory, 0o2750 if group else 0o755)
        return where

    def mounts(self, container: dict) -> list[str]:
        volumes = {v["name"]: v for v in self.spec.get("volumes", [])}
        args = []
        for mount in container.get("volumeMounts", []):
            name, path = mount["name"], mount["mountPath"]
            volume = volumes.get(name, {"persistentVolumeClaim": {}})
            read_only = mount.get("readOnly", False)
            if "emptyDir" in volume:
                empty = volume["emptyDir"]
                assert empty.get("medium") == "Memory", "disk emptyDir not used"
                size = quantity_bytes(empty["sizeLimit"])
                args.append(f"--mount=type=tmpfs,destination={path},tmpfs-size={size}")
            elif "persistentVolumeClaim" in volume:
                # No volume of that name: a volume claim template's claim.
                claim = volume["persistentVolumeClaim"].get(
                    "claimName", f"{name}-{self.name}"
                )
                read_only |= volume["persistentVolumeClaim"].get("readOnly", False)
                source = self.claims[claim]
                args.append(f"--volume={source}:{path}{':ro' if read_only else ''}")
            elif "secret" in volume:
                args.append(f"--volume={self.secret_volume(volume)}:{path}:ro")
            else:
                raise AssertionError(f"volume {volume} is not reproduced here")
        return args

    def security(self, container: dict) -> list[str]:
        pod = self.spec.get("securityContext", {})
        args = [f"--user={pod['runAsUser']}"] if "runAsUser" in pod else []
        groups = [pod["fsGroup"]] if "fsGroup" in pod else []
        args += [f"--group-add={g}" for g in groups + pod.get("supplementalGroups", [])]
        if pod.get("seccompProfile", {}).get("type") == "Unconfined":
            args.append("--security-opt=seccomp=unconfined")
        own = container.get("securityContext", {})
        args += [f"--cap-add={c}" for c in own.get("capabilities", {}).get("add", [])]
        return args

    def run(self, image: str, container: dict) -> str:
        container = self.admitted(container)
        env = self.environment(container)
        command = [expand(part, env) for part in container.get("command", [])]
        args = [expand(part, env) for part in container.get("args", [])]
        name = self.container_name(container)
        entrypoint = ["--entrypoint", command[0]] if command else []
        docker(
            "run",
            "--detach",
            "--name",
            name,
            f"--network=container:{self.sandbox}",
            f"--stop-timeout={self.spec['terminationGracePeriodSeconds']}",
            *self.mounts(container),
            *self.security(container),
            *(f"--env={k}={v}" for k, v in env.items()),
            *entrypoint,
            image,
            *command[1:],
            *args,
        )
        return name

    def start_init(self, image: str) -> list[str]:
        return [
            self.run(image, container)
            for container in self.spec.get("initContainers", [])
        ]

    def start_containers(self, image: str) -> None:
        for container in self.spec["containers"]:
            name = self.run(image, container)
            probe = Probe(
                name, container.get("startupProbe"), container.get("readinessProbe")
            )
            self.probes[container["name"]] = probe
            thread = threading.Thread(target=probe.loop, daemon=True)
            thread.start()
            self.threads.append(thread)

    def probe(self) -> Probe:
        return self.probes["kimi-k3"]

    def main(self) -> str:
        return self.container_name(main_container(self.template))

    def remove(self) -> None:
        for probe in self.probes.values():
            probe.stop.set()
        names = [self.container_name(c) for c in self.spec["containers"]]
        names += [self.container_name(c) for c in self.spec.get("initContainers", [])]
        docker("rm", "-f", "-v", *names, self.sandbox, check=False)


# ---------------------------------------------------------------- the test


def state(container: str) -> dict:
    return json.loads(docker("inspect", container).stdout)[0]["State"]


def logs(container: str) -> str:
    result = docker("logs", container, check=False)
    return result.stdout + result.stderr


def wait(what: str, condition, timeout: float, containers: list[str]) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {c}:\n{logs(c)[-4000:]}" for c in containers)
            raise AssertionError(f"no {what} within {timeout:.0f} s\n{tails}")
        time.sleep(1)


def cpu_stand_in(container: dict, mount_path: str) -> dict:
    """What an overlay for the CPU stand-in would patch: the CPU try-out's
    settings for the tiny model (replacing entries of the same name, in
    place), the CPU profile over two nodes, one core per rank."""
    patch = {
        **CPU_DEV_ENV,
        "K3_PROFILE": "cpu-dev-2node",
        "K3_MODEL": mount_path,
        "VLLM_CPU_OMP_THREADS_BIND": "$(LWS_WORKER_INDEX)",
    }
    env = [dict(e) for e in container["env"]]
    for entry in env:
        name = entry["name"]
        if name in patch:
            entry.clear()
            entry.update(name=name, value=patch.pop(name))
    env += [{"name": k, "value": v} for k, v in patch.items()]
    return {**container, "env": env}


@contextlib.contextmanager
def docker_network():
    docker("network", "rm", NETWORK, check=False)
    docker("network", "create", NETWORK)
    try:
        yield
    finally:
        docker("network", "rm", NETWORK, check=False)


@pytest.mark.every_line
def test_the_two_node_pod_specs_serve_probe_and_fail_together(image, model, tmp_path):
    lws = one(render("two-node"), "LeaderWorkerSet")
    name = lws["metadata"]["name"]
    lwt = lws["spec"]["leaderWorkerTemplate"]
    size = lwt["size"]
    leader_name, worker_name = f"{name}-0", f"{name}-0-1"
    leader_address = f"{leader_name}.{name}.{NAMESPACE}"
    templates = {}
    for role, key in (("leader", "leaderTemplate"), ("worker", "workerTemplate")):
        template = json.loads(json.dumps(lwt[key]))
        spec = template["spec"]
        model_mount = next(
            m["mountPath"]
            for m in main_container(template)["volumeMounts"]
            if m["name"] == "model"
        )
        spec["containers"] = [
            cpu_stand_in(c, model_mount) if c["name"] == "kimi-k3" else c
            for c in spec["containers"]
        ]
        templates[role] = template
    api_key = secrets.token_hex(16)
    secret_data = {API_KEY_SECRET: {"api-key": api_key}}
    caches = {
        f"cache-{pod}": f"{PREFIX}-cache-{pod}" for pod in (leader_name, worker_name)
    }
    claims = {"kimi-k3-model": str(model), **caches}
    api_port = free_port()

    def pod(pod_name: str, role: str, index: int, publish=()) -> Pod:
        return Pod(
            pod_name,
            templates[role],
            {
                "LWS_LEADER_ADDRESS": leader_address,
                "LWS_GROUP_SIZE": str(size),
                "LWS_WORKER_INDEX": str(index),
            },
            name,
            claims,
            secret_data,
            tmp_path,
            publish,
        )

    leader = pod(leader_name, "leader", 0, ((api_port, 8000),))
    worker = pod(worker_name, "worker", 1)
    for stale in (leader, worker):
        stale.remove()
    docker("volume", "rm", *caches.values(), check=False)
    with docker_network():
        try:
            # LeaderCreated: the worker pod exists as soon as the leader pod
            # does, maybe before the leader has an address. Its init
            # container waits for the leader's name.
            worker.start_sandbox(image)
            [init] = worker.start_init(image)
            time.sleep(8)
            assert state(init)["Running"], logs(init)
            assert f"waiting for the leader {leader_address}" in logs(init)
            leader.start_sandbox(image)
            leader.start_containers(image)
            wait("init exit", lambda: not state(init)["Running"], 120, [init])
            assert state(init)["ExitCode"] == 0, logs(init)
            assert f"the leader {leader_address} resolves" in logs(init)
            worker.start_containers(image)

            containers = [leader.main(), worker.main()]
            wait(
                "ready pods",
                lambda: leader.probe().ready and worker.probe().ready,
                READY_TIMEOUT,
                containers,
            )
            _check_probes(leader.probe(), main_container(templates["leader"]))
            _check_probes(worker.probe(), main_container(templates["worker"]))
            _check_environment(leader, worker, leader_address, size)
            _check_volumes(leader, worker, templates)

            # The API, through the leader only, with the key from the Secret.
            body = {"model": "kimi-k3", "prompt": "a b c d", "max_tokens": 8}
            url = f"http://127.0.0.1:{api_port}/v1/completions"
            status, text = http(
                url, body, headers={"Authorization": f"Bearer {api_key}"}
            )
            assert status == 200, text
            assert json.loads(text)["usage"]["completion_tokens"] == 8
            assert http(url, body)[0] == 401
            assert "world_size=2 rank=0" in logs(leader.main())
            assert re.search(
                r"rank 1 in world size 2 is assigned as .*TP rank 1",
                logs(worker.main()),
            )

            # A worker that dies (a lost node, an OOM kill): its container
            # ends non-zero; the leader's next request fails and its
            # container ends non-zero (exit 3) too.
            docker("kill", worker.main())
            wait(
                "worker exit",
                lambda: not state(worker.main())["Running"],
                60,
                containers,
            )
            assert state(worker.main())["ExitCode"] == 137
            status, _ = http(
                url, body, timeout=120, headers={"Authorization": f"Bearer {api_key}"}
            )
            assert status >= 500
            wait(
                "leader exit",
                lambda: not state(leader.main())["Running"],
                240,
                containers,
            )
            assert state(leader.main())["ExitCode"] == 3, logs(leader.main())[-3000:]
            assert "vLLM exited on node 0 of a multi-node deployment" in logs(
                leader.main()
            )
        finally:
            for started in (leader, worker):
                started.remove()
            docker("volume", "rm", *caches.values(), check=False)


def _check_probes(probe: Probe, container: dict) -> None:
    """Started before ready; readiness asked only after the start passed;
    the start ended inside the startup window."""
    startup = container["startupProbe"]
    kinds = [kind for _, kind, _, _ in probe.results]
    assert "KILL" not in [said for *_, said in probe.results]
    first_readiness = kinds.index("readiness")
    assert all(kind == "startup" for kind in kinds[:first_readiness])
    assert probe.results[first_readiness - 1][2] is True  # the start passed
    assert not any(
        passed for _, kind, passed, _ in probe.results[: first_readiness - 1]
    )
    assert probe.started_at is not None and probe.ready_at >= probe.started_at
    window = startup["periodSeconds"] * startup["failureThreshold"]
    assert probe.started_at < window
    # The probes' periods: consecutive startup probes one period apart.
    times = [t for t, kind, _, _ in probe.results if kind == "startup"]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(gap >= startup["periodSeconds"] - 0.5 for gap in gaps), gaps
    said = [s for _, kind, passed, s in probe.results if kind == "readiness" and passed]
    assert said and said[-1].startswith("healthy"), said


def _exec(container: str, *command: str) -> str:
    result = docker("exec", container, *command, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _check_environment(
    leader: Pod, worker: Pod, leader_address: str, size: int
) -> None:
    def env(pod: Pod) -> dict[str, str]:
        text = _exec(pod.main(), "env")
        return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)

    lead, work = env(leader), env(worker)
    assert lead["K3_MASTER_ADDR"] == leader.ip == lead["VLLM_HOST_IP"]
    assert work["K3_MASTER_ADDR"] == leader_address
    assert work["VLLM_HOST_IP"] == worker.ip != leader.ip
    assert (lead["K3_NODE_RANK"], work["K3_NODE_RANK"]) == ("0", "1")
    assert lead["K3_NUM_NODES"] == work["K3_NUM_NODES"] == str(size)
    assert (lead["VLLM_CPU_OMP_THREADS_BIND"], work["VLLM_CPU_OMP_THREADS_BIND"]) == (
        "0",
        "1",
    )
    health = _exec(worker.main(), "python3", "-m", "k3rocm.container.health")
    assert f"vLLM connected to node 0 at {leader_address}:29501" in health


def _check_volumes(leader: Pod, worker: Pod, templates: dict) -> None:
    for pod, role in ((leader, "leader"), (worker, "worker")):
        spec = templates[role]["spec"]
        [shm] = [v for v in spec["volumes"] if v["name"] == "dshm"]
        size = _exec(
            pod.main(),
            "python3",
            "-c",
            "import os; s = os.statvfs('/dev/shm'); print(s.f_blocks * s.f_frsize)",
        )
        assert int(size) == quantity_bytes(shm["emptyDir"]["sizeLimit"])
        groups = _exec(pod.main(), "id", "-G").split()
        security = spec["securityContext"]
        wanted = [security["fsGroup"], *security["supplementalGroups"]]
        assert {str(g) for g in wanted} <= set(groups)
        assert _exec(pod.main(), "id", "-u").strip() == str(security["runAsUser"])
    key_file = main_container(templates["leader"])["env"]
    [path] = [e["value"] for e in key_file if e["name"] == "K3_API_KEY_FILE"]
    mode = _exec(leader.main(), "stat", "-L", "-c", "%a %u %g", path).split()
    assert mode == [
        "440",
        "0",
        str(templates["leader"]["spec"]["securityContext"]["fsGroup"]),
    ]

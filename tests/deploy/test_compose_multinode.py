"""compose.multinode.yaml and compose.infiniband.yaml: valid on their own,
merged onto compose.yaml by the real docker-compose 1.29.2 (Debian's), their
required variables refused with the message, and every variable documented.

The merged file is only rendered here (`docker-compose config`); running a
node needs a cluster. tests/deploy/test_multinode_docker.py runs two nodes of the
image on one machine instead."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile

import jsonschema
import pytest
import yaml
from support.vllm_trees import REPO
from test_compose import ENV_EXAMPLE, VARIABLE, compose_schema, documented

OVERRIDES = ("compose.multinode.yaml", "compose.infiniband.yaml")
READ_ONLY = "compose.readonly.yaml"
NODE_ENV = {
    "RENDER_GID": "109",
    "K3_PROFILE": "tep16",
    "K3_NODE_RANK": "1",
    "K3_MASTER_ADDR": "10.0.0.1",
    "VLLM_HOST_IP": "10.0.0.2",
    "NCCL_SOCKET_IFNAME": "ens5",
    "GLOO_SOCKET_IFNAME": "ens5",
}
__all__ = ["compose_schema"]  # the fixture, shared with test_compose


def compose_config(env: dict[str, str], *files: str) -> subprocess.CompletedProcess:
    command = shutil.which("docker-compose")
    assert command, "docker-compose is not installed (scripts/test installs it)"
    args = [command, "--project-directory", str(REPO)]
    for name in ("compose.yaml", *files):
        args += ["-f", str(REPO / name)]
    # Only these variables: no .env of the checkout, no caller's environment.
    with tempfile.NamedTemporaryFile(suffix=".env") as empty:
        return subprocess.run(
            [*args, "--env-file", empty.name, "config"],
            env={"PATH": os.environ["PATH"], **env},
            capture_output=True,
            text=True,
            cwd=REPO,
        )


@pytest.mark.parametrize("name", [*OVERRIDES, READ_ONLY])
def test_override_matches_the_compose_spec_schema(compose_schema, name):
    override = yaml.safe_load((REPO / name).read_text())
    jsonschema.Draft201909Validator(compose_schema).validate(override)


def test_the_read_only_override_keeps_only_the_cache_and_two_tmpfs_writable():
    result = compose_config({"RENDER_GID": "109"}, READ_ONLY)
    assert result.returncode == 0, result.stderr
    server = yaml.safe_load(result.stdout)["services"]["kimi-k3"]
    assert server["read_only"] is True
    assert [entry.split(":")[0] for entry in server["tmpfs"]] == ["/run/k3rocm", "/tmp"]
    # docker-compose 1.29 renders volumes as SOURCE:TARGET:MODE.
    writable = [v.split(":")[1] for v in server["volumes"] if not v.endswith(":ro")]
    assert writable == ["/home/k3/.cache"]


def test_a_node_runs_on_the_host_network_with_its_addresses():
    result = compose_config(NODE_ENV, *OVERRIDES)
    assert result.returncode == 0, result.stderr
    server = yaml.safe_load(result.stdout)["services"]["kimi-k3"]
    assert server["network_mode"] == "host"
    # compose.yaml's SYS_PTRACE (the stall watchdog's stack capture) stays.
    assert sorted(server["cap_add"]) == ["IPC_LOCK", "SYS_PTRACE"]
    assert server["ulimits"]["memlock"] == -1
    assert {"/dev/kfd", "/dev/dri", "/dev/infiniband"} <= {
        device.split(":")[0] for device in server["devices"]
    }
    environment = server["environment"]
    for name in ("VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        assert environment[name] == NODE_ENV[name]
    assert (environment["K3_NODE_RANK"], environment["K3_MASTER_ADDR"]) == (
        "1",
        "10.0.0.1",
    )


@pytest.mark.parametrize(
    ("api_bind", "api_host"), [(None, "127.0.0.1"), ("10.0.1.2", "10.0.1.2")]
)
def test_a_node_listens_where_its_settings_say_not_on_every_interface(
    api_bind, api_host
):
    """On the host network 0.0.0.0 is every interface of the host: the API
    listens on K3_API_BIND (loopback unless set), the start-up metrics on
    the node's cluster address."""
    env = dict(NODE_ENV, **({"K3_API_BIND": api_bind} if api_bind else {}))
    result = compose_config(env, *OVERRIDES)
    assert result.returncode == 0, result.stderr
    environment = yaml.safe_load(result.stdout)["services"]["kimi-k3"]["environment"]
    assert environment["K3_HOST"] == api_host
    assert environment["K3_STATUS_HOST"] == NODE_ENV["VLLM_HOST_IP"]


@pytest.mark.parametrize(
    "missing",
    ["VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "K3_NODE_RANK"],
)
def test_a_node_without_its_address_settings_is_refused(missing):
    env = {name: value for name, value in NODE_ENV.items() if name != missing}
    result = compose_config(env, OVERRIDES[0])
    assert result.returncode != 0
    assert re.search(rf"set {missing} in \.env", result.stderr), result.stderr


def test_every_override_variable_is_documented_in_the_env_example():
    used = {
        match.group(1)
        for name in OVERRIDES
        for match in VARIABLE.finditer((REPO / name).read_text())
    }
    assert used and not used - documented(), ENV_EXAMPLE

"""The A/B run reads the service's K3_KDA_METADATA through its setting row
(k3rocm.accept.compose.Compose.path_of): a value that is no metadata path is
one AbError line naming the setting, not a run of the wrong A/B. `docker
inspect` is a stand-in script printing the container's environment (no
Docker engine is needed for what is read from its answer)."""

from __future__ import annotations

import json

import pytest

from k3rocm.accept.compose import AbError, Compose


def compose_with_env(tmp_path, env: list[str]) -> Compose:
    docker = tmp_path / "docker"
    answer = json.dumps([{"Config": {"Env": env}}])
    docker.write_text(f"#!/bin/sh\necho '{answer}'\n")
    docker.chmod(0o755)
    return Compose(["true"], "kimi-k3", docker=str(docker))


@pytest.mark.parametrize(
    ("env", "path"),
    [(["K3_KDA_METADATA=legacy"], "legacy"), ([], "device"),
     (["K3_KDA_METADATA="], "device"), (["K3_KDA_METADATA= legacy "], "legacy")],
)  # fmt: skip
def test_the_service_path_is_read_as_the_row_reads_it(tmp_path, env, path):
    assert compose_with_env(tmp_path, env).path_of("c0ffee") == path


def test_a_value_that_is_no_path_is_one_line(tmp_path):
    with pytest.raises(AbError) as refused:
        compose_with_env(tmp_path, ["K3_KDA_METADATA=gpu"]).path_of("c0ffee")
    assert str(refused.value) == (
        "the service's K3_KDA_METADATA is 'gpu'; set one of device, legacy "
        "(default device)"
    )

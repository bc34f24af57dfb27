import shutil
import tempfile
from pathlib import Path

import pytest
import support.vllm_session  # noqa: F401  (this wing runs vLLM: the patched tree)
from support.launcher_node import API_KEY, Node


@pytest.fixture
def node(tmp_path) -> Node:
    return Node(tmp_path)


@pytest.fixture
def locked_dir():
    """A directory nobody but root may enter, under one everyone may."""
    parent = Path(tempfile.mkdtemp(prefix="k3-locked-"))
    parent.chmod(0o755)
    locked = parent / "locked"
    (locked / "Kimi-K3").mkdir(parents=True)
    (locked / "Kimi-K3" / "config.json").write_text("{}")
    (locked / "api-key").write_text(API_KEY + "\n")
    (locked / "api-key").chmod(0o600)
    locked.chmod(0)
    yield locked
    locked.chmod(0o700)
    shutil.rmtree(parent)

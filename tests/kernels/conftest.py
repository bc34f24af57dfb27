# This wing's tests run vLLM: the patched tree, kernels interpreted.
import pytest
import support.vllm_session  # noqa: F401


@pytest.fixture
def amd_buffer_ops(monkeypatch):
    """AMD's Triton with buffer ops, its default (the 2 GiB pointer class
    exists only then), whatever AMDGCN_USE_BUFFER_OPS says here."""
    from triton import knobs

    monkeypatch.setattr(knobs.amd, "use_buffer_ops", True)

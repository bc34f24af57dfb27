"""The test session's vLLM: the tree the real patch tool patched, first on
sys.path, with vLLM's Triton kernels run by the Triton interpreter on the
CPU (TRITON_INTERPRET, set by the root conftest before Triton loads).
Imported, for its effect, by the conftest of every wing whose tests run
vLLM; tests/common's run without vLLM (tests/repo/test_wing_conftests.py)."""

import sys

from support.vllm_trees import patched_tree

PATCHED_ROOT = patched_tree()
if str(PATCHED_ROOT) not in sys.path:
    sys.path.insert(0, str(PATCHED_ROOT))


def _enable_triton_for_vllm() -> None:
    """vllm.triton_utils swaps Triton for a placeholder when no GPU driver is
    active; bind the real modules so @triton.jit kernels run interpreted."""
    import triton
    import triton.language as tl
    import vllm.triton_utils as triton_utils

    triton_utils.triton, triton_utils.tl, triton_utils.HAS_TRITON = triton, tl, True


_enable_triton_for_vllm()

# This wing's tests run vLLM: the patched tree, kernels interpreted.
import support.vllm_session  # noqa: F401

"""Triton kernels the patch series adds to vLLM, kept here as their source.

Each module is copied whole into vLLM by a generated patch
(``k3rocm patchgen``); importing one needs vLLM.
"""

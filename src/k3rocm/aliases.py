"""The module paths operators type or older images bake in, kept working
after the modules moved into their subpackages: each alias module runs (or
re-exports) the module that now does the job."""

import runpy

# Old path -> where it lives now.
MOVED = {
    "k3rocm.patchset": "k3rocm.patchtool.patchset",
    "k3rocm.patchgen": "k3rocm.patchtool.patchgen",
    "k3rocm.health": "k3rocm.container.health",
    "k3rocm.supervise": "k3rocm.container.supervise",
    "k3rocm.drain": "k3rocm.container.drain",
}


def run_as_main(alias: str) -> None:
    """`python -m ALIAS`: run the moved module as __main__."""
    runpy.run_module(MOVED[alias], run_name="__main__", alter_sys=True)

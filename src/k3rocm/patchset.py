"""``python -m k3rocm.patchset``: runs the module that moved (k3rocm.aliases)."""

from k3rocm.aliases import run_as_main

if __name__ == "__main__":
    run_as_main(__spec__.name)

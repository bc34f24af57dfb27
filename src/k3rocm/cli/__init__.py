"""The ``k3rocm`` command: one name for every command of the distribution,
registered in k3rocm.cli.commands."""

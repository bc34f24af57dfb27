"""Python stacks on a signal, for a stall where py-spy cannot attach.

vLLM calls every ``vllm.general_plugins`` entry point in each of its Python
processes (API server, engine core, workers). In the container (its run
directory exists) this one registers :mod:`faulthandler` on STACK_SIGNAL,
writing to a file of its own under the run directory's ``stack-handlers``.
The stall watchdog's capture (k3rocm.container.forensics) signals the
processes that have such a file when py-spy cannot read them: py-spy needs
SYS_PTRACE, which Docker's default capabilities, ``--cap-drop ALL`` and
Kubernetes' restricted Pod Security Standard withhold; a signal to a process
of the same user needs none.

faulthandler's handler is C: it writes every thread's Python frames even
while the main thread is blocked in a lock, a sleep or a native call. A
process stopped by SIGSTOP holds the signal and writes nothing until it is
continued (py-spy reads it anyway); frames are Python only, no native ones.
"""

from __future__ import annotations

import faulthandler
import os
from typing import BinaryIO

from k3rocm.common.run_files import (
    STACK_HANDLERS,
    STACK_SIGNAL,
    run_dir,
    stack_handler_file,
)

# The registration of this process: (pid, file). A forked child inherits the
# parent's handler and this record; its pid tells it to register its own.
_registered: tuple[int, BinaryIO] | None = None


def register() -> None:
    """vLLM's general-plugin hook: register the stack handler once per
    process; nothing outside the container, nothing where it cannot write."""
    global _registered
    pid = os.getpid()
    if _registered is not None and _registered[0] == pid:
        return  # vLLM loads its plugins more than once in some processes
    directory = run_dir()
    if not directory.is_dir():
        return  # a vLLM outside the container: no run directory to write in
    handlers = directory / STACK_HANDLERS
    try:
        handlers.mkdir(exist_ok=True)
        path = stack_handler_file(handlers, pid)
        if path is None:
            return
        # Unbuffered, and open for the process's life: the handler writes to
        # its descriptor directly.
        out = open(path, "ab", buffering=0)
    except OSError:
        return  # no stacks on a signal here; py-spy may still read them
    faulthandler.register(STACK_SIGNAL, file=out, all_threads=True)
    _registered = (pid, out)

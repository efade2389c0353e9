"""Every Python thread's stack into the journal on SIGUSR1: `systemctl kill -s USR1 vllm@NAME` (installed as part of
sitecustomize.py for vLLM units only).

Why: an instance can hold requests with every process up and /health 200: a KV load that never returns, a lock. Its
journal then says nothing about where it waits. Python's faulthandler (standard library) writes every thread's stack
from a C signal handler, without the GIL, so it works while a thread sits in a C call (Mooncake's transfer engine).
systemd sends the signal to every process of the unit (the API server and the engine core); each writes its own
stacks to stderr, the journal. vLLM 0.32 installs no handler for SIGUSR1 (its default action would end the process).
The drills dump a wedged instance's stacks this way before they fail (scripts/lab/drills.py, held_problems).
"""
import faulthandler
import signal
import sys

STACK_DUMP_SIGNAL = signal.SIGUSR1


def install_stack_dump(stream=None):
    """Register the dump for STACK_DUMP_SIGNAL; False where the platform has no such signal."""
    try:
        faulthandler.register(STACK_DUMP_SIGNAL, file=stream or sys.stderr, all_threads=True, chain=False)
    except (AttributeError, ValueError, OSError, RuntimeError):
        return False
    return True


install_stack_dump()

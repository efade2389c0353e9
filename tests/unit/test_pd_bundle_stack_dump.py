"""plugins/tools/pd_bundle_stack_dump.py: SIGUSR1 writes every thread's stack (a thread blocked in a call included)
instead of ending the process."""
import os
import subprocess
import sys
import textwrap

from conftest import TOOLS


def test_sigusr1_dumps_every_thread_and_the_process_lives_on():
    code = textwrap.dedent('''
        import os, signal, sys, threading, time
        sys.path.insert(0, sys.argv[1])
        import pd_bundle_stack_dump
        blocked = threading.Event()
        def wait_for_kv_that_never_comes():
            blocked.wait()
        threading.Thread(target=wait_for_kv_that_never_comes, name="kv-load", daemon=True).start()
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.5)
        print("still alive")
    ''')
    res = subprocess.run([sys.executable, '-c', code, str(TOOLS)], capture_output=True, text=True, timeout=30,
                         env=dict(os.environ, PYTHONFAULTHANDLER=''))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == 'still alive'
    assert 'wait_for_kv_that_never_comes' in res.stderr and 'Current thread' in res.stderr, res.stderr


def test_without_it_sigusr1_ends_the_process():
    """The control: the default action (what a vLLM unit had before)."""
    code = 'import os, signal, time; os.kill(os.getpid(), signal.SIGUSR1); time.sleep(1); print("alive")'
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=30)
    assert res.returncode == -10 and 'alive' not in res.stdout

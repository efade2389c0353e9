"""The ansible-core range of meta/runtime.yml, both ends tested.

Run by `make oldest-core-test` with the oldest end's venv (requirements-oldest-core.txt), after `make static` ran the
whole static tier on the newest (requirements.txt): the same render of inventory/prod, byte for byte (the committed
manifest), and the preflight cases (tests/preflight, run next by the same target). A venv that runs another
ansible-core fails here by name: a missing end is not a silent pass.
"""
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / 'tests'))
from conftest import render, render_manifest  # noqa: E402


def pinned(requirements):
    """The ansible-core==X.Y.Z pin of a requirements file."""
    m = re.search(r'^ansible-core==([0-9.]+)\s*$', (REPO / requirements).read_text(), re.M)
    assert m, '%s pins no ansible-core==X.Y.Z' % requirements
    return m.group(1)


def supported_range():
    """(oldest, below) of meta/runtime.yml's requires_ansible '>=A,<B'."""
    m = re.search(r'requires_ansible:\s*">=([0-9.]+),\s*<([0-9.]+)"', (REPO / 'meta' / 'runtime.yml').read_text())
    assert m, 'meta/runtime.yml: requires_ansible must read ">=OLDEST,<BELOW"'
    return m.group(1), m.group(2)


def minor(version):
    return tuple(int(p) for p in version.split('.')[:2])


def test_the_pins_are_the_ends_of_the_range():
    oldest, below = supported_range()
    old, new = pinned('requirements-oldest-core.txt'), pinned('requirements.txt')
    assert minor(old) == minor(oldest), 'requirements-oldest-core.txt pins %s; the range starts at %s' % (old, oldest)
    assert minor(new) < minor(below) and minor(new) > minor(old), \
        'requirements.txt pins %s: outside %s..<%s, or not newer than the oldest end' % (new, oldest, below)
    assert minor(new)[1] - minor(old)[1] >= 1, 'the range must span at least two minor releases'


def test_this_venv_runs_the_oldest_end():
    from ansible.release import __version__
    want = pinned('requirements-oldest-core.txt')
    assert __version__ == want, ('ansible-core %s is not tested here: this venv runs %s (make oldest-core-test makes '
                                 '.venv-oldest-core from requirements-oldest-core.txt)' % (want, __version__))


def test_prod_renders_byte_identically_on_the_oldest_end():
    with tempfile.TemporaryDirectory() as out:
        res = render(REPO / 'inventory' / 'prod', out)
        assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
        got = render_manifest(out)
    want = (REPO / 'tests' / 'render' / 'prod-render.sha256').read_text()
    diff = sorted(set(got.splitlines()) ^ set(want.splitlines()), key=lambda l: l.split('  ')[-1])
    assert got == want, 'inventory/prod renders differently on this ansible-core:\n' + '\n'.join(diff[:40])

"""tests/conftest.py --fail-on-skip and the Makefile's unit target: `make unit` prints every skip, and in CI a
skip that EXPECTED_SKIPS does not list fails the run (the netns tests below must run in CI, as root, with the
project venv's Mooncake wheel). Each case is a real pytest session on a few throwaway tests."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

TESTS = '''
import pytest

def test_runs():
    pass

@pytest.mark.skipif(True, reason="needs root for ip netns")
def test_needs_root():
    pass

@pytest.mark.xfail(reason="known", strict=True)
def test_known_bug():
    assert False
'''


def session(tmp_path, *args, expected=None, tests=TESTS):
    """A pytest run of `tests` with tests/conftest.py's skip gate and EXPECTED_SKIPS = expected: (rc, output)."""
    (tmp_path / 'conftest.py').write_text(textwrap.dedent('''
        import importlib.util
        spec = importlib.util.spec_from_file_location('pd_tests_conftest', %r)
        gate = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(gate)
        gate.EXPECTED_SKIPS.update(%r)
        pytest_addoption, pytest_configure = gate.pytest_addoption, gate.pytest_configure
        ''' % (str(REPO / 'tests' / 'conftest.py'), expected or {})))
    (tmp_path / 'test_some.py').write_text(tests)
    res = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-rs', '-p', 'no:cacheprovider', '--rootdir', str(tmp_path),
                          *args, str(tmp_path)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    return res.returncode, res.stdout + res.stderr


def test_an_unexpected_skip_fails_the_run(tmp_path):
    rc, out = session(tmp_path, '--fail-on-skip')
    assert rc == 1, out
    assert 'unexpected skips (--fail-on-skip: they fail this run)' in out
    assert 'SKIPPED test_some.py::test_needs_root: Skipped: needs root for ip netns' in out
    assert 'test_known_bug' not in out.split('unexpected skips')[1]  # an xfail is not a skip


def test_without_the_gate_a_skip_is_printed_and_passes(tmp_path):
    rc, out = session(tmp_path)
    assert rc == 0, out
    assert 'SKIPPED [1] test_some.py' in out and 'needs root for ip netns' in out  # -rs: the reason is printed
    assert 'unexpected skips' not in out


def test_a_listed_skip_passes_only_with_its_reason(tmp_path):
    rc, out = session(tmp_path, '--fail-on-skip', expected={'test_some.py::test_needs_root': 'needs root'})
    assert rc == 0, out
    rc, out = session(tmp_path, '--fail-on-skip', expected={'test_some.py::test_needs_root': 'no Python that imports'})
    assert rc == 1 and 'SKIPPED test_some.py::test_needs_root' in out, out


def test_a_module_skipped_at_collection_fails_too(tmp_path):
    tests = 'import pytest\npytest.skip("no mooncake", allow_module_level=True)\n\ndef test_x():\n    pass\n'
    rc, out = session(tmp_path, '--fail-on-skip', tests=tests)
    assert rc == 1 and 'SKIPPED test_some.py: Skipped: no mooncake' in out, out


def test_a_failure_keeps_its_exit_status(tmp_path):
    rc, out = session(tmp_path, '--fail-on-skip', tests=TESTS + '\ndef test_broken():\n    assert False\n')
    assert rc == 1 and '1 failed' in out, out


def make_unit(**env):
    """The unit target's command line (make -n) in an environment with only `env` of the gate's variables."""
    base = {k: v for k, v in os.environ.items() if k not in ('CI', 'PD_FAIL_ON_SKIP', 'MAKEFLAGS', 'MFLAGS')}
    res = subprocess.run(['make', '-n', '--no-print-directory', 'unit'], cwd=REPO, env=dict(base, **env),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return next(line for line in res.stdout.splitlines() if 'pytest' in line)


def test_make_unit_prints_skips_and_fails_on_one_in_ci():
    ci = make_unit(CI='true')
    assert ' -rs ' in ci and '--fail-on-skip' in ci and 'tests/unit tests/integration' in ci, ci
    local = make_unit()
    assert ' -rs ' in local and '--fail-on-skip' not in local, local
    assert '--fail-on-skip' in make_unit(PD_FAIL_ON_SKIP='1')

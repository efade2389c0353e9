"""Every venv the bundle built holds exactly its hash-locked set, and pip on the host refuses a wheel whose
bytes differ from the lock (roles/common/tasks/venv.yml: pip --require-hashes --no-deps -r the lock).

    pytest tests/infra/test_venvs.py --hosts='ansible://all' --ansible-inventory=molecule/default/inventory
"""
import re
import shlex

import pytest

from conftest import hvars, in_group, role_defaults

LOCK = 'pd-bundle-lock.txt'  # the installed copy of common_pip_lock_dir/<venv>.txt, in the venv (venv.yml)
VENV_DEFAULTS = role_defaults('vllm_venv', 'mooncake_venv', 'vllm_router_venv')


def canonical(name):
    return re.sub(r'[-_.]+', '-', name).lower()


def venvs(host):
    """The venv directories this host's roles build (bundle.VENVS: mooncake on engine hosts, vllm, router)."""
    v = dict(VENV_DEFAULTS, **hvars(host))
    # A vllm_spare host is provisioned like a vLLM host (issue 32): its venvs are ready for a scale-out.
    vllm = in_group(host, 'vllm_prefill') or in_group(host, 'vllm_decode') or in_group(host, 'vllm_spare')
    out = []
    if vllm or in_group(host, 'mooncake_master'):
        out.append(v['mooncake_venv'])
    if vllm:
        out.append(v['vllm_venv'])
    if in_group(host, 'vllm_router'):
        out.append(v['vllm_router_venv'])
    return out


def pins(text):
    return {canonical(ln.split()[0].split('==')[0]): ln.split()[0].split('==')[1]
            for ln in text.splitlines() if ln.strip() and not ln.startswith('#')}


def test_venv_holds_exactly_its_lock(host):
    if not venvs(host):
        pytest.skip('no venv on this host')
    for venv in venvs(host):
        locked = pins(host.file('%s/%s' % (venv, LOCK)).content_string)
        freeze = host.check_output('%s/bin/python -m pip freeze --all --exclude-editable' % venv)
        installed = pins('\n'.join(ln for ln in freeze.splitlines() if '==' in ln))
        for tool in ('pip', 'setuptools', 'wheel'):  # the venv's own bootstrap, not from the lock
            if tool not in locked:
                installed.pop(tool, None)
        assert installed == locked, '%s: installed differs from its lock: %s' % (
            venv, sorted(set(installed.items()) ^ set(locked.items())))


def test_pip_refuses_a_wheel_that_does_not_match_the_lock(host):
    """The first locked package with one hash digit changed: pip must refuse it (the tampered-wheelhouse case)."""
    if not venvs(host):
        pytest.skip('no venv on this host')
    v = hvars(host)
    venv = venvs(host)[0]
    first = next(ln for ln in host.file('%s/%s' % (venv, LOCK)).content_string.splitlines()
                 if ln.strip() and not ln.startswith('#'))
    digest = first.rsplit(':', 1)[1]
    tampered = first.rsplit(':', 1)[0] + ':' + ('0' if digest[0] != '0' else '1') + digest[1:]
    where = ('--no-index ' if v.get('common_pip_offline') else '') + (
        '--find-links %s ' % shlex.quote(str(v['common_pip_find_links'])) if v.get('common_pip_find_links') else '')
    cmd = ('f=$(mktemp) && echo %s > "$f" && %s/bin/python -m pip install --dry-run --ignore-installed --no-deps '
           '--require-hashes %s-r "$f"; r=$?; rm -f "$f"; exit $r' % (shlex.quote(tampered), venv, where))
    res = host.run(cmd)
    assert res.rc != 0 and 'DO NOT MATCH THE HASHES' in res.stdout + res.stderr, \
        'pip accepted a wheel whose hash differs from the lock: rc=%s %s' % (res.rc, (res.stdout + res.stderr)[-400:])

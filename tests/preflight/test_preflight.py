"""Preflight refuses bad inventories before anything is rendered (inventory/prod itself: tests/render).

Each case in cases.yml is inventory/prod with ONE mutation. render.yml must exit non-zero, name the variable
(and the host) in a preflight task's failure, and leave render_dir empty.
Each case in legal.yml is a legal variation of inventory/prod (one per class of refusal): preflight passes it
and its vLLM files render (render.yml --tags preflight,vllm), with the text it expects.
"""
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from conftest import apply_patch

REPO = Path(__file__).resolve().parents[2]
PROD = REPO / 'inventory' / 'prod'
CASES = yaml.safe_load((Path(__file__).with_name('cases.yml')).read_text())
LEGAL = yaml.safe_load((Path(__file__).with_name('legal.yml')).read_text())


def _ansible_playbook():
    cand = Path(sys.executable).with_name('ansible-playbook')
    return str(cand) if cand.exists() else 'ansible-playbook'


def run_render(inv, render_dir, tags=None):
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / 'ansible.cfg'), ANSIBLE_NOCOLOR='1',
               ANSIBLE_STDOUT_CALLBACK='ansible.builtin.json',
               ANSIBLE_DEPRECATION_WARNINGS='0',
               # the copied inventory/prod keeps its example vault (the router API key): TEST-ONLY password
               ANSIBLE_VAULT_PASSWORD_FILE=str(REPO / 'tests' / 'fixtures' / 'vault-pass-TEST-ONLY'))
    cmd = [_ansible_playbook(), 'playbooks/render.yml', '-i', str(inv), '-e', 'render_dir=%s' % render_dir]
    cmd += ['--tags', tags] if tags else []
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def failures(stdout):
    """(task name, host, message) of every failed result in the json callback's output."""
    # profile_tasks (ansible.cfg) prints timing lines before the json callback's single document.
    start = stdout.find('\n{\n') + 1 if not stdout.startswith('{') else 0
    doc, _ = json.JSONDecoder().raw_decode(stdout[start:])
    out = []
    for play in doc.get('plays', []):
        for task in play.get('tasks', []):
            name = task.get('task', {}).get('name', '')
            for host, res in task.get('hosts', {}).items():
                if not res.get('failed'):
                    continue
                msgs = [r.get('msg', '') for r in res.get('results', []) if r.get('failed')] or [res.get('msg', '')]
                out.extend((name, host, str(m)) for m in msgs)
    return out


def norm(text):
    return re.sub(r'\s+', ' ', text).strip()


def rendered_files(render_dir):
    return [p for p in Path(render_dir).rglob('*') if p.is_file()] if Path(render_dir).exists() else []


def _run_case(case, base, tags=None):
    inv = base / 'inventory'
    shutil.copytree(PROD, inv)
    apply_patch(inv, case['patch'])
    render_dir = base / 'render'
    res = run_render(inv, render_dir, tags)
    (base / 'ansible-output.json').write_text(res.stdout)  # kept by pytest's tmp dirs for reading later
    return res, render_dir


@pytest.fixture(scope='module')
def runs(request, tmp_path_factory):
    """The render run of every selected case, refused and legal (-k works), PREFLIGHT_JOBS at a time (default:
    2 per CPU); the legal ones (full vLLM renders, the slowest) first."""
    wanted = {item.callspec.params[k]['id'] for item in request.session.items if hasattr(item, 'callspec')
              for k in ('case', 'legal') if k in item.callspec.params}
    todo = ([(c, c.get('tags', 'preflight,vllm')) for c in LEGAL if c['id'] in wanted]
            + [(c, None) for c in CASES if c['id'] in wanted])
    jobs = int(os.environ.get('PREFLIGHT_JOBS', 2 * (os.cpu_count() or 1)))
    bases = {c['id']: tmp_path_factory.mktemp(c['id']) for c, _ in todo}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futs = {c['id']: pool.submit(_run_case, c, bases[c['id']], tags) for c, tags in todo}
        return {cid: fut.result() for cid, fut in futs.items()}


@pytest.mark.parametrize('case', CASES, ids=[c['id'] for c in CASES])
def test_preflight_refuses(case, runs):
    res, render_dir = runs[case['id']]
    assert res.returncode != 0, 'preflight accepted the mutation %s' % case['patch']
    fails = failures(res.stdout)
    report = '\n'.join('[%s] %s: %s' % f for f in fails) or (res.stdout[-3000:] + res.stderr[-3000:])
    assert fails, report
    assert all('Preflight |' in name for name, _, _ in fails), 'refused outside preflight:\n' + report
    text = norm(' '.join(m for _, _, m in fails))
    for expected in case['expect']:
        assert norm(expected) in text, 'missing %r in:\n%s' % (expected, report)
    assert not rendered_files(render_dir), 'files were rendered before the refusal'


@pytest.mark.parametrize('legal', LEGAL, ids=[c['id'] for c in LEGAL])
def test_legal_variation_renders(legal, runs):
    res, render_dir = runs[legal['id']]
    try:
        fails = failures(res.stdout)
    except ValueError:  # no json document: the tail of the output says why
        fails = []
    assert res.returncode == 0, '\n'.join('[%s] %s: %s' % f for f in fails) or res.stdout[-3000:] + res.stderr[-3000:]
    for rel, texts in legal['expect_files'].items():
        path = Path(render_dir) / rel
        assert path.is_file(), '%s was not rendered' % rel
        body = path.read_text()
        for text in texts:
            assert text in body, 'missing %r in %s:\n%s' % (text, rel, body)


def test_cases_are_distinct():
    ids = [c['id'] for c in CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 30
    assert not set(ids) & {c['id'] for c in LEGAL}
    patches = [json.dumps(c['patch'], sort_keys=True) for c in CASES]
    assert len(patches) == len(set(patches))


# inventory/prod itself passes preflight and renders: tests/render (its prod_render fixture asserts rc 0 and
# test_every_host_gets_its_files reads the files); not repeated here, where it cost one more full render.

"""The ansible-core range of meta/runtime.yml, both ends tested, through the collection as users install it.

`make core-range-test` runs this file twice, each time in a clean venv that holds only that end's ansible-core and
pytest (PD_CORE_END names the end): the collection is built from this repository, installed with ansible-galaxy into
an empty directory, and inventory/prod rendered through `pd_bundle.serving.render` from a directory with no
ansible.cfg: byte for byte the committed manifest (the repository's own render, tests/render), on the newest end
with every speed-up off (plugins/plugin_utils/private_core.py), on the oldest with them on. A venv that runs
another ansible-core fails here by name: a missing end is not a silent pass.
"""
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / 'tests'))
from conftest import VAULT_PASS_TEST_ONLY, render_manifest  # noqa: E402

# Each end's pin: its own requirements file (the newest end is the project's).
END_PINS = {'oldest': 'requirements-oldest-core.txt', 'newest': 'requirements.txt'}


def pinned(requirements):
    """The ansible-core==X.Y.Z pin of a requirements file."""
    m = re.search(r'^ansible-core==([0-9.]+)\s*(#.*)?$', (REPO / requirements).read_text(), re.M)
    assert m, '%s pins no ansible-core==X.Y.Z' % requirements
    return m.group(1)


def supported_range():
    """(oldest, below) of meta/runtime.yml's requires_ansible '>=A,<B'."""
    m = re.search(r'requires_ansible:\s*">=([0-9.]+),\s*<([0-9.]+)"', (REPO / 'meta' / 'runtime.yml').read_text())
    assert m, 'meta/runtime.yml: requires_ansible must read ">=OLDEST,<BELOW"'
    return m.group(1), m.group(2)


def minor(version):
    """(major, minor) of a version."""
    return tuple(int(p) for p in version.split('.')[:2])


def test_the_pins_are_the_ends_of_the_range():
    oldest, below = supported_range()
    old, new = pinned(END_PINS['oldest']), pinned(END_PINS['newest'])
    assert minor(old) == minor(oldest), '%s pins %s; the range starts at %s' % (END_PINS['oldest'], old, oldest)
    assert minor(old) < minor(new) < minor(below), \
        'requirements.txt pins %s: not newer than the oldest end %s (two minor releases at least), or not below %s' % (
            new, old, below)


def test_this_venv_runs_its_end():
    from ansible.release import __version__
    end = os.environ.get('PD_CORE_END')
    assert end in END_PINS, 'PD_CORE_END=%r: run this through `make core-range-test` (oldest or newest)' % end
    want = pinned(END_PINS[end])
    assert __version__ == want, ('ansible-core %s (the %s end) is not tested here: this venv runs %s (make '
                                 'core-range-test makes .venv-%s-core)' % (want, end, __version__, end))


def test_every_private_interface_resolves_on_this_end():
    """The speed-ups' private ansible-core interfaces (plugins/plugin_utils/private_core.py) exist here: the series
    is in TESTED_CORE, so the gate keeps them on."""
    import importlib.util
    spec = importlib.util.spec_from_file_location('pc', REPO / 'plugins' / 'plugin_utils' / 'private_core.py')
    pc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pc)
    assert pc.core_series() in pc.TESTED_CORE and pc.missing() == []


def galaxy_name():
    meta = yaml.safe_load((REPO / 'galaxy.yml').read_text())
    return meta['namespace'], meta['name'], meta['version']


def test_installed_collection_renders_prod_byte_identically():
    bindir = Path(sys.executable).parent
    ns, name, version = galaxy_name()
    # Only what a user's shell has: none of the repository's ANSIBLE_* settings, no ansible.cfg in the directory.
    env = {k: v for k, v in os.environ.items() if not k.startswith('ANSIBLE_')}
    deps = os.environ.get('PD_GALAXY_DEPS', '')
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        run = tmp / 'run'
        run.mkdir()
        build = subprocess.run([str(bindir / 'ansible-galaxy'), 'collection', 'build', '--output-path', str(tmp), str(REPO)],
                               cwd=run, env=env, capture_output=True, text=True, timeout=300)
        assert build.returncode == 0, build.stdout + build.stderr
        tarball = tmp / ('%s-%s-%s.tar.gz' % (ns, name, version))
        inst = subprocess.run([str(bindir / 'ansible-galaxy'), 'collection', 'install', '--no-deps', '-p',
                               str(tmp / 'collections'), str(tarball)],
                              cwd=run, env=env, capture_output=True, text=True, timeout=300)
        assert inst.returncode == 0, inst.stdout + inst.stderr
        installed = tmp / 'collections' / 'ansible_collections' / ns / name
        # The tarball carries what runs against a fleet, not the labs and tests (galaxy.yml build_ignore).
        assert (installed / 'playbooks' / 'render.yml').is_file() and not (installed / 'molecule').exists() \
            and not (installed / 'tests').exists() and not (installed / 'collections').exists()
        # The newest end with every speed-up off (PD_BUNDLE_SPEEDUPS, and the callback not enabled); the oldest with
        # them on as a user turns them on (README); the manifest is the clone's render with them on.
        if os.environ.get('PD_CORE_END') == 'newest':
            env['PD_BUNDLE_SPEEDUPS'] = 'off'
        else:
            env['ANSIBLE_CALLBACKS_ENABLED'] = '%s.%s.pd_bundle_speedups' % (ns, name)
        env.update(ANSIBLE_COLLECTIONS_PATH=os.pathsep.join(filter(None, [str(tmp / 'collections'), deps])),
                   # The inventory's pip-locks/ is data (README: what ansible.cfg sets for a clone).
                   ANSIBLE_INVENTORY_IGNORE_REGEX='pip-locks', ANSIBLE_NOCOLOR='1',
                   ANSIBLE_VAULT_PASSWORD_FILE=str(VAULT_PASS_TEST_ONLY))
        out = tmp / 'render'
        res = subprocess.run([str(bindir / 'ansible-playbook'), '%s.%s.render' % (ns, name),
                              '-i', str(REPO / 'inventory' / 'prod'), '-e', 'render_dir=%s' % out],
                             cwd=run, env=env, capture_output=True, text=True, timeout=900)
        assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
        got = render_manifest(out)
    want = (REPO / 'tests' / 'render' / 'prod-render.sha256').read_text()
    diff = sorted(set(got.splitlines()) ^ set(want.splitlines()), key=lambda l: l.split('  ')[-1])
    assert got == want, 'the installed collection renders inventory/prod differently:\n' + '\n'.join(diff[:40])

"""Every bundle unit takes its sandbox from the one macro in templates/common/hardening.j2: a unit
template that spelled out ProtectSystem= (or any other directive the macro sets) would drift from it."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MACRO = REPO / 'templates' / 'common' / 'hardening.j2'
UNITS = sorted((REPO / 'templates').glob('*/*.service.j2'))
IMPORT = "{% from 'common/hardening.j2' import hardening %}"


def macro_directives():
    """The Key= directives the macro writes (ProtectSystem, SystemCallFilter, DeviceAllow, ...)."""
    return set(re.findall(r'^([A-Z][A-Za-z]+)=', MACRO.read_text(), re.M))


def test_units_found():
    assert {u.name for u in UNITS} >= {'etcd.service.j2', 'pd-bundle-firewall.service.j2', 'mooncake-master.service.j2',
                                       'vllm@.service.j2', 'vllm-router.service.j2'}
    assert {'ProtectSystem', 'NoNewPrivileges', 'SystemCallFilter', 'DeviceAllow', 'UMask'} <= macro_directives()


def test_every_unit_uses_the_macro():
    for unit in UNITS:
        text = unit.read_text()
        assert IMPORT in text and '{{ hardening(' in text, '%s: does not import and call hardening()' % unit


def test_no_unit_repeats_a_macro_directive():
    keys = macro_directives()
    for unit in UNITS:
        repeated = [line for line in unit.read_text().splitlines()
                    if line.split('=', 1)[0] in keys]
        assert not repeated, '%s sets what the hardening macro owns: %s' % (unit, repeated)


def test_import_resolves_from_the_playbooks():
    # The template module searches the playbook's directory (playbooks/), not templates/ at the top.
    link = REPO / 'playbooks' / 'templates'
    assert link.is_symlink() and link.resolve() == (REPO / 'templates').resolve()

"""Render mode in one place: plugins/action/bundle_template.py's render_args (bundle_copy uses it too)."""
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location('bundle_template_action', REPO / 'plugins' / 'action' / 'bundle_template.py')
bt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bt)

ARGS = {'src': 'x.j2', 'dest': '/etc/vllm/p0.env', 'owner': 'root', 'group': 'vllm', 'mode': '0640',
        'validate': 'systemd-analyze verify %s'}


def test_a_real_run_is_plain_template():
    assert bt.render_args(ARGS, {'inventory_hostname': 'h1'}) is ARGS


def test_render_mode_writes_under_the_render_root(tmp_path):
    got = bt.render_args(ARGS, {'inventory_hostname': 'gpu-p1', 'render_dir': str(tmp_path)})
    assert got['dest'] == '%s/gpu-p1/etc/vllm/p0.env' % tmp_path
    assert (tmp_path / 'gpu-p1' / 'etc' / 'vllm').is_dir()
    assert not {'owner', 'group', 'validate'} & set(got) and got['mode'] == '0640'
    assert ARGS['dest'] == '/etc/vllm/p0.env'  # the task's own args are not changed in place


def test_unit_name_is_the_validators():
    assert bt.unit_name('sh -c ... _ %s vllm@verify.service', '/r/h/etc/systemd/system/vllm@.service') == 'vllm@verify.service'
    assert bt.unit_name('', '/r/h/etc/systemd/system/etcd.service') == 'etcd.service'


def test_systemd_ignoring_lines_are_refusals(tmp_path):
    """Render mode's verify: every "ignoring" of systemd-analyze verify, nothing for a clean unit."""
    unit = tmp_path / 'x.service'
    unit.write_text('[Service]\nExecStart=/bin/true\nRestartSec=10mins\nStateDirectory=/srv/x\n')
    lines = bt.systemd_ignoring(str(unit), 'x.service')
    assert lines is not None, 'systemd-analyze not installed: run scripts/install-deps.sh'
    assert len(lines) == 2 and all('ignoring' in line for line in lines) and str(tmp_path) not in ' '.join(lines)
    unit.write_text('[Service]\nExecStart=/bin/true\nRestartSec=10s\nStateDirectory=x\n')
    assert bt.systemd_ignoring(str(unit), 'x.service') == []


def test_render_mode_writes_the_file_itself(tmp_path):
    """Render mode's copy runs no module: write_rendered gives the copy module's result (mode as asked, a new file
    0666 less the umask, changed only when the bytes differ)."""
    import os
    dest = tmp_path / 'p0.env'
    got = bt.write_rendered(str(dest), b'A=1\n', '0640')
    assert dest.read_bytes() == b'A=1\n' and (dest.stat().st_mode & 0o777) == 0o640
    assert got['changed'] and got['mode'] == '0640'
    assert not bt.write_rendered(str(dest), b'A=1\n', '0640')['changed']
    assert bt.write_rendered(str(dest), b'A=2\n', 0o600)['changed'] and (dest.stat().st_mode & 0o777) == 0o600
    umask = os.umask(0o022)
    try:
        bt.write_rendered(str(tmp_path / 'new'), b'', None)
    finally:
        os.umask(umask)
    assert ((tmp_path / 'new').stat().st_mode & 0o777) == 0o644
    assert not list(tmp_path.glob('*.pd-render-tmp'))

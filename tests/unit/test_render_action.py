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


# What the copy action sends the file module after an unchanged checksum, and the stat it took just before.
FILE_ARGS = {'dest': '/etc/vllm/p0.env', '_original_basename': 'instance.env.j2', 'recurse': False, 'state': 'file',
             'owner': 'root', 'group': 'vllm', 'mode': '0640'}
STAT = {'exists': True, 'isreg': True, 'islnk': False, 'mode': '0640', 'pw_name': 'root', 'uid': 0,
        'gr_name': 'vllm', 'gid': 998}


def test_an_unchanged_file_with_its_owner_group_and_mode_needs_no_file_module():
    assert bt.file_is_noop(STAT, FILE_ARGS)
    assert bt.file_is_noop(STAT, dict(FILE_ARGS, owner='0', group='998', mode=0o640))  # ids and an int mode
    assert bt.file_is_noop(STAT, {k: v for k, v in FILE_ARGS.items() if k not in ('owner', 'group', 'mode')})


def test_any_difference_runs_the_file_module():
    """The host drifted (mode, owner, group), or the stat cannot tell (a link, no file, a symbolic mode, an
    argument file_is_noop does not compare): the file module runs and repairs or decides, as before."""
    for stat in (dict(STAT, mode='0644'), dict(STAT, pw_name='vllm', uid=998), dict(STAT, gr_name='root', gid=0),
                 dict(STAT, islnk=True), dict(STAT, isreg=False), dict(STAT, exists=False), None):
        assert not bt.file_is_noop(stat, FILE_ARGS), stat
    for args in (dict(FILE_ARGS, mode='u=rw,g=r'), dict(FILE_ARGS, mode='preserve'), dict(FILE_ARGS, setype='etc_t'),
                 dict(FILE_ARGS, attributes='+i'), dict(FILE_ARGS, state='link'), dict(FILE_ARGS, recurse=True)):
        assert not bt.file_is_noop(STAT, args), args


class _Copy:
    """Stands in for ansible's copy action: records the modules it is asked to run."""
    def __init__(self, stat, check_mode=False):
        self.ran, self._stat = [], stat
        self._task = type('T', (), {'check_mode': check_mode})()

    def _execute_remote_stat(self, path, all_vars, follow, tmp=None, checksum=True):
        return self._stat

    def _execute_module(self, module_name=None, module_args=None, *args, **kwargs):
        self.ran.append(module_name)
        return {'changed': True}


def test_the_copy_action_skips_only_the_no_op_file_module():
    for stat, check_mode, ran in ((STAT, False, []), (dict(STAT, mode='0600'), False, ['ansible.legacy.file']),
                                  (STAT, True, ['ansible.legacy.file'])):
        action = bt.skip_noop_file(_Copy(stat, check_mode))
        action._execute_remote_stat('/etc/vllm/p0.env', {}, False)
        res = action._execute_module('ansible.legacy.file', dict(FILE_ARGS))
        assert action.ran == ran and res['changed'] == bool(ran), (stat, check_mode)
        action._execute_module('ansible.legacy.copy', dict(FILE_ARGS))
        assert action.ran[-1] == 'ansible.legacy.copy'  # a changed file is copied as before


def test_a_loaded_copy_action_can_take_the_skipping_class():
    """ansible's own copy action class (managed __dict__ layout): the class swap skip_noop_file does must work on it,
    and bundle_copy's action is built the same way."""
    from ansible.plugins.action.copy import ActionModule as CopyAction
    action = bt.skip_noop_file(object.__new__(CopyAction))
    assert isinstance(action, CopyAction) and type(action)._execute_module is bt._module_unless_noop
    _bc = importlib.util.spec_from_file_location('bundle_copy_action', REPO / 'plugins' / 'action' / 'bundle_copy.py')
    bc = importlib.util.module_from_spec(_bc)
    _bc.loader.exec_module(bc)
    assert issubclass(bc.ActionModule, CopyAction) and bc.ActionModule._execute_remote_stat.__name__ == "_stat_noting"


class _Shell:
    tmpdir = None

    def join_path(self, *parts):
        return '/'.join(parts)

    def path_has_trailing_slash(self, path):
        return path.endswith('/')


class _CopyWithShell(_Copy):
    """_Copy with what _copy_lazy_tmp reads: the connection's shell, the temp dir maker, the base _copy_file."""
    def __init__(self, stat, check_mode=False):
        super().__init__(stat, check_mode)
        self._connection = type('C', (), {'_shell': _Shell()})()
        self.made_tmp = False

    def _make_tmp_path(self):
        self.made_tmp = True

    def _copy_file(self, source_full, source_rel, content, content_tempfile, dest, task_vars, follow):
        self.ran.append('copy')
        return {'changed': True}


def _lazy_copy(stat, parent, tmp_path):
    src = tmp_path / 'src'
    src.write_text('x')
    action = bt.skip_noop_file(_CopyWithShell(stat))
    action._pd_parent = bt.pop_parent_dir({'parent_dir': parent}) if parent else None
    res = action._copy_file(str(src), 'src', None, None, '/etc/systemd/system/x.service.d/pd.conf', {}, False)
    return action, res


def test_parent_dir_is_made_only_for_a_missing_file(tmp_path):
    action, res = _lazy_copy({'exists': False}, {'mode': '0755'}, tmp_path)
    assert action.ran == ['ansible.legacy.file', 'copy'] and action.made_tmp
    action, _ = _lazy_copy(dict(STAT, checksum='other'), {'mode': '0755'}, tmp_path)
    assert action.ran == ['copy']  # the file exists, so its directory does: no command for it
    action, _ = _lazy_copy({'exists': False}, None, tmp_path)
    assert action.ran == ['copy']  # no parent_dir: as ansible's copy (which fails on a missing directory)


def test_parent_dir_arguments():
    assert bt.pop_parent_dir({'parent_dir': {'mode': '0750', 'group': 'etcd'}}) == \
        {'state': 'directory', 'owner': 'root', 'group': 'etcd', 'mode': '0750'}
    args = {'dest': '/x', 'parent_dir': {'mode': '0755'}}
    bt.pop_parent_dir(args)
    assert args == {'dest': '/x'}  # never reaches the copy module, which would refuse it
    assert bt.pop_parent_dir({'dest': '/x'}) is None


def test_a_failed_parent_dir_stops_the_copy(tmp_path, monkeypatch):
    calls = []
    base = bt.skipping_noop_file(_CopyWithShell)._pd_base
    monkeypatch.setattr(base, '_execute_module', lambda self, module_name=None, module_args=None, **kw:
                        (calls.append((module_name, module_args)), {'failed': True, 'msg': 'no'})[1])
    src = tmp_path / 'src'
    src.write_text('x')
    action = bt.skip_noop_file(_CopyWithShell({'exists': False}))
    action._pd_parent = bt.pop_parent_dir({'parent_dir': {'mode': '0755'}})
    res = action._copy_file(str(src), 'src', None, None, '/etc/pd-bundle/firewall.nft', {}, False)
    assert res == {'failed': True, 'msg': 'no'} and 'copy' not in action.ran
    assert calls == [('ansible.legacy.file', {'state': 'directory', 'owner': 'root', 'group': 'root', 'mode': '0755',
                                              'path': '/etc/pd-bundle'})]

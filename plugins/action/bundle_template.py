"""ansible.builtin.template with render mode in one place (bundle_copy shares render_args).

In a real run (no render_dir) they are ansible.builtin.template / ansible.builtin.copy, unchanged.
In render mode (playbooks/render.yml -e render_dir=DIR) the file goes to DIR/<inventory_hostname><dest>
on the controller: parent directories are made, and owner, group and validate are dropped (the
controller's user owns the render, and validators such as systemd-analyze need the real paths).
A unit file (a task whose validate runs systemd-analyze verify) is verified in render mode too, on a copy
under the unit's own name: every line where systemd says it is "ignoring" a setting fails the task and
removes the rendered file (systemd would log it and carry on with a setup the inventory did not ask for).
The rendered file is written on the controller by the action itself (write_rendered): a copy module run per file,
whose module code Python compiles afresh each time, was a third of render mode's CPU time.

In a real run an unchanged file costs one command on its host (the stat), not four or five (skipping_noop_file):
- the copy action made a remote temporary directory before anything else (the remote home, mkdir, and rm -r at the
  end: three commands), which only a transfer uses: it is made when the stat shows that the file will be sent;
- after an unchanged checksum, the file module it ran to set owner, group and mode is skipped when the stat already
  shows the ones the task asks for (file_is_noop): it would change nothing.
A no-change re-run of the lab ran 551 commands on its hosts, most of them 3 or 4 for each file of the bundle.

parent_dir: {mode, owner, group} (optional; owner and group default to root): the file's directory is made with
these when the stat shows the file missing, instead of a task of its own that costs every run a command on every host
(a unit's drop-in directory, the firewall's). A directory that exists is left as it is.
"""
import os
import shutil
import subprocess
import tempfile

from ansible.plugins.action.template import ActionModule as TemplateAction
from ansible.utils.display import Display
from ansible.utils.hashing import checksum as local_checksum
# The gate of every private ansible-core use (one module: the speed-up callback reads the same).
from ansible_collections.pd_bundle.serving.plugins.plugin_utils import private_core


def speedups_on():
    """Whether the no-op file path and the render shortcut (both on private ansible-core interfaces) run here."""
    return private_core.speedups_on(Display().warning)

RENDER_DROPS = ('owner', 'group', 'validate', 'seuser', 'serole', 'setype', 'selevel')


def render_args(args, task_vars):
    """The task's args for this run: unchanged, or rewritten for render mode."""
    render_dir = task_vars.get('render_dir')
    if not render_dir:
        return args
    args = dict(args)
    for key in RENDER_DROPS:
        args.pop(key, None)
    dest = str(args['dest'])
    root = os.path.join(str(render_dir), str(task_vars['inventory_hostname']))
    args['dest'] = root + (dest if dest.startswith('/') else '/' + dest)
    os.makedirs(os.path.dirname(args['dest']), exist_ok=True)
    return args


def write_rendered(dest, data, mode=None):
    """Render mode's copy: DATA (bytes) to DEST on the controller, with MODE (octal string or int; none: 0666 less
    the umask, as the copy module gives a new file). Returns the copy action's result keys."""
    changed = True
    if os.path.isfile(dest):
        with open(dest, 'rb') as f:
            changed = f.read() != data
    if changed:
        tmp = dest + '.pd-render-tmp'
        with open(tmp, 'wb') as f:
            f.write(data)
        os.replace(tmp, dest)
    if mode is None:
        umask = os.umask(0)
        os.umask(umask)
        perm = 0o666 & ~umask
    else:
        perm = int(str(mode), 8) if not isinstance(mode, int) else mode
    os.chmod(dest, perm)
    return {'changed': changed, 'dest': dest, 'mode': '0%03o' % perm, 'size': len(data)}


class _RenderCopy:
    """Stands in for the copy action the template action ends with: writes its rendered temp file (src) to dest."""
    def __init__(self, task):
        self._args = task.args

    def run(self, task_vars=None):
        with open(self._args['src'], 'rb') as f:
            return write_rendered(self._args['dest'], f.read(), self._args.get('mode'))


class _RenderLoaders:
    """The action's shared plugin loaders, except that its copy action is _RenderCopy (render mode only)."""
    def __init__(self, real):
        self._real = real
        self.action_loader = self

    def get(self, name, *args, **kwargs):
        if name == 'ansible.legacy.copy':
            return _RenderCopy(kwargs['task'])
        return self._real.action_loader.get(name, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._real, name)


# The file-module arguments file_is_noop can compare with a stat; any other (SELinux context, attributes,
# access/modification times ...) runs the file module as before.
_NOOP_FILE_ARGS = frozenset(('dest', 'path', '_original_basename', 'recurse', 'state', 'mode', 'owner', 'group',
                             'follow', 'force', 'unsafe_writes', 'backup', 'validate', 'checksum', 'remote_src',
                             'local_follow', 'directory_mode'))


def file_is_noop(stat, args):
    """Whether the file module run with ARGS (what the copy action sends after an unchanged checksum) would change
    nothing on the file whose stat (the copy action's own, just taken) is STAT: a regular file, not a link, whose
    owner, group and octal mode are those asked for (an argument not given is left as it is by the module too)."""
    if not stat or not stat.get('exists') or not stat.get('isreg') or stat.get('islnk'):
        return False
    if set(args) - _NOOP_FILE_ARGS or args.get('state', 'file') != 'file' or args.get('recurse'):
        return False
    mode = args.get('mode')
    if mode is not None:
        if isinstance(mode, int):
            want = mode
        elif isinstance(mode, str) and mode.isdigit() and all(c in '01234567' for c in mode):
            want = int(mode, 8)
        else:
            return False  # symbolic (u=rw) or 'preserve': the module works it out
        if want != int(str(stat.get('mode', '')) or '-1', 8):
            return False
    for key, name_key, id_key in (('owner', 'pw_name', 'uid'), ('group', 'gr_name', 'gid')):
        want = args.get(key)
        if want is not None and str(want) not in (str(stat.get(name_key)), str(stat.get(id_key))):
            return False
    return True


def _stat_noting(self, path, all_vars, follow, tmp=None, checksum=True):
    """The remote stat, noted for the file module after it (_module_unless_noop); a stat _copy_lazy_tmp took of
    the same path just before is used once instead of a second one."""
    early = getattr(self, '_pd_early_stat', None)
    self._pd_early_stat = None
    if early and early[0] == (str(path), follow):
        stat = early[1]
    else:
        stat = self._pd_base._execute_remote_stat(self, path, all_vars, follow, tmp=tmp, checksum=checksum)
    self._pd_stats = dict(getattr(self, '_pd_stats', {}), **{str(path): stat})
    return stat


def _no_early_tmp(self):
    return False


def pop_parent_dir(args):
    """The task's parent_dir (see above) taken out of ARGS, with its defaults; None without one."""
    spec = args.pop('parent_dir', None)
    if not spec:
        return None
    return {'state': 'directory', 'owner': str(spec.get('owner', 'root')), 'group': str(spec.get('group', 'root')),
            'mode': str(spec['mode'])}


def _copy_lazy_tmp(self, source_full, source_rel, content, content_tempfile, dest, task_vars, follow):
    """The copy action's _copy_file, with the remote temporary directory made only when the file is sent: the dest
    is stat'ed first (the copy action then uses that stat), and an existing regular file with the source's checksum,
    or a check-mode run, needs none."""
    shell = self._connection._shell
    if shell.tmpdir is None and not self._task.check_mode:
        dest_file = shell.join_path(dest, source_rel) if shell.path_has_trailing_slash(dest) else dest
        stat = self._pd_base._execute_remote_stat(self, dest_file, all_vars=task_vars, follow=follow, checksum=True)
        self._pd_early_stat = ((str(dest_file), follow), stat)
        if not (stat.get('exists') and not stat.get('isdir') and stat.get('checksum') == local_checksum(source_full)):
            self._make_tmp_path()
        parent = getattr(self, '_pd_parent', None)
        if parent and not stat.get('exists'):
            made = self._pd_base._execute_module(self, module_name='ansible.legacy.file', task_vars=task_vars,
                                                 module_args=dict(parent, path=os.path.dirname(str(dest_file))))
            if made.get('failed'):
                return made
    return self._pd_base._copy_file(self, source_full, source_rel, content, content_tempfile, dest, task_vars, follow)


def _module_unless_noop(self, module_name=None, module_args=None, *args, **kwargs):
    if module_name == 'ansible.legacy.file' and module_args and not self._task.check_mode:
        dest = str(module_args.get('dest') or module_args.get('path') or '')
        stat = getattr(self, '_pd_stats', {}).get(dest)
        if file_is_noop(stat, module_args):
            return {'changed': False, 'path': dest, 'state': 'file', 'mode': stat.get('mode'),
                    'owner': stat.get('pw_name'), 'group': stat.get('gr_name'), 'uid': stat.get('uid'),
                    'gid': stat.get('gid')}
    return self._pd_base._execute_module(self, module_name, module_args, *args, **kwargs)


_SKIPPING = {}


def skipping_noop_file(cls):
    """CLS (a copy action class) whose file module run after an unchanged checksum is skipped when file_is_noop
    says it would change nothing. A direct subclass with no slots of its own, so that a loaded action can take it."""
    if cls not in _SKIPPING:
        _SKIPPING[cls] = type(cls.__name__, (cls,), {'__slots__': (), '__module__': cls.__module__, '_pd_base': cls,
                                                     '_early_needs_tmp_path': _no_early_tmp,
                                                     '_copy_file': _copy_lazy_tmp,
                                                     '_execute_remote_stat': _stat_noting,
                                                     '_execute_module': _module_unless_noop})
    return _SKIPPING[cls]


def skip_noop_file(action):
    """ACTION (a loaded copy action), now of its class skipping_noop_file."""
    action.__class__ = skipping_noop_file(type(action))
    return action


class _RealLoaders(_RenderLoaders):
    """The action's shared plugin loaders, except that its copy action skips a no-op file module (a real run) and
    makes the task's parent_dir when the file is missing."""
    def __init__(self, real, parent=None):
        super().__init__(real)
        self._parent = parent

    def get(self, name, *args, **kwargs):
        action = self._real.action_loader.get(name, *args, **kwargs)
        if name == 'ansible.legacy.copy' and action is not None:
            action = skip_noop_file(action)
            action._pd_parent = self._parent
        return action


SYSTEMD_VERIFY = 'systemd-analyze verify'


def unit_name(validate, dest):
    """The unit name the validator verifies the file as (its last word, e.g. vllm@verify.service), else dest's."""
    words = str(validate or '').split()
    return words[-1] if words and words[-1].endswith(('.service', '.timer', '.socket')) else os.path.basename(dest)


def systemd_ignoring(path, name):
    """The lines in which `systemd-analyze verify` says it is ignoring a setting of the unit file at path
    (verified as NAME in a scratch directory); None when systemd-analyze is not installed."""
    tool = shutil.which('systemd-analyze')
    if tool is None:
        return None
    scratch = tempfile.mkdtemp(prefix='pd-unit-verify-')
    try:
        unit = os.path.join(scratch, name)
        shutil.copyfile(path, unit)
        res = subprocess.run([tool, 'verify', unit], capture_output=True, text=True, timeout=60)
        return [line.replace(scratch + '/', '') for line in (res.stdout + res.stderr).splitlines() if 'ignoring' in line]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def make_parent(action, parent, dest, task_vars):
    """Stock speed (speed-ups off): the task's parent_dir made when missing, with the documented action-plugin call
    _execute_module (a stat, then the file module). A failed result, else None."""
    path = os.path.dirname(str(dest))
    stat = action._execute_module(module_name='ansible.legacy.stat', module_args={'path': path, 'get_checksum': False},
                                  task_vars=task_vars)
    if not stat.get('failed') and not stat.get('stat', {}).get('exists'):
        stat = action._execute_module(module_name='ansible.legacy.file', module_args=dict(parent, path=path),
                                      task_vars=task_vars)
    return stat if stat.get('failed') else None


class ActionModule(TemplateAction):
    def _early_needs_tmp_path(self):
        # With the speed-ups, the copy action it ends with makes one if it sends the file (_copy_lazy_tmp).
        return False if speedups_on() else super()._early_needs_tmp_path()

    def run(self, tmp=None, task_vars=None):
        validate = self._task.args.get('validate')
        rendering = bool((task_vars or {}).get('render_dir'))
        self._task.args = render_args(self._task.args, task_vars or {})
        parent = pop_parent_dir(self._task.args)  # render mode makes parents anyway
        if speedups_on():
            self._shared_loader_obj = _RenderLoaders(self._shared_loader_obj) if rendering else \
                _RealLoaders(self._shared_loader_obj, parent)
        elif parent and not rendering:
            failed = make_parent(self, parent, self._task.args['dest'], task_vars)
            if failed:
                return failed
        # Speed-ups off: the stock template action (render mode: its copy module writes under render_dir, on the
        # controller, since render.yml's connection is local).
        result = super().run(tmp, task_vars)
        if rendering and SYSTEMD_VERIFY in str(validate or '') and not result.get('failed'):
            dest = self._task.args['dest']
            lines = systemd_ignoring(dest, unit_name(validate, dest))
            if lines is None:
                result.setdefault('warnings', []).append('systemd-analyze is not installed: %s was not verified' % dest)
            elif lines:
                os.remove(dest)  # refused: the render keeps no unit systemd would run differently
                result.update(failed=True, changed=False,
                              msg='systemd-analyze verify of %s: %s. Fix: correct the inventory value that rendered this '
                                  'setting (systemd ignores it and carries on without it).' % (dest, '; '.join(lines)))
        return result

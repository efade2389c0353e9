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
"""
import os
import shutil
import subprocess
import tempfile

from ansible.plugins.action.template import ActionModule as TemplateAction

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


class ActionModule(TemplateAction):
    def run(self, tmp=None, task_vars=None):
        validate = self._task.args.get('validate')
        rendering = bool((task_vars or {}).get('render_dir'))
        self._task.args = render_args(self._task.args, task_vars or {})
        if rendering:
            self._shared_loader_obj = _RenderLoaders(self._shared_loader_obj)
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

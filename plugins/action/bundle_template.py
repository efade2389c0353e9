"""ansible.builtin.template with render mode in one place (bundle_copy shares render_args).

In a real run (no render_dir) they are ansible.builtin.template / ansible.builtin.copy, unchanged.
In render mode (playbooks/render.yml -e render_dir=DIR) the file goes to DIR/<inventory_hostname><dest>
on the controller: parent directories are made, and owner, group and validate are dropped (the
controller's user owns the render, and validators such as systemd-analyze need the real paths).
A unit file (a task whose validate runs systemd-analyze verify) is verified in render mode too, on a copy
under the unit's own name: every line where systemd says it is "ignoring" a setting fails the task and
removes the rendered file (systemd would log it and carry on with a setup the inventory did not ask for).
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
        self._task.args = render_args(self._task.args, task_vars or {})
        result = super().run(tmp, task_vars)
        if (task_vars or {}).get('render_dir') and SYSTEMD_VERIFY in str(validate or '') and not result.get('failed'):
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

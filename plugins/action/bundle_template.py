"""ansible.builtin.template with render mode in one place (bundle_copy shares render_args).

In a real run (no render_dir) they are ansible.builtin.template / ansible.builtin.copy, unchanged.
In render mode (playbooks/render.yml -e render_dir=DIR) the file goes to DIR/<inventory_hostname><dest>
on the controller: parent directories are made, and owner, group and validate are dropped (the
controller's user owns the render, and validators such as systemd-analyze need the real paths).
"""
import os

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


class ActionModule(TemplateAction):
    def run(self, tmp=None, task_vars=None):
        self._task.args = render_args(self._task.args, task_vars or {})
        return super().run(tmp, task_vars)

"""ansible.builtin.copy with render mode in one place (render_args: see bundle_template.py)."""
import importlib.util
import os

from ansible.plugins.action.copy import ActionModule as CopyAction

_spec = importlib.util.spec_from_file_location('bundle_template_action', os.path.join(os.path.dirname(__file__), 'bundle_template.py'))
_template = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_template)


class _BundleCopy(CopyAction):
    def run(self, tmp=None, task_vars=None):
        self._task.args = _template.render_args(self._task.args, task_vars or {})
        self._pd_parent = _template.pop_parent_dir(self._task.args)  # made when the file is missing (real run)
        args = self._task.args
        if (task_vars or {}).get('render_dir') and 'content' in args and 'src' not in args:
            # Render mode: written on the controller, no copy module run (bundle_template.write_rendered).
            content = args['content']
            data = content if isinstance(content, bytes) else str(content).encode('utf-8')
            return _template.write_rendered(args['dest'], data, args.get('mode'))
        return super().run(tmp, task_vars)


# A real run skips the file module after an unchanged checksum when it would change nothing (bundle_template.py).
ActionModule = _template.skipping_noop_file(_BundleCopy)

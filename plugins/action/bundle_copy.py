"""ansible.builtin.copy with render mode in one place (render_args: see bundle_template.py)."""
import importlib.util
import os

from ansible.plugins.action.copy import ActionModule as CopyAction

_spec = importlib.util.spec_from_file_location('bundle_template_action', os.path.join(os.path.dirname(__file__), 'bundle_template.py'))
_template = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_template)


class ActionModule(CopyAction):
    def run(self, tmp=None, task_vars=None):
        self._task.args = _template.render_args(self._task.args, task_vars or {})
        return super().run(tmp, task_vars)

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
        rendering = bool((task_vars or {}).get('render_dir'))
        if self._pd_parent and not rendering and not _template.speedups_on():
            failed = _template.make_parent(self, self._pd_parent, args['dest'], task_vars)
            if failed:
                return failed
        if rendering and 'content' in args and 'src' not in args:
            # Render mode: written on the controller, no copy module run (bundle_template.write_rendered).
            content = args['content']
            data = content if isinstance(content, bytes) else str(content).encode('utf-8')
            return _template.write_rendered(args['dest'], data, args.get('mode'))
        return super().run(tmp, task_vars)


# A real run skips the file module after an unchanged checksum when it would change nothing (bundle_template.py):
# a speed-up on private ansible-core interfaces, where plugins/plugin_utils/private_core.py lets it run.
ActionModule = _template.skipping_noop_file(_BundleCopy) if _template.speedups_on() else _BundleCopy

"""ansible.builtin.uri for the bundle's health waits and API calls, without a remote temporary directory.

uri's own action declares TRANSFERS_FILES = True (for src and a form-multipart body, which it sends from the
controller), so ansible-core makes a remote temporary directory before every call: three commands on the host (the
remote home, mkdir, rm -r) for a request that sends no file. The bundle's waits are uri calls on every re-run, most
of them retried until a unit is healthy.

This action is the uri module run with the documented action-plugin call (_execute_module) and TRANSFERS_FILES =
False: with pipelining the module needs no directory, and without it ansible-core makes one as it does for any
module. No private interface of ansible-core is touched, so it needs no version gate. The arguments are uri's,
passed through unchanged; a task that sends a file (src, or body_format form-multipart) is refused: it needs
ansible.builtin.uri itself.
"""
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase

DOCUMENTATION = """
name: bundle_uri
short_description: ansible.builtin.uri without a remote temporary directory (no file sent)
description:
  - Runs the ansible.builtin.uri module with the task's arguments, unchanged.
  - Refuses src (unless remote_src) and body_format form-multipart, which send a file from the controller.
"""

URI_MODULE = 'ansible.legacy.uri'


def sends_file(args):
    """Whether a uri task with ARGS sends a file from the controller (what uri's action transfers first)."""
    return ((bool(args.get('src')) and not boolean(args.get('remote_src', False), strict=False))
            or args.get('body_format') == 'form-multipart')


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        # As uri's own action: async allowed, no check mode (the request would be sent).
        self._supports_async = True
        self._supports_check_mode = False
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        if sends_file(args):
            result.update(failed=True, msg='pd_bundle.serving.bundle_uri sends no file from the controller (src or '
                                           'body_format form-multipart). Fix: use ansible.builtin.uri for this task.')
            return result
        result.update(self._execute_module(module_name=URI_MODULE, module_args=args, task_vars=task_vars,
                                           wrap_async=self._task.async_val))
        return result  # a temporary directory, if one was made, goes in cleanup() (ActionBase), as for uri

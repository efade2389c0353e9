"""Every private ansible-core interface the bundle touches, in one list, and the gate around them.

Only speed-ups use them (plugins/callback/pd_bundle_speedups.py, plugins/action/bundle_template.py's no-op file path
and render shortcut): without them the bundle does the same work, slower. They are on only where they were tested:
an ansible-core series of TESTED_CORE (CI runs both ends: make core-range-test) on which every entry of PRIVATE
resolves. Anywhere else, or with PD_BUNDLE_SPEEDUPS=off, they are off, with one warning line, and the bundle runs at
stock speed: the same files, the same results (a render with them off is byte-identical: tests/core_range).
tests/unit/test_private_core.py fails on a private attribute in plugins/ that PRIVATE does not list.
"""
import importlib
import os

# The ansible-core series (major, minor) the speed-ups were tested on.
TESTED_CORE = ((2, 18), (2, 19))

# (module, attribute path): what uses it. What would retire each: docs/upgrading.md.
PRIVATE = {
    ('ansible.executor.module_common', 'recursive_finder'): 'speed-ups: modules shipped with their bytecode (wrapped)',
    ('ansible.executor.module_common', '_add_module_to_zip'): 'speed-ups: modules shipped with their bytecode (wrapped)',
    ('ansible.executor.module_common', '_make_zinfo'): 'speed-ups: the .pyc entries of the module zip (called)',
    ('ansible.plugins.action', 'ActionBase._early_needs_tmp_path'):
        'bundle_template: no remote temporary directory before the stat shows the file will be sent (overridden)',
    ('ansible.plugins.action', 'ActionBase._execute_remote_stat'):
        'bundle_template: one stat of an unchanged file, reused (overridden and called)',
    ('ansible.plugins.action', 'ActionBase._execute_module'):
        'bundle_template: the no-op file module after an unchanged checksum skipped (overridden)',
    ('ansible.plugins.action', 'ActionBase._make_tmp_path'):
        'bundle_template: the remote temporary directory made only when the file is sent (called)',
    ('ansible.plugins.action', 'ActionBase._shared_loader_obj'):
        'bundle_template: the copy action the template action ends with, swapped (instance attribute)',
    ('ansible.plugins.action.copy', 'ActionModule._copy_file'):
        'bundle_template: the copy with its temporary directory made lazily (overridden)',
    ('ansible.plugins.connection', 'ConnectionBase._shell'): "bundle_template: the connection's shell (paths, tmpdir)",
    ('ansible.plugins.shell', 'ShellBase.tmpdir'): 'bundle_template: whether a temporary directory exists yet',
    ('ansible.plugins.shell', 'ShellBase.join_path'): 'bundle_template: the dest path as the copy action forms it',
    ('ansible.plugins.shell', 'ShellBase.path_has_trailing_slash'):
        'bundle_template: the dest path as the copy action forms it',
    ('ansible.plugins.loader', 'filter_loader'): 'speed-ups: filter plugins loaded once before the workers fork',
    ('ansible.plugins.loader', 'test_loader'): 'speed-ups: test plugins loaded once before the workers fork',
}

# Names an action plugin uses by design (ansible-core's documentation on developing action plugins): not private.
ACTION_PLUGIN_API = frozenset(('_task', '_connection', '_templar', '_loader', '_play_context', '_display',
                               '_supports_check_mode', '_supports_async'))

_STATE = {}


def core_series():
    from ansible.release import __version__
    return tuple(int(p) for p in __version__.split('.')[:2])


def _instance_attribute(cls, name):
    """Whether CLS's __init__ sets self.NAME (for attributes no class defines)."""
    import inspect
    try:
        source = inspect.getsource(cls.__init__)
    except (OSError, TypeError):
        return False
    return ('self.%s ' % name) in source or ('self.%s=' % name) in source


def resolves(module, path):
    """Whether MODULE's attribute PATH (dotted) exists on this ansible-core."""
    try:
        obj = importlib.import_module(module)
    except ImportError:
        return False
    parts = path.split('.')
    for i, part in enumerate(parts):
        if hasattr(obj, part):
            obj = getattr(obj, part)
        elif i == len(parts) - 1 and isinstance(obj, type) and _instance_attribute(obj, part):
            return True
        else:
            return False
    return True


def missing():
    """The PRIVATE entries this ansible-core lacks, as 'module.attribute'."""
    return sorted('%s.%s' % key for key in PRIVATE if not resolves(*key))


def why_off():
    """None when the speed-ups may run here, else the one line that says why not."""
    if os.environ.get('PD_BUNDLE_SPEEDUPS', '').lower() in ('0', 'off', 'false', 'no'):
        return 'pd_bundle speed-ups off (PD_BUNDLE_SPEEDUPS): stock ansible-core speed'
    series = core_series()
    if series not in TESTED_CORE:
        return ('pd_bundle speed-ups off: ansible-core %d.%d is not among the series they were tested on (%s); the '
                'bundle runs at stock speed' % (series + (', '.join('%d.%d' % s for s in TESTED_CORE),)))
    gone = missing()
    if gone:
        return ('pd_bundle speed-ups off: this ansible-core lacks %s; the bundle runs at stock speed'
                % ', '.join(gone))
    return None


def speedups_on(warn=None):
    """Whether the speed-ups run here (worked out once per process). WARN(line) is called with the reason the first
    time they are off."""
    if 'why' not in _STATE:
        _STATE['why'] = why_off()
    if _STATE['why'] and warn and not _STATE.get('warned'):
        _STATE['warned'] = True
        warn(_STATE['why'])
    return _STATE['why'] is None

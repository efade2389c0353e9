"""Every preflight check message is built by the one helper, preflight_checks.refuse, which enforces its shape:
the variable, the host and what to do ("Fix: ..."). The helper refuses a message without one of them; the checks
return nothing else (the source has no hand-formatted "Fix:" and every message of the bad-inventory fixtures of
tests/unit/test_preflight_checks.py and test_preflight_classes.py comes out of the helper)."""
import glob
import importlib.util
import os
import re

import pytest

import test_preflight_classes as classes
from test_preflight_checks import FAILING, REPO, pc, run

PACKAGE_DIR = os.path.join(REPO, 'plugins', 'plugin_utils', 'preflight')
# Every file of the checks: the filter plugin and every module of the package (the source scans read them all).
CHECK_FILES = [os.path.join(REPO, 'plugins', 'filter', 'preflight_checks.py')] + sorted(
    glob.glob(os.path.join(PACKAGE_DIR, '*.py')))


def test_refuse_builds_the_shape():
    assert pc.refuse('vllm_model', 'gpu-p1', ': no model', 'set it.', value='') == \
        'vllm_model="" on gpu-p1: no model. Fix: set it.'
    assert pc.refuse('x', 'h', 'is bad', 'y.', shown=3) == 'x=3 on h is bad. Fix: y.'
    assert pc.refuse('x', 'h', 'is bad', 'y.', shown=None) == 'x=None on h is bad. Fix: y.'
    assert pc.refuse('x', 'h', 'is bad', 'y.') == 'x on h is bad. Fix: y.'
    assert pc.refuse('x', 'h', 'x differs on h and g', 'y.', whole=True) == 'x differs on h and g. Fix: y.'


@pytest.mark.parametrize('var, host, fix', [('', 'gpu-p1', 'set it.'), (None, 'gpu-p1', 'set it.'),
                                            ('vllm_model', '', 'set it.'), ('vllm_model', None, 'set it.'),
                                            ('vllm_model', 'gpu-p1', ''), ('vllm_model', 'gpu-p1', '  '),
                                            ('vllm_model', 'gpu-p1', None)])
def test_refuse_refuses_a_message_without_variable_host_or_fix(var, host, fix):
    with pytest.raises(ValueError):
        pc.refuse(var, host, 'is bad', fix, value=1)
    with pytest.raises(ValueError):
        pc.refuse(var, host, 'vllm_model on gpu-p1 is bad', fix, whole=True)


def test_refuse_refuses_a_sentence_that_does_not_name_its_variable_and_host():
    with pytest.raises(ValueError):
        pc.refuse('vllm_model', 'gpu-p1', 'something on gpu-p1 is bad', 'fix it.', whole=True)
    with pytest.raises(ValueError):
        pc.refuse('vllm_model', 'gpu-p1', 'vllm_model is bad somewhere', 'fix it.', whole=True)


def test_no_hand_formatted_fix_in_the_checks():
    """Only refuse writes "Fix:" (and the runner's message for a check that crashed, which names the check)."""
    modules = {os.path.basename(p)[:-3] for p in CHECK_FILES if p.startswith(PACKAGE_DIR)}
    assert modules == {'__init__', 'core', 'runner'} | {m.__name__.rsplit('.', 1)[1] for m in pc.GROUPS}
    for path in CHECK_FILES:
        src = open(path).read()
        body = re.sub(r'\ndef refuse\(.*?\n(?=\S)', '\n', src, flags=re.S)  # the helper itself
        body = re.sub(r'\ndef _run\(.*?\n(?=\S)', '\n', body, flags=re.S)  # the crash message
        assert 'Fix' not in body, '%s: a message formatted by hand (use refuse): %s' % (
            path, [line.strip() for line in body.splitlines() if 'Fix' in line])


@pytest.fixture
def built(monkeypatch):
    """The messages refuse built while the test ran."""
    made = []
    real = pc.refuse

    def recording(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]
    patched = [m for m in (pc.core,) + pc.GROUPS if getattr(m, 'refuse', None) is real]
    assert len(patched) == 1 + len(pc.GROUPS)  # core and every group module (each imports refuse from core)
    for module in patched:
        monkeypatch.setattr(module, 'refuse', recording)
    return made


def _assert_built(msgs, made):
    assert msgs
    for m in msgs:
        assert m in made, 'a message not built by refuse: %r' % m
        assert re.search(r'\. Fix: \S', m), m


@pytest.mark.parametrize('check_id', sorted(FAILING))
def test_every_failing_fixture_message_comes_from_refuse(check_id, built):
    host, inv, groups, _ = FAILING[check_id]
    msgs = run(check_id, inv, groups, host)
    _assert_built(msgs, built)
    assert host in ' '.join(msgs)


CLASS_CASES = [(skip, case) for skip, table in (('pd_consistency', classes.PD_REFUSED),
                                                ('managed', classes.MANAGED_REFUSED),
                                                ('values', classes.VALUES_REFUSED),
                                                ('sandbox', classes.SANDBOX_REFUSED),
                                                ('addresses', classes.ADDRESSES_REFUSED))
               for case in sorted(table)]


@pytest.mark.parametrize('skip, case', CLASS_CASES)
def test_every_class_fixture_message_comes_from_refuse(skip, case, built):
    table = {'pd_consistency': classes.PD_REFUSED, 'managed': classes.MANAGED_REFUSED, 'values': classes.VALUES_REFUSED,
             'sandbox': classes.SANDBOX_REFUSED, 'addresses': classes.ADDRESSES_REFUSED}[skip]
    changes, _ = table[case]
    _assert_built(classes.run_class(skip, classes.inv_with(changes)), built)


def test_a_hand_formatted_message_is_caught(built):
    """The fixture test above can fail: a check that formats its own message is reported."""
    fake = {'id': 'hand_made', 'skip': 'x', 'scope': 'host', 'phase': 'host', 'role': None,
            'fn': lambda cfg, host, groups, specs: ['x=1 on %s is bad. Fix: y.' % host]}
    msgs = pc.runner._run([fake], ({}, 'h1', {}, []), 'h1')
    with pytest.raises(AssertionError):
        _assert_built(msgs, built)


# The order of CHECKS, and so of the messages of every filter: the order the checks had in the one file they were
# written in before the package (plugins/filter/preflight_checks.py), kept by GROUPS and each module's own order.
REGISTRATION_ORDER = [
    # settings
    'groups_required', 'groups_disjoint', 'groups_etcd_odd', 'groups_master_ha_etcd', 'booleans_master_ha',
    'booleans_master_offload', 'booleans_http_metadata', 'args_tokens', 'ips_host_ip', 'sizes_parse',
    'sizes_store_ssd_watermarks', 'sizes_store_config', 'firewall_sources', 'firewall_public_ports',
    'packages_versions', 'packages_wheel', 'packages_lock', 'packages_find_links', 'packages_vllm_cpu',
    'packages_cpu_guard', 'packages_tested_versions', 'model_set', 'model_src',
    # instances
    'gpus_count', 'instances_list', 'instances_names', 'instances_unique_names', 'instances_ports', 'gpus_exist',
    'gpus_unique', 'gpus_tp', 'instances_nics', 'instances_optional_keys', 'ports_are_ports', 'ports_engine_range',
    'ports_conflicts', 'ports_side_channel_range',
    # fleet
    'kv_mode_consistent', 'kv_mode_store_master', 'kv_mode_store_tier_master', 'kv_mode_store_ssd_tier',
    'kv_mode_store_metadata', 'kv_mode_ha_metadata', 'fleet_addresses', 'fleet_engine_ids', 'router_overrides',
    'pools_valid', 'pools_override',
    'pd_engine_equal', 'pd_tp_layout',
    # scope
    'role_scope',
    # managed
    'managed_vllm_args', 'managed_vllm_env', 'managed_store_config', 'managed_router_args', 'managed_master_args',
    'managed_etcd_env', 'values_vllm_args', 'values_settings', 'values_restart_batch', 'values_etcd_timing',
    'values_systemd', 'values_gid_index', 'router_implementation',
    # sandbox
    'sandbox_hidden', 'sandbox_read_only', 'sandbox_pool_models',
    # addresses
    'addresses_reachable', 'addresses_usable', 'addresses_distinct',
    # store
    'router_api_keys', 'store_keys', 'router_prefill_render',
    # entry
    'entry_keys', 'entry_rate_limits', 'entry_key_models', 'entry_prefix_balance', 'entry_tls_files', 'entry_vip',
    # tls
    'tls_paths',
    # monitoring
    'monitoring_settings', 'monitoring_grafana',
    # budget
    'timeout_budget_order', 'canary_heal_pool', 'canary_eject_pool',
]


def test_every_check_registers_once_in_the_documented_order():
    """Each check registers exactly once, in REGISTRATION_ORDER: the group modules in GROUPS order (their import
    order in the package's __init__), each in its own source order; each check is a function of its group module."""
    ids = [c['id'] for c in pc.CHECKS]
    assert len(ids) == len(set(ids)) == len(REGISTRATION_ORDER)
    assert ids == REGISTRATION_ORDER
    in_source = []
    for module in pc.GROUPS:
        src = open(module.__file__).read()
        in_source += re.findall(r'^@check\([^\n]*\)\ndef (\w+)\(', src, re.M)
        for c in pc.CHECKS:
            if c['fn'].__module__ == module.__name__:
                assert getattr(module, c['id']) is c['fn']
    assert in_source == REGISTRATION_ORDER
    assert [m.__name__.rsplit('.', 1)[1] for m in pc.GROUPS] == [
        'settings', 'instances', 'fleet', 'scope', 'managed', 'sandbox', 'addresses', 'store', 'entry', 'tls', 'monitoring', 'budget']
    for path in (os.path.join(PACKAGE_DIR, 'core.py'), os.path.join(PACKAGE_DIR, 'runner.py'),
                 os.path.join(REPO, 'plugins', 'filter', 'preflight_checks.py')):
        assert not re.search(r'^@check\(', open(path).read(), re.M), path


def test_a_group_module_registers_only_its_own_checks():
    """No group module imports another (a helper of two groups lives in core): importing one cannot run another's
    registrations out of order."""
    for module in pc.GROUPS:
        src = open(module.__file__).read()
        assert re.findall(r'^from \.(\w*) import', src, re.M) == ['core'], module.__name__


def test_the_filter_plugin_runs_the_package():
    """plugins/filter/preflight_checks.py, loaded by path as Ansible loads a filter file, gives the package's runner
    its filter names: one registry, not a copy."""
    spec = importlib.util.spec_from_file_location('preflight_checks_filter_under_test',
                                                  os.path.join(REPO, 'plugins', 'filter', 'preflight_checks.py'))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.FilterModule().filters() == {'preflight_host_errors': pc.host_errors,
                                            'preflight_hosts_errors': pc.hosts_errors,
                                            'preflight_fleet_errors': pc.fleet_errors,
                                            'preflight_checks_of': pc.checks_of}
    assert [c['id'] for c in pc.CHECKS] == REGISTRATION_ORDER


def test_siblings_load_finds_the_collection_by_name():
    """Outside Ansible (the lab scripts) siblings.load puts the collections root of its own file on sys.path, so a
    filter file that imports the collection by name (preflight_checks.py) loads: in a clone <repo>/collections, in an
    installed collection the directory above ansible_collections."""
    spec = importlib.util.spec_from_file_location('siblings_under_test', os.path.join(REPO, 'plugins', 'filter',
                                                                                     'siblings.py'))
    siblings = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(siblings)
    assert siblings.collections_root() == os.path.join(REPO, 'collections')
    assert os.path.isdir(os.path.join(siblings.collections_root(), 'ansible_collections', 'pd_bundle', 'serving',
                                      'plugins', 'plugin_utils', 'preflight'))
    installed = os.path.join(os.sep, 'home', 'u', '.ansible', 'collections')
    assert siblings.collections_root(os.path.join(installed, 'ansible_collections', 'pd_bundle', 'serving', 'plugins',
                                                  'filter')) == installed
    assert siblings.load('preflight_checks').FilterModule().filters()['preflight_host_errors'] is pc.host_errors

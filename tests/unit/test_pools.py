"""plugins/filter/pools.py: model pools, normalized from the inventory, and what preflight refuses in them."""
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location('pools_under_test', REPO / 'plugins' / 'filter' / 'pools.py')
pools = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pools)

GROUPS = {'vllm_prefill': ['p1', 'p2'], 'vllm_decode': ['d1', 'd2'], 'vllm_router': ['r1', 'r2']}
INSTANCES = {'p1': ['prefill0', 'prefill1'], 'p2': ['prefill0'], 'd1': ['decode0'], 'd2': ['decode0', 'decode1']}
DEFAULTS = {'vllm_model': '/srv/models/Qwen3-32B', 'vllm_served_model_name': 'qwen3-32b',
            'vllm_model_revision': '2025-04-29'}
TWO = [
    {'name': 'chat', 'model': '/srv/models/Qwen3-32B', 'served_model_name': 'qwen3-32b',
     'prefill': ['p1/prefill0', 'p2'], 'decode': ['d1', 'd2/decode0'], 'routers': ['r1'],
     'settings': {'vllm_max_model_len': 32768}},
    {'name': 'fast', 'model': 'Qwen/Qwen3-0.6B', 'model_revision': 'abc',
     'prefill': ['p1/prefill1'], 'decode': ['d2/decode1'], 'routers': ['r2']},
]


def test_an_inventory_without_pools_is_one_pool_of_everything_it_serves_today():
    [pool] = pools.bundle_pools(None, GROUPS, INSTANCES, DEFAULTS)
    assert pool['name'] == pools.DEFAULT_POOL and pool['implicit']
    assert pool['prefill'] == [['p1', 'prefill0'], ['p1', 'prefill1'], ['p2', 'prefill0']]
    assert pool['decode'] == [['d1', 'decode0'], ['d2', 'decode0'], ['d2', 'decode1']]
    assert pool['routers'] == ['r1', 'r2']
    assert (pool['model'], pool['served_model_name'], pool['model_revision']) == (
        '/srv/models/Qwen3-32B', 'qwen3-32b', '2025-04-29')
    assert pools.pool_problems(None, GROUPS, INSTANCES) == []
    assert pools.pool_problems([], GROUPS, INSTANCES) == []


def test_two_pools_resolve_hosts_and_instances_and_one_host_serves_both():
    chat, fast = pools.bundle_pools(TWO, GROUPS, INSTANCES, DEFAULTS)
    assert chat['prefill'] == [['p1', 'prefill0'], ['p2', 'prefill0']]
    assert chat['decode'] == [['d1', 'decode0'], ['d2', 'decode0']]
    assert fast['prefill'] == [['p1', 'prefill1']] and fast['decode'] == [['d2', 'decode1']]
    assert fast['served_model_name'] == 'Qwen3-0.6B'  # the model's last path part, as vllm_served_model_name
    assert chat['model_revision'] == '2025-04-29' and fast['model_revision'] == 'abc'
    all_pools = pools.bundle_pools(TWO, GROUPS, INSTANCES, DEFAULTS)
    assert pools.bundle_pool_of(all_pools, 'p1', 'prefill1') == 'fast'
    assert pools.bundle_pool_of(all_pools, 'p1', 'prefill0') == 'chat'
    assert pools.bundle_pool_of(all_pools, 'p1', 'nope') is None
    assert pools.bundle_router_pool(all_pools, 'r2')['name'] == 'fast'
    with pytest.raises(ValueError, match='in no pool'):
        pools.bundle_router_pool(all_pools, 'r9')
    endpoints = [{'host': h, 'name': n, 'url': 'http://%s/%s' % (h, n)} for h in ('p1', 'p2', 'd1', 'd2')
                 for n in INSTANCES[h]]
    assert [(e['host'], e['name']) for e in pools.bundle_pool_endpoints(endpoints, fast)] == [
        ('p1', 'prefill1'), ('d2', 'decode1')]
    [implicit] = pools.bundle_pools(None, GROUPS, INSTANCES, DEFAULTS)
    assert pools.bundle_pool_endpoints(endpoints, implicit) == endpoints  # a router of no pools: every instance
    assert pools.pool_problems(TWO, GROUPS, INSTANCES) == []


def _with(i, **changes):
    out = [dict(p) for p in TWO]
    out[i].update(changes)
    return [p for p in out if p.get('name') != 'DROP']


@pytest.mark.parametrize('bad,var,words', [
    (_with(1, name='chat'), 'vllm_pools[1].name', "as vllm_pools[0]"),
    (_with(1, name='Fast_Pool'), 'vllm_pools[1].name', 'not a pool name'),
    (_with(1, served_model_name='qwen3-32b'), 'vllm_pools[1].served_model_name', 'as pool chat'),
    (_with(1, model=None), 'vllm_pools[1].model', 'is not set'),
    (_with(1, prefill=['p1/prefill0']), 'vllm_pools[1].prefill', 'p1/prefill0 in pool chat too'),
    (_with(1, routers=['r1']), 'vllm_pools[1].routers', 'r1 in pool chat too'),
    (_with(1, decode=['p2']), 'vllm_pools[1].decode', 'not in the vllm_decode group'),
    (_with(1, decode=['d2/decode9']), 'vllm_pools[1].decode', 'does not have'),
    (_with(1, decode=[]), 'vllm_pools[1].decode', 'is empty'),
    (_with(1, routers=['r2/x']), 'vllm_pools[1].routers', 'a router is a host'),
    (_with(1, settings={'vllm_model': '/x'}), 'vllm_pools[1].settings.vllm_model', 'not a setting a pool may set'),
    (_with(1, settings={'etcd_version': '1'}), 'vllm_pools[1].settings.etcd_version', 'not a setting a pool may set'),
    (_with(1, gpus=[0]), 'vllm_pools[1]', 'unknown keys gpus'),
    (_with(1, name='DROP'), 'vllm_pools', 'in no pool'),
    ('chat', 'vllm_pools', 'not a list'),
])
def test_each_mistake_is_refused_with_the_variable_and_a_fix(bad, var, words):
    problems = pools.pool_problems(bad, GROUPS, INSTANCES)
    assert problems, 'no problem found in %r' % (bad,)
    hits = [p for p in problems if p[0] == var and words in p[2]]
    assert hits, problems
    for v, host, problem, fix in problems:
        assert v and host and problem and fix


def test_the_roles_read_the_pools_from_hostvars_and_each_instance_its_pool():
    hostvars = {h: {'vllm_instances': [{'name': n, 'port': 8100 + k} for k, n in enumerate(names)]}
                for h, names in INSTANCES.items()}
    hostvars['r1'] = hostvars['r2'] = {}
    assert pools.bundle_inventory_pools(TWO, GROUPS, hostvars, DEFAULTS) == pools.bundle_pools(
        TWO, GROUPS, INSTANCES, DEFAULTS)
    all_pools = pools.bundle_inventory_pools(TWO, GROUPS, hostvars, DEFAULTS)
    fast = pools.bundle_instance_pool(all_pools, 'p1', 'prefill1')
    assert (fast['name'], fast['model'], fast['served_model_name'], fast['settings']) == (
        'fast', 'Qwen/Qwen3-0.6B', 'Qwen3-0.6B', {})
    assert pools.bundle_instance_pool(all_pools, 'd1', 'decode0')['settings'] == {'vllm_max_model_len': 32768}
    [implicit] = pools.bundle_inventory_pools([], GROUPS, hostvars, DEFAULTS)
    assert pools.bundle_instance_pool([implicit], 'p2', 'prefill0')['served_model_name'] == 'qwen3-32b'
    with pytest.raises(ValueError, match='in no pool'):
        pools.bundle_instance_pool(all_pools, 'p2', 'prefill9')


def test_a_host_needs_the_models_of_its_pools_and_a_spare_host_its_own():
    two = [dict(TWO[0], model_src='/ctl/chat'), TWO[1]]
    all_pools = pools.bundle_pools(two, GROUPS, INSTANCES, DEFAULTS)
    own = {'model': '/srv/models/own', 'model_src': '/ctl/own'}
    assert pools.bundle_host_models(all_pools, 'p1', own) == [
        {'model': '/srv/models/Qwen3-32B', 'model_src': '/ctl/chat'}, {'model': 'Qwen/Qwen3-0.6B', 'model_src': ''}]
    assert pools.bundle_host_models(all_pools, 'p2', own) == [{'model': '/srv/models/Qwen3-32B', 'model_src': '/ctl/chat'}]
    assert pools.bundle_host_models(all_pools, 'spare', own) == [own]
    [implicit] = pools.bundle_pools(None, GROUPS, INSTANCES, dict(DEFAULTS, vllm_model_src='/ctl/m'))
    assert pools.bundle_host_models([implicit], 'd1', own) == [{'model': '/srv/models/Qwen3-32B', 'model_src': '/ctl/m'}]


def test_a_playbook_pool_choice_is_refused_with_the_variable_the_pools_and_the_fix():
    two = pools.bundle_pools(TWO, GROUPS, INSTANCES, DEFAULTS)
    one = pools.bundle_pools(None, GROUPS, INSTANCES, DEFAULTS)
    assert pools.bundle_pool_choice_problem(two, 'fast', 'rolling_restart_pool') == ''
    assert pools.bundle_pool_choice_problem(two, '', 'rolling_restart_pool') == ''  # every pool
    assert pools.bundle_pool_choice_problem(one, None, 'benchmark_pool', one=True) == ''  # the only pool
    assert pools.bundle_pool_choice_problem(one, 'default', 'benchmark_pool', one=True) == ''
    typo = pools.bundle_pool_choice_problem(two, 'fats', 'rolling_restart_pool')
    assert 'rolling_restart_pool=fats' in typo and 'chat, fast' in typo and 'leave rolling_restart_pool out' in typo
    unset = pools.bundle_pool_choice_problem(two, '', 'benchmark_pool', one=True)
    assert 'benchmark_pool is not set' in unset and '-e benchmark_pool=<pool>' in unset and 'chat, fast' in unset
    implicit = pools.bundle_pool_choice_problem(one, 'chat', 'benchmark_pool', one=True)
    assert 'the pools are default (no vllm_pools' in implicit and 'leave' not in implicit


def test_a_playbook_gets_the_pool_it_names_or_the_only_one():
    chat, fast = two = pools.bundle_pools(TWO, GROUPS, INSTANCES, DEFAULTS)
    [implicit] = one = pools.bundle_pools(None, GROUPS, INSTANCES, DEFAULTS)
    assert pools.bundle_pool_named(two, 'fast') is fast
    assert pools.bundle_pool_named(two, ' chat ') is chat
    assert pools.bundle_pool_named(two, '') is None
    assert pools.bundle_pool_named(one, '') is implicit and pools.bundle_pool_named(one, 'default') is implicit
    assert pools.bundle_pool_named(two[:1], None) is chat
    with pytest.raises(ValueError):
        pools.bundle_pool_named(two, 'nope')


def test_a_pool_selects_instances_per_instance_not_per_host():
    chat, fast = pools.bundle_pools(TWO, GROUPS, INSTANCES, DEFAULTS)
    [implicit] = pools.bundle_pools(None, GROUPS, INSTANCES, DEFAULTS)
    sel = pools.bundle_pool_instances
    # p1 serves prefill0 in chat and prefill1 in fast: a rolling restart of fast leaves chat's instance alone.
    assert sel(INSTANCES['p1'], 'p1', fast) == ['prefill1']
    assert sel(INSTANCES['p1'], 'p1', chat) == ['prefill0']
    assert sel(INSTANCES['d1'], 'd1', fast) == []
    assert sel(INSTANCES['d2'], 'd2', fast) == ['decode1']
    # No pool: every instance, as before pools; the implicit pool is every instance too.
    assert sel(INSTANCES['p1'], 'p1') == ['prefill0', 'prefill1']
    assert sel(INSTANCES['p1'], 'p1', implicit) == ['prefill0', 'prefill1']
    # rolling_restart_instances (a list or a comma string) narrows further, in vllm_instances order.
    assert sel(INSTANCES['d2'], 'd2', None, 'decode1,decode0') == ['decode0', 'decode1']
    assert sel(INSTANCES['d2'], 'd2', None, ['decode1']) == ['decode1']
    assert sel(INSTANCES['d2'], 'd2', chat, 'decode1') == []
    assert sel(INSTANCES['d2'], 'd2', None, []) == ['decode0', 'decode1']
    assert sel(INSTANCES['d2'], 'd2', None, '') == ['decode0', 'decode1']

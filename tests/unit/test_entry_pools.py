"""plugins/filter/entry_pools.py: the pools as the entry routes them, and the key -> pool access map."""
import importlib.util
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location('entry_pools_filter_under_test', REPO / 'plugins' / 'filter' / 'entry_pools.py')
ep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ep)

GROUPS = {'entry': ['e1'], 'vllm_router': ['r1', 'r2', 'r3']}
POOLS = [{'name': 'chat', 'model': '/srv/models/Qwen3-32B', 'served_model_name': 'qwen3-32b', 'routers': ['r1', 'r2']},
         {'name': 'fast', 'model': 'Qwen/Qwen3-0.6B', 'routers': ['r3']}]


def hostvars(pools, **router_vars):
    hv = {'e1': {'ansible_host': '10.0.0.5', 'vllm_pools': pools}}
    for i, h in enumerate(GROUPS['vllm_router'], 1):
        hv[h] = dict({'ansible_host': '10.0.0.4%d' % i, 'vllm_pools': pools}, **router_vars.get(h, {}))
    return hv


def test_without_pools_the_entry_has_none():
    assert ep.entry_pools('e1', hostvars(None), GROUPS, 'vllm_routers') == []
    assert ep.entry_pools('e1', hostvars([]), GROUPS, 'vllm_routers') == []


def test_each_pool_is_a_backend_of_its_own_routers():
    hv = hostvars(POOLS, r3={'vllm_router_port': 8100, 'vllm_router_host': '192.168.0.3'})
    out = ep.entry_pools('e1', hv, GROUPS, 'vllm_routers')
    port = out[0]['backends'][0]['port']  # the router role's default, not copied here
    assert out == [
        {'name': 'chat', 'backend': 'vllm_routers_chat', 'served_model_name': 'qwen3-32b',
         'backends': [{'host': 'r1', 'address': '10.0.0.41', 'port': port},
                      {'host': 'r2', 'address': '10.0.0.42', 'port': port}]},
        {'name': 'fast', 'backend': 'vllm_routers_fast', 'served_model_name': 'Qwen3-0.6B',  # the model's last part
         'backends': [{'host': 'r3', 'address': '192.168.0.3', 'port': 8100}]}]


def test_a_served_name_with_whitespace_cannot_be_routed():
    bad = [dict(POOLS[0], served_model_name='qwen 3')]
    with pytest.raises(AnsibleFilterError, match='whitespace'):
        ep.entry_pools('e1', hostvars(bad), GROUPS, 'vllm_routers')


def test_key_access_map():
    pools = [{'name': 'chat'}, {'name': 'fast'}]
    keys = {'alice': 'a', 'ci': 'c', 'ops': 'o'}
    assert ep.entry_key_pools({}, pools, keys) == []
    assert ep.entry_key_pools({'ci': ['fast', 'chat'], 'ops': []}, pools, keys) == [
        ['ci', 0], ['ci/chat', 1], ['ci/fast', 1], ['ops', 0]]
    with pytest.raises(AnsibleFilterError, match='not a pool'):
        ep.entry_key_pools({'ci': ['qwen3-32b']}, pools, keys)  # a model name, not a pool name
    with pytest.raises(AnsibleFilterError, match='not a key'):
        ep.entry_key_pools({'bob': ['chat']}, pools, keys)
    with pytest.raises(AnsibleFilterError, match='vllm_pools is not'):
        ep.entry_key_pools({'ci': ['chat']}, [], keys)  # never silently unrestricted


def test_the_backend_a_router_is_drained_in():
    assert ep.entry_router_backend('r3', 'e1', hostvars(None), GROUPS) == 'vllm_routers'
    assert ep.entry_router_backend('r3', 'e1', hostvars(POOLS), GROUPS) == 'vllm_routers_fast'
    assert ep.entry_router_backend('r1', 'e1', hostvars(POOLS[1:]), GROUPS) is None

"""plugins/filter/timeout_budget.py and the preflight class budget: the timeouts of the layers a request crosses must
give up outside in (the entry and the router after decode's longest wait for KV; the canary within its interval and
before the KV wait). Each refusal names the variables, the host and the fix; the defaults and inventory/prod pass;
docs/reliability.md's table is the module's own."""
import importlib.util
import re
from pathlib import Path

import pytest

from test_preflight_checks import ENTRY_GROUPS, GROUPS, SPECS, fleet, pc
from test_preflight_classes import inv_with

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location('timeout_budget_under_test', REPO / 'plugins' / 'filter' / 'timeout_budget.py')
tb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tb)

BUDGET_GROUPS = dict(ENTRY_GROUPS)


def budget(changes, groups=None):
    return pc.budget.timeout_budget_order(fleet(inv_with(changes)), 'ctl-1', groups or BUDGET_GROUPS, SPECS)


def test_haproxy_times_read_as_haproxy_does():
    assert tb.haproxy_seconds('600s') == 600
    assert tb.haproxy_seconds('10m') == 600
    assert tb.haproxy_seconds('1h') == 3600
    assert tb.haproxy_seconds('3000') == 3.0  # a bare number is milliseconds
    assert tb.haproxy_seconds(5000) == 5.0
    assert tb.haproxy_seconds('ten minutes') is None and tb.haproxy_seconds(True) is None


def test_kv_wait_is_the_abort_timeout_plus_vllms_receive_margin():
    assert tb.kv_wait_seconds(480) == 540
    assert tb.kv_wait_seconds('60') == 120
    assert tb.router_timeout_seconds(0) == tb.ROUTER_DEFAULT_TIMEOUT_S
    assert tb.router_timeout_seconds(300) == 300


def test_defaults_and_the_lab_pass():
    assert budget({}) == []
    lab = {h: {'vllm_mooncake_abort_request_timeout': 30} for h in ('gpu-p1', 'gpu-d1')}
    lab['router-1'] = {'vllm_router_canary_interval': 10, 'vllm_router_canary_timeout': 8,
                       'vllm_router_canary_heal_interval': 100}
    assert budget(lab) == []
    # healing off: the interval is not read
    assert budget({'router-1': {'vllm_router_canary_heal': False, 'vllm_router_canary_heal_interval': 10}}) == []


REFUSED = {
    # the example: the entry gives up on a request while decode still waits for its KV
    'entry_before_kv_wait': ({'entry-1': {'entry_timeout_server': '500s'}},
                             ['entry_timeout_server=500s on entry-1', 'decode may still wait for its KV for 540 s',
                              'vllm_mooncake_abort_request_timeout=480 on gpu-p1',
                              'Fix: lower vllm_mooncake_abort_request_timeout below 440 on gpu-p1, or raise '
                              'entry_timeout_server above 540s.']),
    'kv_wait_beyond_entry': ({'gpu-d1': {'vllm_mooncake_abort_request_timeout': 900}},
                             ['entry_timeout_server=600s on entry-1', 'for 960 s', 'vllm_mooncake_abort_request_timeout=900 on gpu-d1']),
    'router_before_kv_wait': ({'router-1': {'vllm_router_request_timeout_secs': 300}},
                              ['vllm_router_request_timeout_secs=300 on router-1 (300 s)', 'for 540 s',
                               'raise vllm_router_request_timeout_secs above 540']),
    'canary_timeout_not_below_interval': ({'router-1': {'vllm_router_canary_timeout': 30}},
                                          ['vllm_router_canary_timeout=30 on router-1 is not below vllm_router_canary_interval=6',
                                           'Fix: lower vllm_router_canary_timeout below 6']),
    'canary_interval_zero': ({'router-1': {'vllm_router_canary_interval': 0}},
                             ['vllm_router_canary_interval=0 on router-1', 'at least 1 s']),
    'canary_timeout_zero': ({'router-1': {'vllm_router_canary_timeout': 0}}, ['vllm_router_canary_timeout=0 on router-1']),
    'heal_interval_within_kv_wait': ({'router-1': {'vllm_router_canary_heal_interval': 300}},
                                     ['vllm_router_canary_heal_interval=300 on router-1 is not above the 540 s',
                                      'raise vllm_router_canary_heal_interval above 540']),
    'canary_beyond_kv_wait': ({'router-1': {'vllm_router_canary_timeout': 100, 'vllm_router_canary_interval': 200},
                               'gpu-p1': {'vllm_mooncake_abort_request_timeout': 30},
                               'gpu-d1': {'vllm_mooncake_abort_request_timeout': 30}},
                              ['vllm_router_canary_timeout=100 on router-1 is not below the 90 s decode may wait for KV']),
    # a canary through a store-tier prefill waits the store's bound first while the store is out
    'canary_within_store_bound': ({'gpu-p1': {'vllm_store_tier': True, 'vllm_store_tier_timeout_ms': 10000}},
                                  ['vllm_router_canary_timeout=3 on router-1 is not above the 10 s a store-tier prefill',
                                   'vllm_store_tier_timeout_ms=10000 on gpu-p1',
                                   'Fix: lower vllm_store_tier_timeout_ms below 3000 on gpu-p1, or raise '
                                   'vllm_router_canary_timeout above 10']),
}


def test_the_store_bound_counts_on_store_tier_prefills_only():
    assert budget({h: {'vllm_store_tier': True} for h in ('gpu-p1', 'gpu-d1')}) == []  # the default 2000 ms
    assert budget({'gpu-p1': {'vllm_store_tier': True, 'vllm_store_tier_timeout_ms': 2900}}) == []
    assert budget({'gpu-p1': {'vllm_store_tier': True, 'vllm_store_tier_timeout_ms': 0}}) == []  # no bound: no rule
    assert budget({'gpu-p1': {'vllm_store_tier_timeout_ms': 60000}}) == []  # no store tier
    assert budget({'gpu-d1': {'vllm_store_tier': True, 'vllm_store_tier_timeout_ms': 60000}}) == []  # a decode


@pytest.mark.parametrize('case', sorted(REFUSED))
def test_budget_refuses(case):
    changes, expected = REFUSED[case]
    text = ' '.join(budget(changes))
    for sub in expected + ['Fix:']:
        assert sub in text, 'missing %r in %s' % (sub, text)


def test_a_router_is_held_to_its_own_pools_hosts():
    """With pools, a router's request timeout is compared with its pool's vLLM hosts only."""
    groups = dict(BUDGET_GROUPS, vllm_prefill=['gpu-p1'], vllm_decode=['gpu-d1'], vllm_router=['router-1'])
    pools = [{'name': 'a', 'model': '/srv/models/m', 'prefill': ['gpu-p1'], 'decode': ['gpu-d1'], 'routers': ['router-1']}]
    slow = {h: {'vllm_pools': pools, 'vllm_mooncake_abort_request_timeout': 900} for h in ('gpu-p1', 'gpu-d1')}
    slow['router-1'] = {'vllm_pools': pools, 'vllm_router_request_timeout_secs': 2000, 'vllm_router_canary_heal_interval': 1000}
    slow['entry-1'] = slow['entry-2'] = {'entry_timeout_server': '20m'}
    assert budget(slow, groups) == []
    slow['router-1']['vllm_router_request_timeout_secs'] = 900
    assert 'vllm_router_request_timeout_secs=900 on router-1' in ' '.join(budget(slow, groups))


def test_budget_without_entry_or_router_hosts_checks_what_there_is():
    groups = dict(GROUPS)
    assert pc.budget.timeout_budget_order(fleet(inv_with({})), 'ctl-1', groups, SPECS) == []


def test_the_docs_table_is_the_modules_with_the_role_defaults():
    """docs/reliability.md's budget table: one row per layer, with the seconds the defaults give."""
    from test_preflight_checks import DEFAULTS
    rows = tb.timeout_budget(DEFAULTS, DEFAULTS, DEFAULTS)
    text = (REPO / 'docs' / 'reliability.md').read_text()
    section = text[text.index('## The timeout budget'):]
    for row in rows:
        line = next((ln for ln in section.splitlines() if ln.startswith('| %s |' % row['layer'])), None)
        assert line, 'docs/reliability.md has no budget row for %s' % row['layer']
        assert '`%s`' % row['variable'] in line and re.search(r'\| %s \|' % row['seconds'], line), (row, line)

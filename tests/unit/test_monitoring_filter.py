"""plugins/filter/monitoring.py (bundle_scrape_targets) on inventory/prod's structure (ansible-inventory --list, as
tests/render/test_render_prod.py reads it): every vLLM instance, router, master, SSD-tier store client, etcd member
and bundle host is a target exactly once, at the address and port the bundle's own definitions give (bundle_vllm_endpoints,
bundle_host_cfg, bundle_host_listeners), never a port of its own; etcd over https only when etcd runs TLS."""
import copy
import importlib.util
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def _load(name):
    spec = importlib.util.spec_from_file_location('mon_test_' + name, REPO / 'plugins' / 'filter' / ('%s.py' % name))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


mon = _load('monitoring')
bf = _load('bundle')
pl = _load('pools')

# tests/preflight/legal.yml's legal_two_model_pools on inventory/prod: gpu-p2 serves both pools, one instance each.
TWO_POOLS = [{'name': 'chat', 'model': '/srv/models/Qwen3-32B', 'prefill': ['gpu-p1', 'gpu-p2/prefill0'],
              'decode': ['gpu-d1'], 'routers': ['router-1', 'router-3']},
             {'name': 'fast', 'model': '/srv/models/Qwen3-4B', 'prefill': ['gpu-p2/prefill1'], 'decode': ['gpu-d2'],
              'routers': ['router-2', 'router-4']}]


@pytest.fixture(scope='module')
def prod(prod_inventory):
    return prod_inventory


def by_target(job):
    return {t['targets'][0]: t['labels'] for t in job['targets']}


def monitoring_ports(groups, hv, host):
    """{port: why} of the host's listeners the firewall opens to the monitoring class (bundle_host_listeners, with
    the roles roles/firewall/vars/main.yml gives it: store_ssd on bundle_store_ssd_hosts)."""
    roles = dict(bf.host_roles(host, groups), store_ssd=host in bf.store_ssd_hosts(groups, hv))
    return {int(e['port']): e['why'] for e in bf.host_listeners(bf.host_cfg(host, hv), roles)
            if 'monitoring' in e['sources']}


def test_every_vllm_instance_once_with_its_pool_and_name(prod):
    groups, hv = prod
    jobs = mon.scrape_targets(groups, hv)
    got = by_target(jobs['vllm'])
    want = {}
    for group, role in (('vllm_prefill', 'prefill'), ('vllm_decode', 'decode')):
        for e in bf.vllm_endpoints(groups[group], hv):
            want['%s:%s' % (e['ip'], e['port'])] = {'host': e['host'], 'instance': '%s/%s' % (e['host'], e['name']),
                                                   'role': role, 'vllm_instance': e['name']}
    assert got == want
    assert len(jobs['vllm']['targets']) == sum(len(hv[h]['vllm_instances'])
                                               for h in groups['vllm_prefill'] + groups['vllm_decode'])
    assert {'prefill', 'decode'} == {t['labels']['role'] for t in jobs['vllm']['targets']}


def test_with_pools_each_vllm_and_router_target_carries_its_pool(prod):
    groups, hv = prod
    pools = pl.bundle_inventory_pools(TWO_POOLS, groups, hv)
    assert mon.pooled(pools)
    jobs = mon.scrape_targets(groups, hv, pools)
    got = {t['labels']['instance']: t['labels']['pool'] for t in jobs['vllm']['targets']}
    assert got == {'gpu-p1/prefill0': 'chat', 'gpu-p1/prefill1': 'chat', 'gpu-p2/prefill0': 'chat',
                   'gpu-p2/prefill1': 'fast', 'gpu-d1/decode0': 'chat', 'gpu-d2/decode0': 'fast'}
    assert {t['labels']['host']: t['labels']['pool'] for t in jobs['vllm_router']['targets']} == {
        'router-1': 'chat', 'router-2': 'fast', 'router-3': 'chat', 'router-4': 'fast'}
    # The other jobs are shared by the pools: no pool label. Without the pool label, the targets are as before pools.
    assert not any('pool' in t['labels'] for job in mon.JOBS if job not in ('vllm', 'vllm_router')
                   for t in jobs[job]['targets'])
    strip = [{k: v for k, v in t['labels'].items() if k != 'pool'} for job in mon.JOBS for t in jobs[job]['targets']]
    assert strip == [t['labels'] for job in mon.JOBS for t in mon.scrape_targets(groups, hv)[job]['targets']]


def test_without_pools_no_target_carries_a_pool(prod):
    groups, hv = prod
    pools = pl.bundle_inventory_pools([], groups, hv)
    assert not mon.pooled(pools) and not mon.pooled(None)
    assert mon.scrape_targets(groups, hv, pools) == mon.scrape_targets(groups, hv)


@pytest.mark.parametrize('job,group', [('vllm', None), ('vllm_router', 'vllm_router'), ('mooncake_master', 'mooncake_master'),
                                       ('mooncake_store_client', 'vllm_prefill'), ('etcd', 'etcd'), ('node', None), ('prometheus', 'monitoring'),
                                       ('alertmanager', 'monitoring')])
def test_metrics_ports_are_the_ones_the_firewall_opens_to_monitoring(prod, job, group):
    """One fact, one place: each scraped metrics port is a listener of bundle_host_listeners with source monitoring."""
    groups, hv = prod
    jobs = mon.scrape_targets(groups, hv)
    assert jobs[job]['targets']
    for t in jobs[job]['targets']:
        host = t['labels']['host']
        port = int(t['targets'][0].rsplit(':', 1)[1])
        assert port in monitoring_ports(groups, hv, host), '%s %s: port %s is not open to monitoring' % (job, host, port)
        if group:
            assert host in groups[group]
    if group:
        assert sorted(t['labels']['host'] for t in jobs[job]['targets']) == sorted(groups[group])


def test_router_and_master_ports_follow_the_inventory(prod):
    groups, hv = prod
    hv = copy.deepcopy(hv)
    hv['router-2']['vllm_router_prometheus_port'] = 29555
    hv['ctl-2']['mooncake_master_metrics_port'] = 9555
    jobs = mon.scrape_targets(groups, hv)
    assert '10.10.0.42:29555' in by_target(jobs['vllm_router'])
    assert '10.10.0.12:9555' in by_target(jobs['mooncake_master'])
    assert '10.10.0.11:%s' % bf.host_cfg('ctl-1', hv)['mooncake_master_metrics_port'] in by_target(jobs['mooncake_master'])


def test_store_client_on_every_ssd_host_at_its_http_port(prod):
    """inventory/prod runs the SSD tier on every prefill host: each one's mooncake-store-client, nothing else."""
    groups, hv = prod
    assert bf.store_ssd_hosts(groups, hv) == groups['vllm_prefill']
    hv = copy.deepcopy(hv)
    hv['gpu-p2']['vllm_store_ssd_http_port'] = 9555
    got = by_target(mon.scrape_targets(groups, hv)['mooncake_store_client'])
    assert got == {'10.10.1.21:%s' % bf.host_cfg('gpu-p1', hv)['vllm_store_ssd_http_port']:
                   {'host': 'gpu-p1', 'instance': 'gpu-p1'},
                   '10.10.1.22:9555': {'host': 'gpu-p2', 'instance': 'gpu-p2'}}


@pytest.mark.parametrize('var', ['vllm_store_ssd', 'vllm_store_tier'])
def test_no_store_client_target_without_the_ssd_tier(prod, var):
    groups, hv = prod
    hv = copy.deepcopy(hv)
    hv['gpu-p2'][var] = False
    jobs = mon.scrape_targets(groups, hv)
    assert [t['labels']['host'] for t in jobs['mooncake_store_client']['targets']] == ['gpu-p1']
    assert mon.STORE_SSD_UNIT not in mon.monitored_units('gpu-p2', groups, hv)


def test_store_client_unit_is_monitored_on_ssd_hosts_only(prod):
    """UnitDown covers mooncake-store-client where it runs; its name is the vllm role's (roles/vllm/vars/main.yml)."""
    groups, hv = prod
    vllm_vars = yaml.safe_load((REPO / 'roles' / 'vllm' / 'vars' / 'main.yml').read_text())
    assert mon.STORE_SSD_UNIT == vllm_vars['_vllm_store_ssd_unit']
    for host in groups['vllm_prefill']:
        assert mon.STORE_SSD_UNIT in mon.monitored_units(host, groups, hv)
        assert '|%s)[.]service' % mon.STORE_SSD_UNIT in mon.unit_include(host, groups, hv)
    for host in groups['vllm_decode'] + groups['mooncake_master'] + groups['monitoring']:
        assert mon.STORE_SSD_UNIT not in mon.monitored_units(host, groups, hv)


def test_etcd_members_over_https_with_the_client_certificate_when_tls(prod):
    groups, hv = prod
    jobs = mon.scrape_targets(groups, hv)
    assert bf.host_cfg('ctl-1', hv)['etcd_tls_enabled'] is True  # inventory/prod runs etcd with TLS
    assert (jobs['etcd']['scheme'], jobs['etcd']['tls']) == ('https', True)
    assert sorted(by_target(jobs['etcd'])) == sorted('%s:%s' % (bf.host_ip(h, hv), bf.host_cfg(h, hv)['etcd_metrics_port'])
                                                     for h in groups['etcd'])


def test_etcd_over_plain_http_without_tls(prod):
    groups, hv = prod
    hv = copy.deepcopy(hv)
    for h in hv:
        hv[h]['etcd_tls_enabled'] = False
    jobs = mon.scrape_targets(groups, hv)
    assert (jobs['etcd']['scheme'], jobs['etcd']['tls']) == ('http', False)


def test_node_exporter_once_on_every_bundle_host(prod):
    groups, hv = prod
    jobs = mon.scrape_targets(groups, hv)
    hosts = [t['labels']['host'] for t in jobs['node']['targets']]
    bundle = {h for g in bf.BUNDLE_GROUPS for h in groups.get(g, [])}
    assert 'mon-1' in bundle
    assert sorted(hosts) == sorted(bundle) and len(hosts) == len(set(hosts))  # ctl-1 is etcd and master: once
    port = bf.host_cfg('ctl-1', hv)['monitoring_node_exporter_port']  # the monitoring role's default, read there
    assert all(t['targets'][0].endswith(':%s' % port) for t in jobs['node']['targets'])


def test_no_monitoring_group_no_prometheus_targets_and_with_one_its_hosts(prod):
    groups, hv = prod
    jobs = mon.scrape_targets(dict(groups, monitoring=[]), hv)
    assert jobs['prometheus']['targets'] == [] and jobs['alertmanager']['targets'] == []
    assert 'mon-1' not in str(jobs['node']['targets'])
    assert jobs['node']['targets'] == []  # no monitoring group: the bundle installs no node exporter
    assert groups['monitoring'] == ['mon-1']  # inventory/prod's
    hv = dict(hv, **{'mon-1': {'ansible_host': '10.10.9.5', 'monitoring_alertmanager_port': 9193}})
    jobs = mon.scrape_targets(groups, hv)
    assert list(by_target(jobs['prometheus'])) == ['10.10.9.5:%s' % bf.host_cfg('mon-1', hv)['monitoring_prometheus_port']]
    assert list(by_target(jobs['alertmanager'])) == ['10.10.9.5:9193']
    assert '10.10.9.5:%s' % bf.host_cfg('mon-1', hv)['monitoring_node_exporter_port'] in by_target(jobs['node'])


def test_every_job_and_label_shape(prod):
    groups, hv = prod
    jobs = mon.scrape_targets(groups, hv)
    assert list(jobs) == list(mon.JOBS)
    for name, job in jobs.items():
        assert job['metrics_path'] == '/metrics'
        for t in job['targets']:
            assert len(t['targets']) == 1 and {'host', 'instance'} <= set(t['labels'])
            assert all(isinstance(v, str) for v in t['labels'].values())


def test_empty_inventory_has_empty_jobs():
    jobs = mon.scrape_targets({}, {})
    assert all(job['targets'] == [] for job in jobs.values()) and jobs['etcd']['scheme'] == 'http'

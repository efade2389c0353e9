"""The monitoring role (an inventory with a monitoring group): a node exporter on every bundle host, Prometheus and
Alertmanager on the monitoring hosts, each listening on the host's cluster address; Prometheus scrapes every target
of plugins/filter/monitoring.py and they are all up; exactly one Mooncake master reports itself leader.
(Under load, every rule and dashboard query having data and an alert firing: the lab's monitoring step.)

    pytest tests/infra/test_monitoring.py --hosts='ansible://all' --ansible-inventory=molecule/default/inventory
"""
import json
import urllib.parse
from pathlib import Path

import pytest
import yaml

from conftest import (BUNDLE, groups, host_ip, hvars, in_group, listens_as_configured, other_host, role_defaults,
                      run_as_root, store_ssd_deployed, tcp_listeners, wait_until)

PORTS = role_defaults('monitoring_node_exporter_port', 'monitoring_prometheus_port', 'monitoring_alertmanager_port')
# prometheus.yml's path, as the role defines it (roles/monitoring/vars/main.yml).
CONFIG = yaml.safe_load((Path(__file__).resolve().parents[2] / 'roles' / 'monitoring' / 'vars' / 'main.yml').read_text())['_monitoring_config']


def port(host, name):
    return int(hvars(host).get(name, PORTS[name]))


def prometheus_get(host, path, **params):
    url = 'http://%s:%d%s?%s' % (host_ip(host), port(host, 'monitoring_prometheus_port'), path,
                                 urllib.parse.urlencode(params))
    return json.loads(host.check_output('curl -sS -m 20 %s', url))


def test_node_exporter_on_the_cluster_address(host):
    me = hvars(host)['inventory_hostname']
    if not BUNDLE.host_roles(me, groups(host))['node_exporter']:
        pytest.skip('no monitoring group, or not a bundle host')
    assert host.service('prometheus-node-exporter').is_running
    assert host.service('prometheus-node-exporter').is_enabled
    assert listens_as_configured(tcp_listeners(host), host_ip(host), port(host, 'monitoring_node_exporter_port'))


def test_prometheus_and_alertmanager_on_the_cluster_address(host):
    if not in_group(host, 'monitoring'):
        pytest.skip('not a monitoring host')
    socks = tcp_listeners(host)
    for unit, var in (('prometheus', 'monitoring_prometheus_port'), ('prometheus-alertmanager', 'monitoring_alertmanager_port')):
        assert host.service(unit).is_running and host.service(unit).is_enabled, unit
        assert listens_as_configured(socks, host_ip(host), port(host, var)), '%s not on %s:%s' % (unit, host_ip(host), port(host, var))
    # Alertmanager without its gossip port (9094): one listener each, nothing outside the firewall's table.
    assert not [p for _, p in socks if p == 9094]
    # The deployed configuration (with the rules and targets it names) passes promtool.
    assert run_as_root(host, 'promtool check config %s' % CONFIG).rc == 0


def test_every_target_is_up(host, request):
    """Every job of bundle_scrape_targets with hosts in the inventory has its targets in Prometheus, all up."""
    if not in_group(host, 'monitoring'):
        pytest.skip('not a monitoring host')
    g = groups(host)
    # The SSD tier's store clients: a setting of the prefill hosts, as deployed (a store-mode converge turns them off
    # without touching the inventory).
    ssd = [h for h in g.get('vllm_prefill', []) if store_ssd_deployed(other_host(request, h))]
    want = {'vllm': len(g.get('vllm_prefill', [])) > 0, 'vllm_router': bool(g.get('vllm_router')),
            'mooncake_master': bool(g.get('mooncake_master')), 'mooncake_store_client': bool(ssd),
            'etcd': bool(g.get('etcd')), 'node': True, 'prometheus': True, 'alertmanager': True}

    def targets():
        t = prometheus_get(host, '/api/v1/targets', state='active')['data']['activeTargets']
        return t if t and all(x['health'] == 'up' for x in t) else None
    got = wait_until(targets, timeout=120) or prometheus_get(host, '/api/v1/targets', state='active')['data']['activeTargets']
    down = ['%s %s: %s' % (t['labels']['job'], t['labels']['instance'], t.get('lastError')) for t in got if t['health'] != 'up']
    assert not down, 'targets down: %s' % down
    jobs = {t['labels']['job'] for t in got}
    assert not [j for j, present in want.items() if present and j not in jobs], sorted(jobs)
    nodes = sorted(t['labels']['host'] for t in got if t['labels']['job'] == 'node')
    assert nodes == sorted(BUNDLE.bundle_hosts(g)), 'a node exporter per bundle host'


def test_one_master_leads(host):
    """pd_mooncake_master_leader (each HA master's election watchdog, through the node exporter): one 1, the rest 0."""
    g = groups(host)
    if not in_group(host, 'monitoring') or len(g.get('mooncake_master', [])) < 2:
        pytest.skip('not a monitoring host of an inventory with HA masters')

    def leaders():
        res = prometheus_get(host, '/api/v1/query', query='pd_mooncake_master_leader')['data']['result']
        return res if len(res) == len(g['mooncake_master']) else None
    res = wait_until(leaders, timeout=60) or []
    values = sorted(int(float(r['value'][1])) for r in res)
    assert values == [0] * (len(g['mooncake_master']) - 1) + [1], res


# systemd-analyze security's exposure (0 locked down .. 10 unsafe): Debian's prometheus.service is 3.9 as shipped;
# Alertmanager and the node exporter ship with no sandbox (9.2) and get the bundle's (templates/monitoring/*-sandbox).
EXPOSURE_MAX = 4.5


def test_units_sandboxed_and_not_killed_by_it(host):
    """Each monitoring unit on the host scores at most EXPOSURE_MAX and has not been restarted: a syscall its
    sandbox forbids kills it with SIGSYS, and systemd restarts it (the node exporter's timex collector did)."""
    me = hvars(host)['inventory_hostname']
    units = (['prometheus-node-exporter'] if BUNDLE.host_roles(me, groups(host))['node_exporter'] else []) + \
        (['prometheus', 'prometheus-alertmanager'] if in_group(host, 'monitoring') else [])
    if not units:
        pytest.skip('no monitoring unit here')
    for unit in units:
        out = host.check_output('systemd-analyze security %s', unit)
        score = float(out.splitlines()[-1].split(':')[1].split()[0])
        assert score <= EXPOSURE_MAX, '%s: exposure %s' % (unit, score)
        assert host.check_output('systemctl show -p NRestarts --value %s', unit) == '0', '%s was restarted' % unit

"""etcd has every member healthy; the Mooncake masters have exactly one leader."""
import json

import pytest

from conftest import curl_json, deployed_etcd_env, etcdctl, groups, hvars, in_group, other_host, wait_until


def test_etcd_members_healthy(host):
    if not in_group(host, 'etcd'):
        pytest.skip('not an etcd member')
    v = hvars(host)
    n = len(groups(host)['etcd'])
    out = host.check_output(etcdctl(host) + ' endpoint health --cluster -w json')
    health = json.loads(out)
    assert len(health) == n and all(h['health'] for h in health), out
    scheme = deployed_etcd_env(host)['ETCD_ADVERTISE_CLIENT_URLS'].split('://')[0]
    loopback = '%s://127.0.0.1:%s' % (scheme, v['etcd_client_port'])
    members = json.loads(host.check_output(etcdctl(host, loopback) + ' member list -w json'))['members']
    assert len(members) == n


def test_master_one_leader(host, request):
    masters = groups(host).get('mooncake_master', [])
    if not masters or hvars(host)['inventory_hostname'] != masters[0]:
        pytest.skip('checked once, from the first master')
    roles = []
    for m in masters:
        mh = other_host(request, m)
        mv = hvars(mh)
        url = 'http://%s:%s/health' % (mv['common_host_ip'], mv['mooncake_master_metrics_port'])
        # Read on each master itself: the firewall opens the metrics port to monitoring only.
        health = wait_until(lambda: curl_json(mh, url), timeout=60)
        roles.append(health.get('role'))
        if health.get('role', 'leader') == 'leader':
            # Clients reach the store through the leader's RPC port.
            sock = other_host(request, m).socket('tcp://%s:%s' % (mv['common_host_ip'], mv['mooncake_master_rpc_port']))
            assert sock.is_listening, 'leader %s does not listen on its RPC port' % m
    if len(masters) > 1:
        assert sorted(roles) == ['leader'] + ['standby'] * (len(masters) - 1), roles
    else:
        assert roles[0] in ('leader', None), roles

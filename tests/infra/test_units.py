"""Every unit the host should run is active, enabled, and listening where configured."""
import pytest

from conftest import deployed_kv_config, hvars, in_group


def expected_units(host):
    v = hvars(host)
    units = []
    if in_group(host, 'etcd'):
        units.append(('etcd', [(v['common_host_ip'], v['etcd_client_port']), (v['common_host_ip'], 2380)]))
    if in_group(host, 'mooncake_master'):
        # The RPC port is served by the leader only (a standby waits in etcd): see test_control_plane.
        units.append(('mooncake-master', [(v['common_host_ip'], v['mooncake_master_metrics_port'])]))
    if in_group(host, 'vllm_prefill') or in_group(host, 'vllm_decode'):
        for inst in v.get('vllm_instances', []):
            socks = [('0.0.0.0', inst['port'])]
            if in_group(host, 'vllm_prefill') and \
                    deployed_kv_config(host, inst['name'])['kv_connector'] == 'MooncakeConnector':
                socks.append(('0.0.0.0', inst.get('bootstrap_port', v['vllm_default_bootstrap_port'])))
            units.append(('vllm@%s' % inst['name'], socks))
    if in_group(host, 'vllm_router'):
        units.append(('vllm-router', [('0.0.0.0', v['vllm_router_port']),
                                      (v['common_host_ip'], v['vllm_router_prometheus_port'])]))
    return units


def test_units_active_enabled_listening(host):
    units = expected_units(host)
    if not units:
        pytest.skip('no bundle units on this host')
    for unit, sockets in units:
        svc = host.service(unit)
        assert svc.is_running, '%s is not active' % unit
        assert svc.is_enabled, '%s is not enabled' % unit
        for ip, port in sockets:
            sock = host.socket('tcp://%s:%s' % (ip, port))
            any_sock = host.socket('tcp://0.0.0.0:%s' % port)
            assert sock.is_listening or any_sock.is_listening, '%s: nothing listens on %s:%s' % (unit, ip, port)


def test_units_run_as_dedicated_users(host):
    users = {'etcd': 'etcd', 'mooncake-master': 'mooncake', 'vllm-router': 'vllm-router'}
    for unit, _ in expected_units(host):
        want = users.get(unit, 'vllm' if unit.startswith('vllm@') else None)
        pid = host.check_output('systemctl show -p MainPID --value %s' % unit)
        assert pid != '0', '%s has no main process' % unit
        user = host.check_output('ps -o user= -p %s' % pid)
        assert user == want, '%s runs as %s, expected %s' % (unit, user, want)

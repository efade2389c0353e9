"""Every unit the host should run is active, enabled, and listening where configured."""
import shlex

import pytest

from conftest import (INSTANCE_KEY_FILE, ROUTER_KEY_FILE, bearer_secrets, check_output_masked, deployed_kv_config, groups, hvars, in_group,
                      instance_auth_headers, instance_key_configured, listens_as_configured,
                      router_key_configured, run_as_root, tcp_listeners)


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
            bind = str(v.get('vllm_bind_host', '0.0.0.0'))
            socks = [(bind, inst['port'])]
            if in_group(host, 'vllm_prefill') and \
                    deployed_kv_config(host, inst['name'])['kv_connector'] == 'MooncakeConnector':
                # Mooncake's bootstrap server binds every address.
                socks.append(('0.0.0.0', inst.get('bootstrap_port', v['vllm_default_bootstrap_port'])))
            units.append(('vllm@%s' % inst['name'], socks))
    if in_group(host, 'vllm_router'):
        # The router binds its cluster address unless vllm_router_host says otherwise (roles/vllm_router).
        units.append(('vllm-router', [(str(v.get('vllm_router_host') or v['common_host_ip']), v['vllm_router_port']),
                                      (v['common_host_ip'], v['vllm_router_prometheus_port'])]))
    return units


def test_units_active_enabled_listening(host):
    units = expected_units(host)
    if not units:
        pytest.skip('no bundle units on this host')
    socks = tcp_listeners(host)
    for unit, sockets in units:
        svc = host.service(unit)
        assert svc.is_running, '%s is not active' % unit
        assert svc.is_enabled, '%s is not enabled' % unit
        for ip, port in sockets:
            # The host's cluster IP exactly (not a wildcard bind), or a wildcard where one is configured.
            bound = sorted(a for a, p in socks if p == port)
            assert listens_as_configured(socks, ip, port), \
                '%s: nothing listens on %s:%s (bound on port %s: %s)' % (unit, ip, port, port, bound or 'nothing')


def test_units_run_as_dedicated_users(host):
    users = {'etcd': 'etcd', 'mooncake-master': 'mooncake', 'vllm-router': 'vllm-router'}
    for unit, _ in expected_units(host):
        want = users.get(unit, 'vllm' if unit.startswith('vllm@') else None)
        pid = host.check_output('systemctl show -p MainPID --value %s' % unit)
        assert pid != '0', '%s has no main process' % unit
        user = host.check_output('ps -o user= -p %s' % pid)
        assert user == want, '%s runs as %s, expected %s' % (unit, user, want)


def test_master_election_watchdog(host):
    """HA masters: the watchdog that restarts a master stuck as 'standby named leader' runs beside it."""
    v = hvars(host)
    masters = groups(host).get('mooncake_master', [])
    if v['inventory_hostname'] not in masters or len(masters) < 2 or not v.get('mooncake_master_watchdog', True):
        pytest.skip('not an HA master')
    unit = host.service('mooncake-master-watchdog')
    assert unit.is_running and unit.is_enabled
    assert host.file('/opt/mooncake/bin/mooncake-master-watchdog').mode == 0o755


# Runs on the host as root; reads the key (VAR= of the 0600 file PATH, argv[1:3]) from the file itself, so the
# key is never on the scanner's own argv. Prints the PIDs whose command line holds the key.
_CMDLINE_SCAN = r'''
import os, sys
path, var = sys.argv[1], sys.argv[2]
key = [l.split("=", 1)[1].strip() for l in open(path) if l.startswith(var + "=")][0]
assert key
hits = []
for pid in os.listdir("/proc"):
    if pid.isdigit() and pid != str(os.getpid()):
        try:
            cmd = open("/proc/%s/cmdline" % pid, "rb").read().replace(b"\0", b" ").decode(errors="ignore")
        except OSError:
            continue
        if key in cmd:
            hits.append("%s: %s" % (pid, cmd.replace(key, "<key>")[:120]))
print("\n".join(hits))
'''


def key_on_command_lines(host, path, var):
    """'PID: command line' of every live process whose argv holds the key VAR of PATH on host ('' = none)."""
    res = run_as_root(host, "python3 -c '%s' %s %s" % (_CMDLINE_SCAN.replace("'", "'\"'\"'"), path, var))
    assert res.rc == 0, res.stderr[-500:]
    return res.stdout.strip()


def test_router_key_on_no_command_line(host):
    """The worker key lives in a 0600 env file; no live process's /proc/<pid>/cmdline holds it."""
    v = hvars(host)
    if not in_group(host, 'vllm_router') or not router_key_configured(v):
        pytest.skip('no router key on this host')
    hits = key_on_command_lines(host, ROUTER_KEY_FILE, 'VLLM_ROUTER_API_KEY')
    assert hits == '', 'the router key is on a command line:\n' + hits


def vllm_instance_host(host, request):
    """Skips unless host runs vLLM instances that must demand a key (a router of the inventory has one)."""
    if not (in_group(host, 'vllm_prefill') or in_group(host, 'vllm_decode')) or not hvars(host).get('vllm_instances'):
        pytest.skip('no vLLM instance on this host')
    if not instance_key_configured(request, host):
        pytest.skip('no router key in the inventory: the instances demand none')


def test_instance_key_on_no_command_line(host, request):
    """The instances' key (VLLM_API_KEY) lives in a 0600 root env file; no live process's command line holds it."""
    vllm_instance_host(host, request)
    f = run_as_root(host, 'stat -c "%%a %%U" %s' % INSTANCE_KEY_FILE)
    assert f.rc == 0 and f.stdout.split() == ['600', 'root'], (INSTANCE_KEY_FILE, f.stdout, f.stderr[-300:])
    hits = key_on_command_lines(host, INSTANCE_KEY_FILE, 'VLLM_API_KEY')
    assert hits == '', 'the instances\' key is on a command line:\n' + hits


def test_instances_demand_the_key(host, request):
    """Every instance answers /v1/models 401 without the key and 200 with it (vLLM guards /v1/* only)."""
    vllm_instance_host(host, request)
    auth = instance_auth_headers(host, True)
    v = hvars(host)
    for inst in v['vllm_instances']:
        url = 'http://%s:%s/v1/models' % (inst.get('host_ip', v['common_host_ip']), inst['port'])
        code = "curl -sS -o /dev/null -w '%%{http_code}' -m 30%s " + url
        without = host.check_output(code % '')
        with_key = check_output_masked(host, code % ''.join(' -H %s' % shlex.quote(h) for h in auth), bearer_secrets(auth))
        assert (without, with_key) == ('401', '200'), \
            'vllm@%s: /v1/models answered %s without the key and %s with it (want 401, 200)' % (inst['name'], without, with_key)
        health = host.check_output("curl -sS -o /dev/null -w '%%{http_code}' -m 30 %s" % url.replace('/v1/models', '/health'))
        assert health == '200', 'vllm@%s: /health answered %s without a key (the routers\' health checks send none)' \
            % (inst['name'], health)

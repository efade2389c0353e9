"""Every unit the host should run is active, enabled, and listening where configured."""
import shlex

import pytest

from conftest import (BUNDLE, store_ssd_deployed, INSTANCE_KEY_FILE, ROUTER_KEY_FILE, bearer_secrets, check_output_masked, deployed_kv_config, groups, hvars, in_group, kv_connectors,
                      instance_auth_headers, instance_key_configured, listens_as_configured, parse_ss_rows,
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
            # The instance's own address (roles/vllm: vllm_bind_host empty), never a wildcard.
            ip = str(inst.get('host_ip') or v['common_host_ip'])
            socks = [(str(v.get('vllm_bind_host') or ip), inst['port'])]
            if in_group(host, 'vllm_prefill') and \
                    'MooncakeConnector' in kv_connectors(deployed_kv_config(host, inst['name'])):
                # vLLM writes 0.0.0.0 for the bootstrap server; the bundle's sitecustomize binds it to the address.
                socks.append((ip, inst.get('bootstrap_port', v['vllm_default_bootstrap_port'])))
            units.append(('vllm@%s' % inst['name'], socks))
    if store_ssd_deployed(host):
        # Mooncake's client binds its HTTP server on every address (no option); its service port on --host.
        units.append(('mooncake-store-client', [('0.0.0.0', v['vllm_store_ssd_http_port']),
                                                (v['common_host_ip'], v['vllm_store_ssd_service_port'])]))
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


# Wildcard binds the bundle cannot narrow, each written in an upstream binary: Mooncake's transfer engine
# RPC/handshake ports (its range; the firewall admits only the KV peers) and the master's HTTP metadata server
# (on only in store mode with the http metadata backend; the firewall admits only the store clients), and the SSD store
# client's HTTP server and disk-read RPC (mooncake_client: 0.0.0.0, the latter on a kernel-picked port; the firewall
# admits the monitoring hosts and the store clients).
UPSTREAM_WILDCARD_VARS = {'mooncake_rpc_port_min..mooncake_rpc_port_max', 'mooncake_master_http_metadata_port',
                          'vllm_store_ssd_http_port', 'vllm_store_ssd_offload_rpc_port_min..vllm_store_ssd_offload_rpc_port_max'}


def listener_table(host):
    """[(first, last, listener)] of the host's bundle listeners: bundle_host_listeners, the one port table the
    firewall and preflight read."""
    v = hvars(host)
    name = v['inventory_hostname']
    roles = dict(BUNDLE.host_roles(name, groups(host)), store_ssd=store_ssd_deployed(host))
    out = []
    for ls in BUNDLE.host_listeners(BUNDLE.host_cfg(name, {name: v}), roles):
        out.append((int(ls['port']), int(ls['last'] if ls['last'] is not None else ls['port']), ls))
    return out


def unlisted_listeners(socks, table, ephemeral_from, public_extra=()):
    """(wildcard binds not public by design, listeners on a port outside the table) of `ss` sockets. Loopback
    sockets are the host's own; a port at or above the kernel's ephemeral range on a cluster address is one a
    process opened for itself (gloo, Mooncake's data sockets), closed by the default-drop firewall."""
    def entry(port):
        return next((ls for first, last, ls in table if first <= port <= last), None)
    wild, unlisted = [], []
    for addr, port in sorted(socks):
        if addr.startswith('127.') or addr == '::1':
            continue
        ls = entry(port)
        public = (ls is not None and ls['public']) or port in public_extra
        if addr in ('0.0.0.0', '::') and not public and not (ls and set(ls['vars']) & UPSTREAM_WILDCARD_VARS):
            wild.append('%s:%s (%s)' % (addr, port, ls['vars'][0] if ls else 'not in the table'))
        elif ls is None and not public and port < ephemeral_from:
            unlisted.append('%s:%s' % (addr, port))
    return wild, unlisted


def test_no_listener_outside_the_table(host):
    """A unit that opens a port the table does not list fails here (the firewall would drop it, silently), and
    a wildcard bind fails unless the port is public by design or an upstream one the bundle cannot narrow."""
    v = hvars(host)
    public_extra = [int(p) for p in v.get('firewall_public_tcp_ports', []) if str(p).isdigit()] + [22]
    ephemeral_from = int(host.file('/proc/sys/net/ipv4/ip_local_port_range').content_string.split()[0])
    wild, unlisted = unlisted_listeners(tcp_listeners(host), listener_table(host), ephemeral_from, public_extra)
    assert wild == [], 'wildcard binds that are not public by design: %s' % wild
    assert unlisted == [], 'listeners on ports outside the bundle\'s table (bundle_host_listeners): %s' % unlisted


# The listen backlog of a ZMQ socket that sets none (libzmq's default ZMQ_BACKLOG): the MooncakeConnector side
# channel's ROUTER socket. On the lab's prefill hosts it is the only TCP listener with it; the workers' other
# listeners on high ports of the cluster address (torch/gloo) use the kernel's (4096), the transfer engine's 128.
ZMQ_BACKLOG = 100


def side_channel_problems(rows, pinned):
    """(missing, stray) of a prefill host's side channels. rows: parse_ss_rows of the host; pinned: {instance name:
    (its address, its pinned side-channel ports)} of the instances that run the P2P connector.
    missing: 'name: ip:port' of every pinned port nothing listens on at the instance's address; a side channel that
    lost its pin listens elsewhere, and the decodes, which cache its address, fail every pull after a restart.
    stray: 'ip:port' of the listeners with the side channel's signature (ZMQ's backlog, a cluster address) on no
    pinned port: a side channel on a random port (pyzmq picks from 49152, in or above the kernel's ephemeral range,
    which unlisted_listeners leaves alone), closed to the decodes by the firewall."""
    listening = {(addr, port) for addr, port, _ in rows}
    missing = ['%s: %s:%s' % (name, ip, port) for name, (ip, ports) in sorted(pinned.items()) for port in ports
               if (ip, port) not in listening]
    every_pinned = {port for _, ports in pinned.values() for port in ports}
    stray = ['%s:%s' % (addr, port) for addr, port, backlog in sorted(rows)
             if backlog == ZMQ_BACKLOG and port not in every_pinned and not (addr.startswith('127.') or addr == '::1')]
    return missing, stray


def pinned_side_channels(host):
    """{instance name: (address, pinned side-channel ports)} of the host's prefill instances that run the P2P
    connector (MooncakeConnector, per their deployed env file); the ports from bundle.vllm_side_channel_ports, the
    address the one their bootstrap server binds (VLLM_HOST_IP)."""
    v = hvars(host)
    if not in_group(host, 'vllm_prefill'):
        return {}
    name = v['inventory_hostname']
    cfg = BUNDLE.host_cfg(name, {name: v})
    instances = cfg.get('vllm_instances') or []
    return {i['name']: (str(i.get('host_ip') or v['common_host_ip']),
                        BUNDLE.vllm_side_channel_ports(i, instances, cfg.get('vllm_side_channel_port_base')))
            for i in instances if 'MooncakeConnector' in kv_connectors(deployed_kv_config(host, i['name']))}


def test_side_channels_listen_on_their_pinned_ports(host):
    """P2P prefill instances: every pinned side-channel port listens at the instance's address, and no side channel
    listens anywhere else (a random port above the ephemeral start, where the table check does not look)."""
    pinned = pinned_side_channels(host)
    if not pinned:
        pytest.skip('no prefill instance running the P2P connector here')
    missing, stray = side_channel_problems(parse_ss_rows(host.check_output('ss -Htln')), pinned)
    assert missing == [], 'pinned side-channel ports nothing listens on (vllm_side_channel_port_base, ' \
        'plugins/tools/pd_bundle_side_channel.py): %s; side-channel-like listeners elsewhere: %s' % (missing, stray)
    assert stray == [], 'side channels (ZMQ listeners) on ports that are not pinned: %s' % stray


def test_units_run_as_dedicated_users(host):
    users = {'etcd': 'etcd', 'mooncake-master': 'mooncake', 'vllm-router': 'vllm-router',
             'mooncake-store-client': hvars(host).get('vllm_store_ssd_user', 'mooncake-store')}
    for unit, _ in expected_units(host):
        want = users.get(unit, 'vllm' if unit.startswith('vllm@') else None)
        pid = host.check_output('systemctl show -p MainPID --value %s' % unit)
        assert pid != '0', '%s has no main process' % unit
        # user:32: ps cuts a name longer than 8 characters to 7 and a '+'
        user = host.check_output('ps -o user:32= -p %s' % pid)
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

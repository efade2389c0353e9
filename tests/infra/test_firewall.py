"""The firewall role: each bundle port answers the hosts that use it and nobody else.

    pytest tests/infra/test_firewall.py --hosts='ansible://all' --ansible-inventory=molecule/default/inventory

Per host: the unit is active and the table inet pd_bundle is loaded (loopback and replies first); each
protected port that listens there connects from every other bundle host of an allowed source kind and from no
other (the issue's table, written out in protected_ports: e.g. the vLLM API from the routers only, etcd's plain
listener from the masters and store clients only, the master's metrics from monitoring only); and an outsider
connects to none of them. The outsider is a throwaway container on the lab's docker network (PD_LAB_NETWORK,
default pd-lab) that this module starts and removes. Against a real cluster (no docker CLI, or no such network)
that part is skipped; where the lab network exists, an outsider that cannot start (no image, no free address,
docker down) FAILS the test: the lab's firewall claim would otherwise go unchecked.
"""
import ipaddress
import json
import os
import shlex
import shutil
import subprocess
import uuid

import pytest

from conftest import deployed_kv_config, groups, hvars, in_group, other_host, read_root_file, role_defaults

TABLE = 'pd_bundle'
UNIT = 'pd-bundle-firewall.service'
# Role defaults the inventory may leave out (read from roles/*/defaults/main.yml).
PORT_DEFAULTS = role_defaults(
    'etcd_client_port', 'etcd_peer_port', 'mooncake_master_rpc_port', 'mooncake_master_metrics_port',
    'mooncake_master_http_metadata_port', 'vllm_default_bootstrap_port', 'vllm_router_port',
    'vllm_router_prometheus_port', 'entry_port', 'etcd_tls_enabled', 'etcd_metrics_port',
    'monitoring_prometheus_port', 'monitoring_alertmanager_port', 'monitoring_node_exporter_port',
)
KV = {'vllm_prefill', 'vllm_decode'}
STORE_CONNECTOR = 'MooncakeStoreConnector'
NETWORK = os.environ.get('PD_LAB_NETWORK', 'pd-lab')
IMAGE = os.environ.get('PD_LAB_IMAGE', 'local/pd-lab-debian12:latest')
OUTSIDER_IPS = ['172.30.0.99', '172.30.0.98', '172.30.0.97']
# The lab's monitoring source (firewall_extra_sources in molecule/default/inventory/group_vars/all.yml).
MONITOR_IPS = ['172.30.0.96']

# Connects to each (ip, port) with a short timeout; prints {"ip:port": open|refused|timeout|error:N}.
PROBE = r'''
import json, socket, sys
out = {}
for ip, port in json.loads(sys.argv[1]):
    s = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect((ip, port))
        r = "open"
    except ConnectionRefusedError:
        r = "refused"
    except socket.timeout:
        r = "timeout"
    except OSError as e:
        r = "error:%s" % e.errno
    finally:
        s.close()
    out["%s:%d" % (ip, port)] = r
print(json.dumps(out))
'''


def probe_cmd(pairs):
    return 'python3 -c %s %s' % (shlex.quote(PROBE), shlex.quote(json.dumps(pairs)))


def cfg(host):
    v = dict(PORT_DEFAULTS)
    v.update(hvars(host))
    return v


def enabled(host):
    return str(hvars(host).get('firewall_enabled', False)).lower() in ('true', '1', 'yes', 'on')


def protected_ports(host):
    """[(port, what, allowed)] of this host's fixed protected ports (ranges are not probed). allowed: the source
    kinds that may connect: inventory groups, 'store' (Mooncake store clients), 'monitoring'."""
    v = cfg(host)
    ports = []
    if in_group(host, 'etcd'):
        tls = str(v.get('etcd_tls_enabled')).lower() in ('true', '1', 'yes', 'on')
        # Without TLS, Mooncake's etcd clients use the client port; with it, only members (the client certificate).
        ports += [(v['etcd_client_port'], 'etcd client', {'etcd'} if tls else {'etcd', 'mooncake_master', 'store'}),
                  (v['etcd_peer_port'], 'etcd peer', {'etcd'}),
                  (v['etcd_metrics_port'], 'etcd metrics', {'monitoring'})]
        # etcd's plain listener for Mooncake (only while etcd TLS is on; probed only where it listens).
        ports.append((v.get('etcd_mooncake_client_port', 2479), 'etcd plain client for Mooncake', {'mooncake_master', 'store'}))
    if in_group(host, 'mooncake_master'):
        ports += [(v['mooncake_master_rpc_port'], 'master RPC', {'store'}),
                  (v['mooncake_master_metrics_port'], 'master metrics', {'monitoring'})]
        # The HTTP metadata server runs only where a store-mode instance reads it (the deployed flags say).
        if '--enable_http_metadata_server=true' in read_root_file(host, '/etc/mooncake/master.env'):
            ports.append((v['mooncake_master_http_metadata_port'], 'master HTTP metadata', {'store'}))
    if in_group(host, 'vllm_prefill') or in_group(host, 'vllm_decode'):
        for inst in v.get('vllm_instances', []):
            ports.append((inst['port'], 'vLLM %s' % inst['name'], {'vllm_router', 'monitoring'}))
            if in_group(host, 'vllm_prefill'):
                # vllm-router queries each prefill's bootstrap server when it starts
                ports.append((inst.get('bootstrap_port', v['vllm_default_bootstrap_port']), 'bootstrap %s' % inst['name'],
                              KV | {'vllm_router'}))
    if in_group(host, 'vllm_router'):
        ports.append((v['vllm_router_prometheus_port'], 'router Prometheus', {'monitoring'}))
    if in_group(host, 'monitoring'):
        ports += [(v['monitoring_prometheus_port'], 'Prometheus', {'monitoring'}),
                  (v['monitoring_alertmanager_port'], 'Alertmanager', {'monitoring'})]
    if groups(host).get('monitoring'):  # a node exporter on every bundle host
        ports.append((v['monitoring_node_exporter_port'], 'node exporter', {'monitoring'}))
    return [(int(p), what, allowed) for p, what, allowed in ports]


def store_clients(host, request):
    """The hosts that run a Mooncake store client: every prefill/decode host when the deployment is in store mode
    (the first decode's deployed kv-transfer-config), else verify.yml's store round trip (first prefill and decode)."""
    g = groups(host)
    vllm = g.get('vllm_prefill', []) + g.get('vllm_decode', [])
    if not g.get('mooncake_master') or not g.get('vllm_decode'):
        return set()
    d = other_host(request, g['vllm_decode'][0])
    if deployed_kv_config(d, hvars(d)['vllm_instances'][0]['name']).get('kv_connector') == STORE_CONNECTOR:
        return set(vllm)
    return set(g.get('vllm_prefill', [])[:1] + g['vllm_decode'][:1])


def listening(host, ports):
    """The entries of `ports` something listens on (any address) on the host."""
    out = host.check_output('ss -Htln')
    bound = {int(line.split()[3].rsplit(':', 1)[1]) for line in out.splitlines() if line.strip()}
    return [e for e in ports if e[0] in bound]


class NoOutsider:
    """Why there is no outsider: `fatal` when the lab network exists (a failure), else a skip."""

    def __init__(self, reason, fatal):
        self.reason, self.fatal = reason, fatal


def start_outsider(docker, network=NETWORK, image=IMAGE, ips=OUTSIDER_IPS):
    """(container name, ip, subnets) of a started outsider, or NoOutsider."""
    if not docker:
        return NoOutsider('no docker CLI here (a real cluster): the outsider checks need the docker lab', False)
    net = subprocess.run([docker, 'network', 'inspect', network, '-f', '{{json .IPAM.Config}}'],
                         capture_output=True, text=True)
    if net.returncode != 0:
        err = (net.stderr or net.stdout).strip()
        if 'not found' in err.lower() or 'no such network' in err.lower():
            return NoOutsider('no docker network %s here: the outsider checks need the docker lab' % network, False)
        return NoOutsider('cannot inspect the docker network %s (rc=%d): %s' % (network, net.returncode, err[:300]), True)
    try:
        subnets = [ipaddress.ip_network(c['Subnet']) for c in json.loads(net.stdout) or [] if c.get('Subnet')]
    except ValueError as e:
        return NoOutsider('unreadable IPAM config of %s: %s (%r)' % (network, e, net.stdout[:200]), True)
    if not subnets:
        return NoOutsider('the docker network %s has no subnet' % network, True)
    name = 'pd-fw-outsider-%s' % uuid.uuid4().hex[:8]
    errors = []
    for ip in ips:
        res = subprocess.run([docker, 'run', '-d', '--rm', '--name', name, '--network', network, '--ip', ip,
                              '--entrypoint', 'sleep', image, '300'], capture_output=True, text=True)
        if res.returncode == 0:
            return name, ip, subnets
        errors.append('%s: %s' % (ip, res.stderr.strip()[:300]))
        # A container created but not started (address in use) would hold the name for the next try.
        subprocess.run([docker, 'rm', '-f', name], capture_output=True, text=True)
    return NoOutsider('the lab network %s exists but no outsider container could start (image %s): %s'
                      % (network, image, '; '.join(errors)), True)


def _prober(ips):
    """probe(pairs) run from a non-cluster container on the lab network at one of ips, or a NoOutsider."""
    docker = shutil.which('docker')
    started = start_outsider(docker, ips=ips)
    if isinstance(started, NoOutsider):
        yield started
        return
    name, ip, subnets = started

    def probe(pairs):
        res = subprocess.run([docker, 'exec', name, 'sh', '-c', probe_cmd(pairs)],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    probe.ip = ip
    probe.subnets = subnets
    try:
        yield probe
    finally:
        subprocess.run([docker, 'rm', '-f', name], capture_output=True, text=True)


@pytest.fixture(scope='module')
def outsider():
    yield from _prober(OUTSIDER_IPS)


@pytest.fixture(scope='module')
def monitor():
    """A prober at the monitoring address (firewall_extra_sources), or a NoOutsider."""
    yield from _prober(MONITOR_IPS)


def test_table_loaded_and_unit_active(host):
    if not enabled(host):
        pytest.skip('firewall_enabled is false for this host')
    svc = host.service(UNIT)
    assert svc.is_running or host.run('systemctl is-active %s' % UNIT).stdout.strip() == 'active', '%s is not active' % UNIT
    assert svc.is_enabled, '%s is not enabled' % UNIT
    table = host.run('nft list table inet %s' % TABLE)
    assert table.rc == 0, 'table inet %s is not loaded: %s' % (TABLE, table.stderr)
    chain = [l.strip() for l in host.check_output('nft list chain inet %s input' % TABLE).splitlines()]
    rules = [l for l in chain if l and not l.startswith(('table', 'chain', 'type', '}'))]
    # Loopback, then replies, come before any restriction.
    assert rules[0] == 'iif "lo" accept' and rules[1] == 'ct state established,related accept', rules
    # Every fixed protected port of the host is in the loaded set.
    elems = json.loads(host.check_output('nft -j list set inet %s protected_tcp' % TABLE))
    members = next(o['set'] for o in elems['nftables'] if 'set' in o).get('elem', [])
    ranges = [(e['range'][0], e['range'][1]) if isinstance(e, dict) else (e, e) for e in members]
    missing = [(p, what) for p, what, _ in protected_ports(host) if not any(lo <= p <= hi for lo, hi in ranges)]
    assert not missing, 'not protected: %s (set: %s)' % (missing, members)


def test_each_port_admits_its_sources_only(host, request):
    """From every other bundle host: each listening protected port connects when that host is of a source kind the
    port allows, and is refused (or dropped) otherwise."""
    if not enabled(host):
        pytest.skip('firewall_enabled is false for this host')
    ports = listening(host, protected_ports(host))
    me = hvars(host)['inventory_hostname']
    g = groups(host)
    peers = sorted({h for grp in ('etcd', 'mooncake_master', 'vllm_prefill', 'vllm_decode', 'vllm_router', 'entry',
                                  'monitoring') for h in g.get(grp, []) if h != me})
    if not ports or not peers:
        pytest.skip('no listening protected port or no other bundle host')
    ip = cfg(host)['common_host_ip']
    store = store_clients(host, request)
    bad, seen = [], []
    for peer in peers:
        kinds = {grp for grp, members in g.items() if peer in members} | ({'store'} if peer in store else set())
        res = json.loads(other_host(request, peer).check_output(probe_cmd([[ip, p] for p, _, _ in ports])))
        for (port, what, allowed), got in zip(ports, (res['%s:%d' % (ip, p)] for p, _, _ in ports)):
            want_open = bool(kinds & allowed)
            seen.append('%s -> %s:%s (%s) %s' % (peer, me, port, what, got))
            if (got == 'open') != want_open:
                bad.append('%s -> %s:%s (%s, allowed %s): %s, want %s'
                           % (peer, me, port, what, sorted(allowed), got, 'open' if want_open else 'not open'))
    print('\n'.join(seen))
    assert not bad, '\n'.join(bad)


def test_outsider_is_refused(host, outsider):
    if not enabled(host):
        pytest.skip('firewall_enabled is false for this host')
    if isinstance(outsider, NoOutsider):
        (pytest.fail if outsider.fatal else pytest.skip)(outsider.reason)
    v = cfg(host)
    ip = v['common_host_ip']
    if not any(ipaddress.ip_address(ip) in net for net in outsider.subnets):
        pytest.skip('%s is not on the lab network %s' % (ip, NETWORK))
    ports = listening(host, protected_ports(host))
    if not ports:
        pytest.skip('no protected port listens on this host')
    res = outsider([[ip, p] for p, _, _ in ports])
    print('outsider %s -> %s: %s' % (outsider.ip, ip, res))
    opened = {'%s (%s)' % (k, what): r for (k, r), (_, what, _) in zip(res.items(), ports) if r == 'open'}
    assert not opened, 'an outsider (%s) connects to protected ports: %s' % (outsider.ip, opened)
    behind_entry = bool(groups(host).get('entry'))
    if in_group(host, 'vllm_router'):
        pub = outsider([[ip, int(v['vllm_router_port'])]])
        if behind_entry:  # the entry hosts only (HAProxy in front): users come through the entry
            assert list(pub.values()) != ['open'], 'with an entry, an outsider must not reach the router port: %s' % pub
        else:
            assert list(pub.values()) == ['open'], 'the router public port must stay open to everyone: %s' % pub
    if in_group(host, 'entry'):
        pub = outsider([[ip, int(v['entry_port'])]])
        assert list(pub.values()) == ['open'], 'entry_port must be open to everyone: %s' % pub


def test_monitoring_reaches_the_metrics_ports_only(host, monitor):
    """From a firewall_extra_sources address: the ports that name monitoring connect (etcd's metrics listener, master
    metrics, router Prometheus, the vLLM API's /metrics, node exporters, Prometheus and Alertmanager), and every
    other cluster port, etcd's client port and its plain listener for Mooncake included, does not."""
    if not enabled(host):
        pytest.skip('firewall_enabled is false for this host')
    if isinstance(monitor, NoOutsider):
        (pytest.fail if monitor.fatal else pytest.skip)(monitor.reason)
    if not any(ipaddress.ip_address(monitor.ip) in ipaddress.ip_network(src, strict=False)
               for src in hvars(host).get('firewall_extra_sources', [])):
        pytest.skip('%s is not in firewall_extra_sources of this inventory' % monitor.ip)
    ip = cfg(host)['common_host_ip']
    ports = listening(host, protected_ports(host))
    if not ports:
        pytest.skip('no protected port listens on this host')
    res = monitor([[ip, p] for p, _, _ in ports])
    seen = ['%s -> %s:%s (%s) %s' % (monitor.ip, ip, p, what, res['%s:%d' % (ip, p)]) for p, what, _ in ports]
    print('\n'.join(seen))
    bad = ['%s:%s (%s): %s, want %s' % (ip, p, what, res['%s:%d' % (ip, p)], 'open' if 'monitoring' in allowed else 'not open')
           for p, what, allowed in ports if (res['%s:%d' % (ip, p)] == 'open') != ('monitoring' in allowed)]
    assert not bad, 'monitoring source %s: %s' % (monitor.ip, bad)


def test_entry_hosts_reach_the_routers(host, request):
    """With an entry, the router port takes the entry hosts: each entry host connects to this router."""
    if not enabled(host) or not in_group(host, 'vllm_router') or not groups(host).get('entry'):
        pytest.skip('not a router behind an entry')
    ip, port = cfg(host)['common_host_ip'], int(cfg(host)['vllm_router_port'])
    for entry in groups(host)['entry']:
        res = json.loads(other_host(request, entry).check_output(probe_cmd([[ip, port]])))
        assert list(res.values()) == ['open'], 'entry host %s cannot reach the router %s:%s: %s' % (entry, ip, port, res)

"""Cluster checks with pytest-testinfra, reusable against a real cluster:

    pytest tests/infra --hosts='ansible://all' --ansible-inventory=inventory/prod

Variables come from the inventory (host.ansible.get_variables()); what the inventory leaves out
falls back to the roles' defaults (DEFAULTS, read from roles/*/defaults/main.yml).
"""
import json
import os
import re
import shlex
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
LAB_INVENTORY = REPO / 'molecule' / 'default' / 'inventory'
LAB_VAULT_PASS = REPO / 'molecule' / 'default' / 'vault-pass-LAB-ONLY'


def pytest_configure(config):
    """The lab inventory holds a vault (the router API key): use the LAB-ONLY password file unless the
    caller chose one. Against a real cluster, set ANSIBLE_VAULT_PASSWORD_FILE yourself."""
    inv = getattr(config.option, 'ansible_inventory', None)
    if inv and Path(inv).resolve() == LAB_INVENTORY.resolve():
        os.environ.setdefault('ANSIBLE_VAULT_PASSWORD_FILE', str(LAB_VAULT_PASS))


def role_defaults(*names):
    """The roles' own defaults (roles/*/defaults/main.yml) of NAMES, read rather than restated; each must be a
    plain value (a templated default needs Ansible to resolve it)."""
    merged = {}
    for f in sorted((REPO / 'roles').glob('*/defaults/main.yml')):
        merged.update(yaml.safe_load(f.read_text()) or {})
    out = {}
    for name in names:
        value = merged[name]
        if isinstance(value, str) and ('{{' in value or '{%' in value):
            raise ValueError('%s: its role default %r is a template, not a plain value' % (name, value))
        out[name] = value
    return out


def load_filter(name):
    """plugins/filter/NAME.py, the playbooks' own definitions (a router's URL on its host, smg's membership ...),
    read rather than restated here."""
    import importlib.util
    spec = importlib.util.spec_from_file_location('pd_bundle_filter_' + name, REPO / 'plugins' / 'filter' / (name + '.py'))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BUNDLE = load_filter('bundle')


# What the inventory leaves out: the roles' defaults.
DEFAULTS = role_defaults(
    'etcd_client_port', 'etcd_peer_port', 'etcd_mooncake_client_port', 'etcd_cert_dir',
    'mooncake_master_metrics_port', 'mooncake_master_rpc_port',
    'vllm_router_port', 'vllm_router_prometheus_port', 'vllm_router_implementation', 'vllm_router_user',
    'vllm_default_bootstrap_port',
    'vllm_kv_connector', 'vllm_venv', 'vllm_store_ssd', 'vllm_store_ssd_http_port', 'vllm_store_ssd_service_port', 'vllm_store_ssd_user',
)


def hvars(host):
    v = dict(DEFAULTS)
    v.update(host.ansible.get_variables())
    v.setdefault('common_host_ip', v.get('ansible_host', v['inventory_hostname']))
    return v


def groups(host):
    return hvars(host).get('groups', {})


def in_group(host, group):
    return hvars(host)['inventory_hostname'] in groups(host).get(group, [])


def bearer_secrets(headers):
    """The keys in ["Authorization: Bearer <key>", ...]."""
    return [h.split('Bearer ', 1)[1] for h in headers or [] if 'Bearer ' in h]


def check_output_masked(host, cmd, secrets):
    """host.check_output, but a failure names the command with each secret in it masked: testinfra's own
    message would print a key given with curl -H into the test log (CI keeps it)."""
    res = host.run(cmd)
    if res.rc != 0:
        msg = 'rc=%d: %s\nstdout: %s\nstderr: %s' % (res.rc, cmd, res.stdout[-1500:], res.stderr[-1500:])
        for s in secrets:
            msg = msg.replace(s, '<masked>')
        raise AssertionError(msg)
    return res.stdout.rstrip('\r\n')


def curl_json(host, url, data=None, timeout=120, headers=None):
    cmd = "curl -sS --fail-with-body -m %d -H 'Content-Type: application/json' %s" % (timeout, url)
    for h in headers or []:
        cmd += ' -H %s' % shlex.quote(h)
    if data is not None:
        cmd += " -d '%s'" % json.dumps(data).replace("'", "'\\''")
    out = check_output_masked(host, cmd, bearer_secrets(headers))
    return json.loads(out)


# --- the entry (roles/entry): what a user of the OpenAI API has ---------------------------------------------

ENTRY_DEFAULTS = role_defaults('entry_port', 'entry_health_path', 'entry_check_port')


def entry_cfg(h):
    """The entry role's settings for h: its defaults overlaid by the inventory."""
    v = dict(ENTRY_DEFAULTS)
    v.update(hvars(h))
    return v


def inventory_value(value, v):
    """A value as the inventory gives it: "{{ name }}" is that variable, the HOME lookup is this user's home."""
    if not isinstance(value, str):
        return value
    m = re.fullmatch(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}", value.strip())
    if m:
        return inventory_value(v[m.group(1)], v)
    home = "{{ lookup('ansible.builtin.env', 'HOME') }}"
    if value.startswith(home):
        return os.path.expanduser('~') + value[len(home):]
    if '{{' in value:
        raise AssertionError('cannot read %r here: set PD_ENTRY_KEY / PD_ENTRY_CA' % value)
    return value


def entry_hosts(h):
    return groups(h).get('entry', [])


def first_entry(h):
    """Tests that look at the whole entry, or go through it, run once: on the first entry host."""
    return in_group(h, 'entry') and hvars(h)['inventory_hostname'] == entry_hosts(h)[0]


def entry_client(h):
    """(base URL, key name, key, TLS context) as a user of the entry has them: https://VIP:PORT (the host's own
    address without a VIP), the key PD_ENTRY_KEY (and PD_ENTRY_KEY_NAME), else the first of the inventory's
    entry_keys, and the CA PD_ENTRY_CA, else entry_tls_ca_dir/ca.crt (the bundle's entry CA on the controller)."""
    v = entry_cfg(h)
    keys = inventory_value(v.get('entry_keys'), v) or {}
    name = os.environ.get('PD_ENTRY_KEY_NAME') or (sorted(keys)[0] if keys else None)
    key = os.environ.get('PD_ENTRY_KEY') or keys.get(name)
    assert key, 'no entry key: set PD_ENTRY_KEY, or entry_keys in the inventory (with its vault password)'
    ca = os.environ.get('PD_ENTRY_CA') or str(Path(inventory_value(v['entry_tls_ca_dir'], v)) / 'ca.crt')
    assert Path(ca).is_file(), 'no entry CA at %s: set PD_ENTRY_CA' % ca
    host = inventory_value(v.get('entry_vip'), v) or v['common_host_ip']
    port = int(v['entry_port'])
    return 'https://%s:%d' % (host, port), name, key, ssl.create_default_context(cafile=ca)


def entry_open(base, path, ctx, key=None, method='GET', data=None, body=None, timeout=30):
    """urlopen of base+path with the Bearer key (if any); body: a JSON document to send. Raises HTTPError on
    a status other than 2xx (neither carries the key)."""
    headers = {'Authorization': 'Bearer %s' % key} if key else {}
    if body is not None:
        data = json.dumps(body).encode()
        headers['Content-Type'] = 'application/json'
    req = urllib.request.Request(base + path, method=method, data=data, headers=headers)
    return urllib.request.urlopen(req, timeout=timeout, context=ctx)


def entry_call(base, path, ctx, key=None, method='GET', data=None, body=None, timeout=30):
    """(status, response text) of one request through the entry (entry_open)."""
    try:
        with entry_open(base, path, ctx, key, method, data, body, timeout) as resp:
            return resp.status, resp.read().decode(errors='replace')
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors='replace')


def _load_router_overhead():
    """scripts/bench/router_overhead.py, whose Prometheus text parser these tests share."""
    import importlib.util
    spec = importlib.util.spec_from_file_location('router_overhead', REPO / 'scripts' / 'bench' / 'router_overhead.py')
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# Sum of a Prometheus counter's samples whose labels include `labels` (one parser for bench and tests).
metric_value = _load_router_overhead().metric_sum


def wait_until(fn, timeout=120, interval=2):
    end = time.time() + timeout
    while True:
        try:
            res = fn()
            if res:
                return res
        except Exception:  # noqa: BLE001 - retried until the deadline
            if time.time() > end:
                raise
        if time.time() > end:
            return fn()
        time.sleep(interval)


def deployed_kv_config(h, inst_name):
    """The kv-transfer-config an instance really runs with (from its env file), not the inventory's:
    a converge with -e vllm_kv_connector=... changes the deployment without touching the inventory."""
    for line in h.file('/etc/vllm/%s.env' % inst_name).content_string.splitlines():
        if line.startswith('SERVE_KV_TRANSFER_CONFIG='):
            return json.loads(line.split('=', 1)[1].strip("'"))
    raise AssertionError('no SERVE_KV_TRANSFER_CONFIG in /etc/vllm/%s.env' % inst_name)


def kv_connectors(kv):
    """The connectors an instance runs (a deployed kv-transfer-config): its one connector, or each child of a
    MultiConnector (the store tier: MooncakeConnector and MooncakeStoreConnector)."""
    if kv.get('kv_connector') == 'MultiConnector':
        return [c.get('kv_connector') for c in (kv.get('kv_connector_extra_config') or {}).get('connectors') or []]
    return [kv.get('kv_connector')]


def store_ssd_deployed(host):
    """Whether host should run mooncake-store-client: a prefill host with vllm_store_ssd whose instances run the store
    tier as deployed (MultiConnector; a converge into store mode turns the tier, and so the client, off)."""
    v = hvars(host)
    if not in_group(host, 'vllm_prefill') or not v.get('vllm_store_ssd') or not v.get('vllm_instances'):
        return False
    kv = deployed_kv_config(host, v['vllm_instances'][0]['name'])
    return kv.get('kv_connector') == 'MultiConnector' and 'MooncakeStoreConnector' in kv_connectors(kv)


def other_host(request, name):
    """A testinfra host for another inventory host, with the same inventory and connection."""
    import testinfra
    inv = request.config.option.ansible_inventory
    return testinfra.get_host('ansible://%s' % name, ansible_inventory=inv)


def host_ip(h):
    v = hvars(h)
    return v['common_host_ip']


# The 0600 key files, as the roles define them (one place each: roles/<role>/vars/main.yml).
ROUTER_KEY_FILE = yaml.safe_load((REPO / 'roles' / 'vllm_router' / 'vars' / 'main.yml').read_text())['_vllm_router_key_file']
INSTANCE_KEY_FILE = yaml.safe_load((REPO / 'roles' / 'vllm' / 'vars' / 'main.yml').read_text())['_vllm_api_key_file']


def run_as_root(h, cmd):
    """Run cmd as root: directly when connected as root (the docker lab), else through sudo."""
    if h.check_output('id -u') == '0':
        return h.run(cmd)
    with h.sudo():
        return h.run(cmd)


def read_root_file(h, path):
    """A root-only file: read directly when connected as root (the docker lab), else through sudo."""
    if h.check_output('id -u') == '0':
        return h.file(path).content_string
    with h.sudo():
        return h.file(path).content_string


def router_key_configured(v):
    """Whether the inventory gives the router an API key (vllm_router_api_key, default "")."""
    return str(v.get('vllm_router_api_key') or '').strip() != ''


def _key_file_headers(h, path, var, configured, what):
    """["Authorization: Bearer <key>"] from VAR= in the 0600 key file PATH on h; [] only when the inventory
    sets no key (configured false) AND no key file is deployed. A key the inventory sets but the host does not
    have (or that cannot be read, e.g. sudo refused) fails here, instead of silently sending no header."""
    res = run_as_root(h, 'cat %s' % path)
    if res.rc != 0:
        if not configured and 'No such file' in res.stderr:
            return []
        raise AssertionError('%s is %s in the inventory, but %s on %s cannot be read (rc=%d): %s'
                             % (what, 'set' if configured else 'not set', path,
                                hvars(h)['inventory_hostname'], res.rc, res.stderr.strip()[:300]))
    for line in res.stdout.splitlines():
        if line.startswith(var + '='):
            key = line.split('=', 1)[1].strip()
            assert key, '%s is empty in %s' % (var, path)
            return ['Authorization: Bearer %s' % key]
    raise AssertionError('no %s in %s' % (var, path))


def router_auth_headers(h):
    """The router's key (VLLM_ROUTER_API_KEY of its key file) as the header a client holding it sends."""
    return _key_file_headers(h, ROUTER_KEY_FILE, 'VLLM_ROUTER_API_KEY', router_key_configured(hvars(h)),
                             'vllm_router_api_key')


def instance_key_configured(request, h):
    """Whether the vLLM instances must demand a key: a router of the inventory has vllm_router_api_key (the
    instances demand the routers' key, roles/vllm)."""
    return any(router_key_configured(hvars(other_host(request, r))) for r in groups(h).get('vllm_router', []))


def instance_auth_headers(h, configured):
    """The key an instance host's vLLM instances demand (VLLM_API_KEY of its key file) as the header a direct
    caller sends; configured: instance_key_configured."""
    return _key_file_headers(h, INSTANCE_KEY_FILE, 'VLLM_API_KEY', configured,
                             'vllm_router_api_key (the instances demand the routers\' key)')


def parse_ss_rows(out):
    """[(address, port, backlog)] of `ss -Htln` output (a listening socket's Send-Q is its listen backlog); the
    wildcard is '0.0.0.0' (v4) or '::' (v6, also '*')."""
    rows = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        addr, _, port = fields[3].rpartition(':')
        addr = addr.strip('[]').split('%')[0]
        rows.append(('::' if addr == '*' else addr, int(port), int(fields[2])))
    return rows


def parse_ss_listeners(out):
    """{(address, port)} of `ss -Htln` output; the wildcard is '0.0.0.0' (v4) or '::' (v6, also '*')."""
    return {(addr, port) for addr, port, _ in parse_ss_rows(out)}


def tcp_listeners(h):
    return parse_ss_listeners(h.check_output('ss -Htln'))


def listens_as_configured(socks, ip, port):
    """A socket configured on a host IP must be bound to exactly that IP (a wildcard bind would expose
    it on every interface); one configured on 0.0.0.0 must be a wildcard bind."""
    if ip in ('0.0.0.0', '::'):
        return ('0.0.0.0', port) in socks or ('::', port) in socks
    return (ip, port) in socks


def deployed_etcd_env(h):
    """ETCD_* settings the member really runs with (its env file), not the inventory's."""
    out = {}
    for line in read_root_file(h, '/etc/etcd/etcd.env').splitlines():
        if line.startswith('ETCD_'):
            k, _, val = line.partition('=')
            out[k] = val
    return out


def etcd_tls_files(h, env=None):
    """(CA bundle, client certificate, client key) on the member h when it runs TLS (the etcd role's files: the
    bundle's client certificate, CN etcd-client), else None."""
    env = env or deployed_etcd_env(h)
    if 'ETCD_CERT_FILE' not in env:
        return None
    v = hvars(h)
    return (env['ETCD_TRUSTED_CA_FILE'],
            v.get('etcd_tls_client_cert_file', v['etcd_cert_dir'] + '/client.crt'),
            v.get('etcd_tls_client_key_file', v['etcd_cert_dir'] + '/client.key'))


def etcdctl(h, endpoints=None):
    """etcdctl command prefix for the deployed member: https with the CA bundle and the role's client
    certificate when the member has TLS on, plain http otherwise."""
    env = deployed_etcd_env(h)
    endpoints = endpoints or env['ETCD_ADVERTISE_CLIENT_URLS']
    cmd = 'etcdctl --endpoints=%s' % endpoints
    tls = etcd_tls_files(h, env)
    if tls:
        cmd += ' --cacert=%s --cert=%s --key=%s' % tls
    return cmd


def etcd_client(h, url=None):
    """An etcd3gw client (tests/infra/etcd_gateway.py) of the member h, its requests sent by curl on h: its
    advertised client URL (https with the CA bundle and the bundle's client certificate when TLS is on), or url
    (e.g. Mooncake's plain listener, which takes no certificate)."""
    import etcd_gateway  # needs etcd3gw (requirements.txt); only the tests that read etcd import it
    env = deployed_etcd_env(h)
    url = url or env['ETCD_ADVERTISE_CLIENT_URLS'].split(',')[0]
    tls = etcd_tls_files(h, env) if url.startswith('https://') else None
    args = ['--cacert', tls[0], '--cert', tls[1], '--key', tls[2]] if tls else []
    return etcd_gateway.client(lambda cmd: run_as_root(h, cmd), url, args)


# The master's env file (roles/mooncake_master/tasks/configure.yml).
MASTER_ENV_FILE = '/etc/mooncake/master.env'


def parse_master_args(text):
    """{flag: value} of MOONCAKE_MASTER_ARGS="--flag=value ..." in a master env file."""
    for line in text.splitlines():
        if line.startswith('MOONCAKE_MASTER_ARGS='):
            words = ' '.join(shlex.split(line.split('=', 1)[1])).split()
            return dict(w[2:].partition('=')[::2] for w in words if w.startswith('--'))
    raise AssertionError('no MOONCAKE_MASTER_ARGS in %s' % MASTER_ENV_FILE)


def deployed_master_args(h):
    """The arguments the master on h really runs with (its env file), not the inventory's."""
    return parse_master_args(read_root_file(h, MASTER_ENV_FILE))


def parse_listener_pids(out):
    """{pid: {ports}} of `ss -Htlnp` output (the processes that hold each listening TCP socket)."""
    import re
    pids = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        port = int(fields[3].rpartition(':')[2])
        for pid in re.findall(r'pid=(\d+)', line):
            pids.setdefault(int(pid), set()).add(port)
    return pids


def parse_pid_units(out):
    """{pid: 'unit.service'} of lines 'PID <contents of /proc/PID/cgroup>' (the systemd unit each runs in)."""
    import re
    units = {}
    for line in out.splitlines():
        pid, _, cgroup = line.partition(' ')
        m = re.search(r'/([^/\s]+\.service)(?:/|\s|$)', cgroup)
        if pid.isdigit() and m:
            units[int(pid)] = m.group(1)
    return units


def unit_tcp_ports(h):
    """{'unit.service': {ports}}: the TCP ports each systemd unit's processes listen on (as root: ss shows
    other users' processes only to root)."""
    pids = parse_listener_pids(run_as_root(h, 'ss -Htlnp').stdout)
    if not pids:
        return {}
    cmd = 'for p in %s; do echo "$p $(tr "\\n" " " < /proc/$p/cgroup 2>/dev/null)"; done' % ' '.join(str(p) for p in pids)
    units = parse_pid_units(run_as_root(h, cmd).stdout)
    out = {}
    for pid, ports in pids.items():
        if pid in units:
            out.setdefault(units[pid], set()).update(ports)
    return out

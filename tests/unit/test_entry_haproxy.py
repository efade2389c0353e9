"""The entry's HAProxy config (templates/entry/haproxy.cfg.j2), rendered with the role's defaults and checked
by the real HAProxy: `haproxy -c`, then a live HAProxy on 127.0.0.1 in front of a python http.server that stands
for the routers. No key -> 401, a wrong key -> 401, a good key -> 200 on /v1/models (without the client's key
reaching the router), router admin paths -> 404 even with a good key, the access log names the key and never
shows it, TLS 1.1 refused, h2 offered, a revoked key -> 401 after a reload, per-key rate limit -> 429. With model
pools (two stand-in routers, one pool each): routing by the body's model, GET /v1/models from the entry, 404/413/403
in OpenAI's error shape, rate limits per key and pool, health, and a new pool or key access as a reload.
Skipped only when haproxy is not installed (scripts/install-deps.sh installs it)."""
import contextlib
import hashlib
import importlib.util
import http.client
import http.server
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path

import jinja2
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location('entry_pools_under_test', REPO / 'plugins' / 'filter' / 'entry_pools.py')
entry_pools = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(entry_pools)
HAPROXY = shutil.which('haproxy') or ('/usr/sbin/haproxy' if os.path.exists('/usr/sbin/haproxy') else None)
needs_haproxy = pytest.mark.skipif(HAPROXY is None, reason='haproxy is not installed (scripts/install-deps.sh)')



def test_the_real_daemons_are_here():
    """The tests below skip without haproxy/keepalived; this one does not, so a machine without them (CI installs
    them with scripts/install-deps.sh) fails instead of passing on skips."""
    missing = [n for n in ('haproxy', 'keepalived') if not (shutil.which(n) or os.path.exists('/usr/sbin/' + n))]
    assert not missing, 'install %s (scripts/install-deps.sh)' % ' '.join(missing)


KEYS = {'alice': 'alice-key-0123456789abcdef', 'ci': 'ci-key-fedcba9876543210'}


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def defaults():
    return yaml.safe_load((REPO / 'roles' / 'entry' / 'defaults' / 'main.yml').read_text())


def render(tmp, backends, pools=(), **overrides):
    """haproxy.cfg as the role renders it: its defaults, the inventory's overrides, the role's internals. POOLS:
    _entry_pools as bundle_entry_pools returns it (none: an inventory without vllm_pools)."""
    v = defaults()
    v.update(overrides)
    v.update(_entry_pem=str(tmp / 'entry.pem'), _entry_keys_map=str(tmp / 'keys.map'),
             _entry_limits_map=str(tmp / 'rate-limits.map'), _entry_backends=backends, _entry_pools=list(pools),
             _entry_models_map=str(tmp / 'models.map'), _entry_models_json=str(tmp / 'models.json'),
             _entry_key_pools_map=str(tmp / 'key-pools.map'),
             _entry_rate_limited=int(v['entry_rate_limit_default']) > 0 or any(int(n) > 0 for n in v['entry_rate_limits'].values()))
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(REPO / 'templates')), keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True)
    env.filters['to_json'] = json.dumps
    write_maps(tmp, v['entry_keys'], v['entry_rate_limits'], env)
    if pools:
        write_pool_maps(tmp, v, env)
    v.update(_entry_hide_topology_lua=str(tmp / 'hide-topology.lua'))
    (tmp / 'hide-topology.lua').write_text(env.get_template('entry/hide-topology.lua.j2').render(v))
    return env.get_template('entry/haproxy.cfg.j2').render(v)


def write_maps(tmp, keys, limits, env=None):
    env = env or jinja2.Environment(loader=jinja2.FileSystemLoader(str(REPO / 'templates')), keep_trailing_newline=True)
    digests = sorted([hashlib.sha256(k.encode()).hexdigest(), n] for n, k in keys.items())
    (tmp / 'keys.map').write_text(env.get_template('entry/keys.map.j2').render(_entry_key_digests=digests))
    (tmp / 'rate-limits.map').write_text(env.get_template('entry/rate-limits.map.j2').render(entry_rate_limits=limits))


def write_pool_maps(tmp, v, env=None):
    """models.map, models.json and key-pools.map as the role renders them (V: _entry_pools, entry_key_models)."""
    env = env or jinja2.Environment(loader=jinja2.FileSystemLoader(str(REPO / 'templates')), keep_trailing_newline=True,
                                    trim_blocks=True)
    env.filters['to_json'] = json.dumps
    v = dict(v, _entry_key_pools=entry_pools.entry_key_pools(v.get('entry_key_models'), v['_entry_pools'], v['entry_keys']))
    for name in ('models.map', 'models.json', 'key-pools.map'):
        (tmp / name).write_text(env.get_template('entry/%s.j2' % name).render(v))


def not_root(cfg):
    """The test runs HAProxy as the calling user: no user/group switch."""
    return re.sub(r'^\s+(user|group) haproxy\n', '', cfg, flags=re.M)


def make_cert(tmp):
    subprocess.run(['openssl', 'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
                    '-keyout', str(tmp / 'key.pem'), '-out', str(tmp / 'cert.pem'), '-days', '2', '-subj', '/CN=entry',
                    '-addext', 'subjectAltName=IP:127.0.0.1'], check=True, capture_output=True)
    (tmp / 'entry.pem').write_text((tmp / 'cert.pem').read_text() + (tmp / 'key.pem').read_text())


@needs_haproxy
def test_rendered_config_passes_haproxy_check(tmp_path):
    make_cert(tmp_path)
    backends = [{'host': 'router-1', 'address': '10.10.0.41', 'port': 8000},
                {'host': 'router-2', 'address': '10.10.0.42', 'port': 8000}]
    for extra in ({}, {'entry_rate_limits': {'ci': 20}}, {'entry_rate_limit_default': 100}):
        cfg = tmp_path / 'haproxy.cfg'
        cfg.write_text(render(tmp_path, backends, entry_keys=KEYS, **extra))
        res = subprocess.run([HAPROXY, '-c', '-f', str(cfg)], capture_output=True, text=True)
        assert res.returncode == 0, res.stdout + res.stderr
        text = cfg.read_text()
        assert 'retry-on conn-failure empty-response' in text and 'option redispatch' in text
        assert 'option httpchk GET /readiness' in text and 'ssl-min-ver TLSv1.2' in text and 'alpn h2,http/1.1' in text
        assert all(k not in text for k in KEYS.values())
        assert ('track-sc0' in text) == bool(extra)


# What vllm-router 0.1.17 makes every completion's id (FACTS: the topology, then a uuid).
INSIDE_ID = 'cmpl-___prefill_addr_10.10.0.21:8100___decode_addr_10.10.0.31:8200_4f1c2a9e8b7d4c3a9f0e1d2c3b4a5f6e'


class Router(http.server.BaseHTTPRequestHandler):
    seen = []
    protocol_version = 'HTTP/1.1'

    def do_GET(self):  # noqa: N802 - http.server's name
        Router.seen.append((self.path, self.headers.get('Authorization')))
        self.rfile.read(int(self.headers.get('Content-Length') or 0))
        if self.path.startswith('/v1/completions'):
            return self.completion()
        body = b'{"object":"list","data":[]}'
        self.send_response(200)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def completion(self):
        """A completion as the router returns it: one JSON body, or (?stream) SSE events in chunks, each event but the
        last cut in two inside the id's marker at ?cut=N bytes, the halves sent 0.2 s apart."""
        event = ('{"id": "%s", "object": "text_completion", "choices": [{"text": "kv"}]}' % INSIDE_ID).encode()
        if 'stream' not in self.path:
            self.send_response(200)
            self.send_header('Content-Type', 'application/json')
            self.send_header('Content-Length', str(len(event)))
            self.end_headers()
            self.wfile.write(event)
            return
        cut = int(self.path.rsplit('cut=', 1)[1])
        self.send_response(200)
        self.send_header('Content-Type', 'text/event-stream')
        self.send_header('Transfer-Encoding', 'chunked')
        self.end_headers()
        data = b'data: ' + event + b'\n\n'
        for part in (data[:cut], data[cut:], data, b'data: [DONE]\n\n', b''):
            self.wfile.write(b'%x\r\n%s\r\n' % (len(part), part))
            self.wfile.flush()
            time.sleep(0.2)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def live_haproxy(cfg, port, tmp_path):
    """HAProxy in master-worker mode on CFG, its output in tmp_path/haproxy.log, once its /healthz on PORT answers
    200 (15 s, else the test fails with the log); stopped (SIGTERM) afterwards."""
    log = open(tmp_path / 'haproxy.log', 'w+')
    proc = subprocess.Popen([HAPROXY, '-W', '-db', '-f', str(cfg)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 15
        while time.time() < deadline:
            try:
                if request(port, tmp_path, '/healthz')[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        else:
            pytest.fail('haproxy did not become healthy: ' + (tmp_path / 'haproxy.log').read_text())
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
        log.close()


@pytest.fixture()
def entry(tmp_path):
    make_cert(tmp_path)
    router = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Router)
    threading.Thread(target=router.serve_forever, daemon=True).start()
    port, check_port = free_port(), free_port()
    cfg = tmp_path / 'haproxy.cfg'
    cfg.write_text(not_root(render(tmp_path, [{'host': 'router-1', 'address': '127.0.0.1', 'port': router.server_port}],
                                   entry_keys=KEYS, entry_port=port, entry_bind_address='127.0.0.1',
                                   entry_check_port=check_port, entry_router_check_interval='200ms',
                                   entry_rate_limits={'ci': 3}, entry_rate_limit_period='30s')))
    try:
        with live_haproxy(cfg, port, tmp_path) as proc:
            yield {'port': port, 'tmp': tmp_path, 'proc': proc, 'log': tmp_path / 'haproxy.log', 'check_port': check_port}
    finally:
        router.shutdown()


def context(tmp):
    ctx = ssl.create_default_context(cafile=str(tmp / 'cert.pem'))
    ctx.set_alpn_protocols(['h2', 'http/1.1'])
    return ctx


def request(port, tmp, path, key=None, method='GET', scheme='Bearer'):
    ctx = ssl.create_default_context(cafile=str(tmp / 'cert.pem'))
    conn = http.client.HTTPSConnection('127.0.0.1', port, context=ctx, timeout=20)
    headers = {'Authorization': '%s %s' % (scheme, key)} if key else {}
    conn.request(method, path, headers=headers)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, body


@needs_haproxy
def test_auth_paths_and_log(entry):
    port, tmp = entry['port'], entry['tmp']
    Router.seen.clear()
    assert request(port, tmp, '/v1/models')[0] == 401
    assert request(port, tmp, '/v1/models', key='not-a-key')[0] == 401
    assert request(port, tmp, '/v1/models', key=KEYS['alice'], scheme='Basic')[0] == 401
    assert request(port, tmp, '/v1/models', key=KEYS['alice'])[0] == 200
    assert request(port, tmp, '/v1/models', key=KEYS['alice'], scheme='bearer')[0] == 200
    for path in ('/remove_worker?url=http://x', '/add_worker', '/workers', '/list_workers', '/metrics', '/health',
                 '/v1/../remove_worker', '/v1/%2e%2e/remove_worker', '/v1%2fremove_worker', '//remove_worker'):
        for method in ('GET', 'POST'):
            status, _ = request(port, tmp, path, key=KEYS['alice'], method=method)
            assert status in (403, 404), (path, method, status)
    assert {p for p, _ in Router.seen} <= {'/v1/models', '/readiness'}, Router.seen  # nothing else reached the router
    # The client's key stays on the entry: the router sees no Authorization header.
    assert all(auth is None for p, auth in Router.seen if p.startswith('/v1/'))
    time.sleep(0.5)
    log = entry['log'].read_text()
    assert 'key="alice"' in log, log
    assert all(k not in log for k in KEYS.values()), log
    assert 'remove_worker' in log  # refused requests are logged too


@needs_haproxy
def test_completion_ids_reach_clients_without_the_instances_addresses(entry):
    """The entry's Lua filter (templates/entry/hide-topology.lua.j2): 'cmpl-___prefill_addr_..___decode_addr_.._<uuid>'
    reaches the client as 'cmpl-<uuid>', in a JSON body (its Content-Length dropped, chunked instead) and in SSE
    events, also when a chunk boundary cuts the marker (wherever it falls)."""
    port, tmp = entry['port'], entry['tmp']
    uuid = INSIDE_ID.rsplit('_', 1)[1]
    status, body = request(port, tmp, '/v1/completions', key=KEYS['alice'], method='POST')
    assert status == 200 and json.loads(body)['id'] == 'cmpl-' + uuid, body
    marker_at = ('data: {"id": "cmpl-').__len__()
    for cut in (3, marker_at + 1, marker_at + 9, marker_at + 30, marker_at + 60, 120):
        status, body = request(port, tmp, '/v1/completions?stream=1&cut=%d' % cut, key=KEYS['alice'], method='POST')
        events = [line[6:] for line in body.decode().splitlines() if line.startswith('data: ')]
        assert status == 200 and events[-1] == '[DONE]', (cut, body)
        assert [json.loads(e)['id'] for e in events[:-1]] == ['cmpl-' + uuid] * 2, (cut, body)
        assert b'addr' not in body and b'10.10.0.' not in body, (cut, body)


@needs_haproxy
def test_health_without_key(entry):
    assert request(entry['port'], entry['tmp'], '/healthz')[0] == 200
    conn = http.client.HTTPConnection('127.0.0.1', entry['check_port'], timeout=5)
    conn.request('GET', '/healthz')
    assert conn.getresponse().status == 200


@pytest.mark.filterwarnings('ignore::DeprecationWarning')
@needs_haproxy
def test_tls(entry):
    port, tmp = entry['port'], entry['tmp']
    with socket.create_connection(('127.0.0.1', port)) as raw, context(tmp).wrap_socket(raw, server_hostname='127.0.0.1') as s:
        assert s.version() in ('TLSv1.2', 'TLSv1.3') and s.selected_alpn_protocol() == 'h2'
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.check_hostname, old.verify_mode = False, ssl.CERT_NONE
    old.set_ciphers('DEFAULT:@SECLEVEL=0')
    old.minimum_version, old.maximum_version = ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1
    with pytest.raises(ssl.SSLError):
        with socket.create_connection(('127.0.0.1', port)) as raw, old.wrap_socket(raw) as s:
            s.do_handshake()


@needs_haproxy
def test_revoke_is_a_reload(entry):
    port, tmp, proc = entry['port'], entry['tmp'], entry['proc']
    conn = http.client.HTTPSConnection('127.0.0.1', port, context=ssl.create_default_context(cafile=str(tmp / 'cert.pem')))
    conn.request('GET', '/v1/models', headers={'Authorization': 'Bearer ' + KEYS['alice']})
    assert conn.getresponse().read() and True
    write_maps(tmp, {'ci': KEYS['ci']}, {'ci': 3})  # alice revoked
    proc.send_signal(signal.SIGUSR2)  # what `systemctl reload haproxy` sends the master
    # 180 s: under the static tier's load (lint, unit and the lab caches side by side) a reload once took over 20 s,
    # and with two more ansible runs beside them (stop 50) over 60 s. A reload that never lands still fails.
    deadline = time.time() + 180

    def status():
        try:
            return request(port, tmp, '/v1/models', key=KEYS['alice'])[0]
        except (OSError, http.client.HTTPException):  # a connection the old worker closed while handing over
            return None
    while status() != 401:
        assert time.time() < deadline, 'alice still accepted after the reload'
        time.sleep(0.2)
    assert proc.poll() is None  # the same master: a reload, not a restart
    assert request(port, tmp, '/v1/models', key=KEYS['ci'])[0] == 200


@needs_haproxy
def test_rate_limit_per_key(entry):
    port, tmp = entry['port'], entry['tmp']
    statuses = [request(port, tmp, '/v1/models', key=KEYS['ci'])[0] for _ in range(5)]
    assert statuses[:3] == [200, 200, 200] and statuses[3:] == [429, 429], statuses
    assert all(request(port, tmp, '/v1/models', key=KEYS['alice'])[0] == 200 for _ in range(5))  # no limit for alice


KEEPALIVED = shutil.which('keepalived') or ('/usr/sbin/keepalived' if os.path.exists('/usr/sbin/keepalived') else None)


@pytest.mark.skipif(KEEPALIVED is None, reason='keepalived is not installed (scripts/install-deps.sh)')
def test_keepalived_config_passes_its_check(tmp_path):
    # keepalived -t wants the interface to exist and not be loopback.
    nics = sorted(n for n in os.listdir('/sys/class/net') if n != 'lo')
    if not nics:
        pytest.skip('no network interface but lo')
    v = defaults()
    internals = yaml.safe_load((REPO / 'roles' / 'entry' / 'vars' / 'main.yml').read_text())
    v.update({k: internals[k] for k in ('_entry_takeover_bonus', '_entry_takeover_step')})
    # keepalived -t refuses a script that is missing or writable by others than root: the rendered one, 0755.
    script = tmp_path / 'entry-vrrp-takeover'
    v.update(entry_vip='10.10.0.50', entry_vip_interface=nics[0], entry_vrrp_password='s3cr3t!', _entry_address='10.10.0.51',
             _entry_peers=['10.10.0.52'], _entry_vrrp_priority=100, inventory_hostname='entry-1',
             _entry_takeover_script=str(script), _entry_takeover_dir=str(tmp_path / 'run'))
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(REPO / 'templates')), undefined=jinja2.StrictUndefined)
    script.write_text(env.get_template('entry/vrrp-takeover.sh.j2').render(v))
    script.chmod(0o755)
    tmp_path.chmod(0o755)
    cfg = tmp_path / 'keepalived.conf'
    cfg.write_text(env.get_template('entry/keepalived.conf.j2').render(v))
    assert 'unicast_peer' in cfg.read_text() and 'track_script' in cfg.read_text() and 'track_file' in cfg.read_text()
    # The role's validator (roles/entry/vars/main.yml): keepalived -t prints problems, exits 0 or by SIGTERM.
    validate = yaml.safe_load((REPO / 'roles' / 'entry' / 'vars' / 'main.yml').read_text())['_entry_keepalived_validate']
    argv = ['/bin/sh', '-c', validate.split("'")[1], '_']
    res = subprocess.run(argv + [str(cfg)], capture_output=True, text=True, start_new_session=True)
    assert res.returncode == 0, res.stdout + res.stderr
    bad = tmp_path / 'bad.conf'
    bad.write_text(cfg.read_text().replace('virtual_router_id 51', 'virtual_router_id 999'))
    res = subprocess.run(argv + [str(bad)], capture_output=True, text=True, start_new_session=True)
    assert res.returncode != 0 and 'VRID' in res.stdout, res.stdout + res.stderr


def test_takeover_bonus_favours_the_newest_vip_holder(tmp_path):
    """The rendered takeover script, run as keepalived runs it: full bonus the moment this host holds the VIP, one
    less per step it keeps it, full again (and its clock reset) when it does not: a new holder's first advert must
    already outrank a frozen holder's (see the script). 127.0.0.1 is an address this host holds;
    192.0.2.1 (TEST-NET-1) one it does not."""
    internals = yaml.safe_load((REPO / 'roles' / 'entry' / 'vars' / 'main.yml').read_text())
    bonus, step = internals['_entry_takeover_bonus'], internals['_entry_takeover_step']
    run = tmp_path / 'run'
    run.mkdir()
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(REPO / 'templates')), undefined=jinja2.StrictUndefined)
    script = tmp_path / 'takeover'
    script.write_text(env.get_template('entry/vrrp-takeover.sh.j2').render(
        _entry_takeover_dir=str(run), _entry_takeover_bonus=bonus, _entry_takeover_step=step,
        _entry_takeover_script=str(script)))

    def tick(vip):
        assert subprocess.run(['/bin/sh', str(script), vip], capture_output=True, text=True).returncode == 0
        return int((run / 'bonus').read_text())
    assert tick('127.0.0.1') == bonus  # just took the VIP
    (run / 'since').write_text('%d\n' % (time.time() - 10 * step - 1))  # held it for 10 steps
    assert tick('127.0.0.1') == bonus - 10
    (run / 'since').write_text('%d\n' % (time.time() - (bonus + 5) * step))  # held it longer than the bonus lasts
    assert tick('127.0.0.1') == 0
    (run / 'since').write_text('17963\x00garbage\n')  # a torn write: counts from now, no shell error
    assert tick('127.0.0.1') == bonus
    assert tick('192.0.2.1') == bonus and not (run / 'since').exists()  # lost it: the next takeover starts afresh
    assert tick('127.0.0.1') == bonus


# Model pools (vllm_pools; roles/entry/README.md, Model pools): two stand-in routers, one pool each; every answer
# names the router that gave it (X-Stand-In), so a test sees where HAProxy sent each request.
POOL_KEYS = dict(KEYS, bob='bob-key-00112233445566778899')


def stand_in(name):
    class StandIn(Router):
        disable_nagle_algorithm = True  # its header and body writes: no 40 ms delayed-ACK wait (the benchmark)

        def end_headers(self):
            self.send_header('X-Stand-In', name)
            super().end_headers()
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def two_pools(ra, rb, extra=()):
    def pool(name, model, server):
        return {'name': name, 'backend': 'vllm_routers_' + name, 'served_model_name': model,
                'backends': [{'host': 'router-' + name, 'address': '127.0.0.1', 'port': server.server_port}]}
    return [pool('chat', 'model-a', ra), pool('code', 'org/model-b', rb)] + [pool(*p) for p in extra]


POOL_SETTINGS = {'entry_keys': POOL_KEYS, 'entry_key_models': {'ci': ['chat']},
                 'entry_rate_limits': {'alice/chat': 2, 'bob': 2}, 'entry_rate_limit_period': '30s'}


@pytest.fixture()
def pool_entry(tmp_path):
    make_cert(tmp_path)
    ra, rb = stand_in('a'), stand_in('b')
    port, check_port = free_port(), free_port()
    settings = dict(POOL_SETTINGS, entry_port=port, entry_bind_address='127.0.0.1', entry_check_port=check_port,
                    entry_router_check_interval='200ms')
    cfg = tmp_path / 'haproxy.cfg'
    cfg.write_text(not_root(render(tmp_path, [], pools=two_pools(ra, rb), **settings)))
    try:
        with live_haproxy(cfg, port, tmp_path) as proc:
            yield {'port': port, 'tmp': tmp_path, 'proc': proc, 'log': tmp_path / 'haproxy.log', 'cfg': cfg,
                   'routers': (ra, rb), 'settings': settings}
    finally:
        ra.shutdown()
        rb.shutdown()


def post(port, tmp, path, body, key=POOL_KEYS['alice']):
    """POST a body (a dict: JSON; bytes as they are) -> (status, X-Stand-In, body)."""
    ctx = ssl.create_default_context(cafile=str(tmp / 'cert.pem'))
    conn = http.client.HTTPSConnection('127.0.0.1', port, context=ctx, timeout=20)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request('POST', path, body=data, headers={'Authorization': 'Bearer ' + key, 'Content-Type': 'application/json'})
    resp = conn.getresponse()
    out = resp.status, resp.getheader('X-Stand-In'), resp.read()
    conn.close()
    return out


@needs_haproxy
def test_pool_config_passes_haproxy_check(tmp_path):
    make_cert(tmp_path)
    router = type('S', (), {'server_port': 8000})
    for extra in ({}, {'entry_rate_limits': {'ci': 20}}, {'entry_rate_limit_default': 100}):
        cfg = tmp_path / 'haproxy.cfg'
        cfg.write_text(render(tmp_path, [], pools=two_pools(router, router), entry_keys=POOL_KEYS, **extra))
        res = subprocess.run([HAPROXY, '-c', '-f', str(cfg)], capture_output=True, text=True)
        assert res.returncode == 0, res.stdout + res.stderr
        text = cfg.read_text()
        assert 'backend vllm_routers_chat' in text and 'backend vllm_routers_code' in text
        assert '\nbackend vllm_routers\n' not in text and text.count('retry-on conn-failure empty-response') == 2
        assert ('track-sc0 var(txn.key_pool)' in text) == bool(extra)


def test_no_pools_renders_what_it_rendered_before(tmp_path):
    """Without vllm_pools the template's pool parts render nothing: the one backend of every router, no body read."""
    text = render(tmp_path, [{'host': 'router-1', 'address': '10.10.0.41', 'port': 8000}], entry_keys=KEYS)
    assert 'default_backend vllm_routers\n' in text and 'backend vllm_routers\n' in text
    assert 'json_query' not in text and 'use_backend' not in text and 'models.map' not in text
    assert text.count('option http-buffer-request') == 1  # the backend's, as before


@needs_haproxy
def test_requests_go_to_their_models_pool(pool_entry):
    port, tmp = pool_entry['port'], pool_entry['tmp']
    for path in ('/v1/chat/completions', '/v1/completions'):
        assert post(port, tmp, path, {'model': 'model-a', 'prompt': 'x'})[:2] == (200, 'a'), path
        assert post(port, tmp, path, {'prompt': 'x', 'model': 'org/model-b'})[:2] == (200, 'b'), path
    # Streaming: the SSE events come through whole, from the model's pool.
    status, router, body = post(port, tmp, '/v1/completions?stream=1&cut=10', {'model': 'org/model-b', 'stream': True})
    events = [line[6:] for line in body.decode().splitlines() if line.startswith('data: ')]
    assert (status, router, events[-1]) == (200, 'b', '[DONE]') and len(events) == 3, body


@needs_haproxy
def test_unknown_or_missing_model_is_404_in_openai_shape(pool_entry):
    port, tmp = pool_entry['port'], pool_entry['tmp']
    for body, shown in (({'model': 'gpt-4'}, 'gpt-4'), ({'model': 'x"}, "y\\\n'}, 'x"}, "y\\\n'), ({'prompt': 'x'}, ''),
                        (b'not json', ''), ({'model': 'MODEL-A'}, 'MODEL-A')):
        status, router, raw = post(port, tmp, '/v1/chat/completions', body)
        err = json.loads(raw)['error']  # the client's model is escaped: the body stays JSON
        assert (status, router) == (404, None), raw
        assert err == {'message': 'The model `%s` does not exist.' % shown, 'type': 'invalid_request_error',
                       'param': 'model', 'code': 'model_not_found'}, raw
    assert request(port, tmp, '/v1/files', key=POOL_KEYS['alice'])[0] == 404  # no body, no model


@needs_haproxy
def test_a_body_too_large_to_read_its_model_is_413(pool_entry):
    port, tmp = pool_entry['port'], pool_entry['tmp']
    big = {'prompt': 'x' * 70000, 'model': 'model-a'}  # the model after entry_bufsize (64 KiB)
    status, router, raw = post(port, tmp, '/v1/completions', big)
    assert (status, router, json.loads(raw)['error']['code']) == (413, None, 'request_too_large'), raw
    status, router, _ = post(port, tmp, '/v1/completions', {'model': 'model-a', 'prompt': 'x' * 70000})
    assert (status, router) == (200, 'a')  # the model first: readable in the buffer


@needs_haproxy
def test_the_entry_lists_every_pools_model(pool_entry):
    status, body = request(pool_entry['port'], pool_entry['tmp'], '/v1/models', key=POOL_KEYS['ci'])
    models = json.loads(body)
    assert status == 200 and models['object'] == 'list', body
    assert [(m['id'], m['object'], m['owned_by']) for m in models['data']] == [
        ('model-a', 'model', 'pd-bundle'), ('org/model-b', 'model', 'pd-bundle')]
    assert request(pool_entry['port'], pool_entry['tmp'], '/v1/models')[0] == 401  # still a key


@needs_haproxy
def test_a_key_calls_only_its_pools(pool_entry):
    port, tmp = pool_entry['port'], pool_entry['tmp']
    assert post(port, tmp, '/v1/chat/completions', {'model': 'model-a'}, key=POOL_KEYS['ci'])[:2] == (200, 'a')
    status, router, raw = post(port, tmp, '/v1/chat/completions', {'model': 'org/model-b'}, key=POOL_KEYS['ci'])
    assert (status, router) == (403, None), raw
    assert json.loads(raw)['error'] == {'message': 'This key may not use the model `org/model-b`.',
                                        'type': 'permission_error', 'param': 'model', 'code': 'model_not_allowed'}
    # A key not in entry_key_models calls every pool.
    assert post(port, tmp, '/v1/chat/completions', {'model': 'org/model-b'}, key=POOL_KEYS['bob'])[:2] == (200, 'b')


@needs_haproxy
def test_rate_limit_per_key_and_pool(pool_entry):
    port, tmp = pool_entry['port'], pool_entry['tmp']

    def statuses(key, model, n=4):
        return [post(port, tmp, '/v1/completions', {'model': model}, key=POOL_KEYS[key])[0] for _ in range(n)]
    # alice/chat: 2; alice on code: no limit (no "alice" entry, default 0).
    assert statuses('alice', 'model-a') == [200, 200, 429, 429]
    assert statuses('alice', 'org/model-b') == [200] * 4
    # bob: 2 for each pool, counted per pool.
    assert statuses('bob', 'model-a') == [200, 200, 429, 429]
    assert statuses('bob', 'org/model-b') == [200, 200, 429, 429]
    status, _, raw = post(port, tmp, '/v1/completions', {'model': 'model-a'}, key=POOL_KEYS['bob'])
    assert status == 429 and json.loads(raw)['error']['code'] == 'rate_limit_exceeded'


@needs_haproxy
def test_health_with_pools(pool_entry):
    """200 while a pool has a router up; one pool without routers still leaves the entry 200, its requests 503."""
    port, tmp = pool_entry['port'], pool_entry['tmp']
    ra, rb = pool_entry['routers']
    assert request(port, tmp, '/healthz')[0] == 200
    rb.shutdown()
    rb.server_close()
    deadline = time.time() + 10
    while post(port, tmp, '/v1/completions', {'model': 'org/model-b'})[0] != 503:
        assert time.time() < deadline, 'pool code still served without its router'
        time.sleep(0.2)
    assert request(port, tmp, '/healthz')[0] == 200
    assert post(port, tmp, '/v1/completions', {'model': 'model-a'})[:2] == (200, 'a')
    ra.shutdown()
    ra.server_close()
    deadline = time.time() + 10
    while request(port, tmp, '/healthz')[0] != 503:
        assert time.time() < deadline, 'the entry still healthy without a router in any pool'
        time.sleep(0.2)


@needs_haproxy
def test_a_new_pool_or_key_access_is_a_reload(pool_entry):
    """A third pool and a key's wider access: new files, SIGUSR2 (systemctl reload); a streamed request that was
    under way finishes, the same master serves the new pool and the wider access."""
    port, tmp, proc, cfg = pool_entry['port'], pool_entry['tmp'], pool_entry['proc'], pool_entry['cfg']
    ra, rb = pool_entry['routers']
    assert post(port, tmp, '/v1/completions', {'model': 'model-c'})[0] == 404
    assert post(port, tmp, '/v1/completions', {'model': 'org/model-b'}, key=POOL_KEYS['ci'])[0] == 403
    inflight = {}

    def stream():
        inflight['out'] = post(port, tmp, '/v1/completions?stream=1&cut=10', {'model': 'model-a', 'stream': True})
    t = threading.Thread(target=stream)
    t.start()
    time.sleep(0.3)  # the stand-in is between its chunks
    settings = dict(pool_entry['settings'], entry_key_models={'ci': ['chat', 'code']})
    cfg.write_text(not_root(render(tmp, [], pools=two_pools(ra, rb, [('big', 'model-c', ra)]), **settings)))
    proc.send_signal(signal.SIGUSR2)
    deadline = time.time() + 20

    def status(model, key):
        try:
            return post(port, tmp, '/v1/completions', {'model': model}, key=POOL_KEYS[key])[0]
        except (OSError, http.client.HTTPException):  # a connection the old worker closed while handing over
            return None
    while status('model-c', 'alice') != 200:
        assert time.time() < deadline, 'the new pool not served after the reload'
        time.sleep(0.2)
    assert status('org/model-b', 'ci') == 200
    t.join(20)
    st, router, body = inflight['out']
    assert (st, router) == (200, 'a') and body.rstrip().endswith(b'data: [DONE]'), body
    assert proc.poll() is None  # the same master: a reload, not a restart

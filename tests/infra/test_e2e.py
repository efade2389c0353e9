"""End to end through vllm-router: a long prompt is prefilled on a prefill instance and its KV
arrives at decode by external transfer, which decode's /metrics must show."""
import json
import re
import uuid

import pytest

from conftest import curl_json, deployed_kv_config, router_auth_headers, groups, hvars, in_group, metric_value, other_host, wait_until

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
        mv = hvars(other_host(request, m))
        url = 'http://%s:%s/health' % (mv['common_host_ip'], mv['mooncake_master_metrics_port'])
        views.append((curl_json(host, url) or {}).get('view_version'))
    return views


# Store mode: how many fresh requests may miss the store before the test fails (see kv_request).
STORE_ATTEMPTS = 3


def kv_request(request, host, send, what):
    """send() makes one request and returns its prompt tokens; decode's counters must show its KV arrived.
    Store mode only, two races that vLLM's MooncakeStoreConnector has by design, each retried with a fresh
    prompt and said so, STORE_ATTEMPTS requests in all:
    - the prefill's put is asynchronous: the connector's request_finished() returns False, so prefill answers
      the router before its store job has landed, and a decode that looks up first finds nothing and computes
      the whole prompt (seen once in CI: 0 tokens moved, 1434 computed);
    - a master failover during the request (the lab's 2 cores can stall etcd long enough for the leader to
      lose its lease) loses the store's in-memory objects. The drills prove failover.
    A partial load, or no load on every attempt, fails."""
    store = deployed_connector(request, host) != 'MooncakeConnector'
    for attempt in range(1, (STORE_ATTEMPTS if store else 1) + 1):
        views0 = master_views(request, host) if store else None
        ext0, local0 = decode_counters(request, host)
        tokens = send()
        last = attempt == (STORE_ATTEMPTS if store else 1)
        if store and not last:
            if master_views(request, host) != views0:
                print('%s: a master failover during the request (view %s -> %s); once more'
                      % (what, views0, master_views(request, host)))
                continue
            # Give decode's counters the same grace as assert_kv_arrived, then call a miss a miss.
            wait_until(lambda: decode_counters(request, host)[0] > ext0, timeout=30)
            ext1, local1 = decode_counters(request, host)
            if ext1 == ext0:
                print('%s: attempt %d: decode found none of the prompt in the store (computed %d tokens): the '
                      'prefill\'s asynchronous put had not landed; once more with a fresh prompt'
                      % (what, attempt, local1 - local0))
                continue
        assert_kv_arrived(request, host, tokens, ext0, local0, what)
        return


@pytest.fixture
def router(host):
    if not in_group(host, 'vllm_router'):
        pytest.skip('runs on the router host')
    v = hvars(host)
    # The API key (when deployed) goes with every request, as a client holding it would send it.
    v = dict(v, auth=router_auth_headers(host))
    bind = str(v.get('vllm_router_host') or v['common_host_ip'])  # roles/vllm_router: the cluster address by default
    return host, 'http://%s:%s' % ('127.0.0.1' if bind == '0.0.0.0' else bind, v['vllm_router_port']), v


def model_name(host, base, v):
    return curl_json(host, base + '/v1/models', headers=v['auth'])['data'][0]['id']


def test_completion_kv_arrives_by_transfer(router, request):
    host, base, v = router
    model = model_name(host, base, v)

    def send():
        res = curl_json(host, base + '/v1/completions',
                        {'model': model, 'prompt': prompt(), 'max_tokens': 8, 'temperature': 0}, headers=v['auth'])
        assert res['choices'][0]['text'] != '' and res['usage']['completion_tokens'] > 0, res
        return res['usage']['prompt_tokens']
    kv_request(request, host, send, 'completion')


def test_streaming_chat_completion(router, request):
    host, base, v = router
    model = model_name(host, base, v)
    kv_request(request, host, lambda: streamed_chat(host, base, v, model), 'streamed chat')


def streamed_chat(host, base, v, model):
    """One streamed chat completion; its prompt tokens."""
    body = json.dumps({'model': model, 'stream': True, 'max_tokens': 8, 'temperature': 0,
                       'stream_options': {'include_usage': True},
                       'messages': [{'role': 'user', 'content': prompt()}]}).replace("'", "'\\''")
    auth = ''.join(" -H '%s'" % h for h in v['auth'])
    out = host.check_output("curl -sS -N --fail-with-body -m 120 -H 'Content-Type: application/json'%s "
                            "%s/v1/chat/completions -d '%s'" % (auth, base, body))
    events = [l[len('data: '):] for l in out.splitlines() if l.startswith('data: ')]
    assert events and events[-1] == '[DONE]', out[-500:]
    chunks = [json.loads(e) for e in events[:-1]]
    text = ''.join((c['choices'][0].get('delta') or {}).get('content') or '' for c in chunks if c.get('choices'))
    assert text, out[-500:]
    usage = [c['usage'] for c in chunks if c.get('usage')]
    assert usage and usage[-1]['completion_tokens'] > 0, out[-500:]
    return usage[-1]['prompt_tokens']

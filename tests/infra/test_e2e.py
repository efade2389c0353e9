"""End to end through vllm-router: a long prompt is prefilled on a prefill instance and its KV
arrives at decode by external transfer, which decode's /metrics must show."""
import json
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


def decode_counters(request, host):
    """Summed external_kv_transfer and local_compute prompt tokens over every decode instance."""
    ext = local = 0.0
    for name in groups(host)['vllm_decode']:
        d = other_host(request, name)
        dv = hvars(d)
        for inst in dv['vllm_instances']:
            text = d.check_output('curl -sS -m 30 http://%s:%s/metrics' % (dv['common_host_ip'], inst['port']))
            ext += metric_value(text, METRIC, {'source': 'external_kv_transfer'})
            local += metric_value(text, METRIC, {'source': 'local_compute'})
    return ext, local


@pytest.fixture
def router(host):
    if not in_group(host, 'vllm_router'):
        pytest.skip('runs on the router host')
    v = hvars(host)
    # The API key (when deployed) goes with every request, as a client holding it would send it.
    v = dict(v, auth=router_auth_headers(host))
    return host, 'http://127.0.0.1:%s' % v['vllm_router_port'], v


def model_name(host, base, v):
    return curl_json(host, base + '/v1/models', headers=v['auth'])['data'][0]['id']


def test_completion_kv_arrives_by_transfer(router, request):
    host, base, v = router
    model = model_name(host, base, v)
    ext0, local0 = decode_counters(request, host)
    res = curl_json(host, base + '/v1/completions',
                    {'model': model, 'prompt': prompt(), 'max_tokens': 8, 'temperature': 0}, headers=v['auth'])
    assert res['usage']['prompt_tokens'] > 256, res['usage']
    assert res['choices'][0]['text'] != '' or res['usage']['completion_tokens'] > 0
    # Counters are published a moment after the response: poll briefly until the transfer shows.
    wait_until(lambda: decode_counters(request, host)[0] - ext0 >= 128, timeout=30)
    ext1, local1 = decode_counters(request, host)
    moved, computed = ext1 - ext0, local1 - local0
    print('prompt %d tokens: %d arrived by KV transfer, %d computed on decode'
          % (res['usage']['prompt_tokens'], moved, computed))
    if deployed_connector(request, host) == 'MooncakeConnector':
        # P2P: decode computes nothing of the prompt itself.
        assert moved >= 256, (moved, computed)
        assert computed == 0, (moved, computed)
    else:
        # Store mode: only whole blocks are stored; the tail is computed on decode.
        assert moved >= 128, (moved, computed)
        assert computed < res['usage']['prompt_tokens'], (moved, computed)


def test_streaming_chat_completion(router, request):
    host, base, v = router
    model = model_name(host, base, v)
    ext0, _ = decode_counters(request, host)
    body = json.dumps({'model': model, 'stream': True, 'max_tokens': 8, 'temperature': 0,
                       'messages': [{'role': 'user', 'content': prompt()}]}).replace("'", "'\\''")
    auth = ''.join(" -H '%s'" % h for h in v['auth'])
    out = host.check_output("curl -sS -N --fail-with-body -m 120 -H 'Content-Type: application/json'%s "
                            "%s/v1/chat/completions -d '%s'" % (auth, base, body))
    events = [l[len('data: '):] for l in out.splitlines() if l.startswith('data: ')]
    assert events and events[-1] == '[DONE]', out[-500:]
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) >= 2, out[-500:]
    assert any(c['choices'] and c['choices'][0].get('delta') for c in chunks)
    # Counters are published a moment after the response: poll briefly.
    def moved_now():
        delta = decode_counters(request, host)[0] - ext0
        return delta if delta >= 128 else 0
    if deployed_connector(request, host) == 'MooncakeConnector':
        moved = wait_until(moved_now, timeout=30)
        print('streamed chat: %d prompt tokens arrived at decode by KV transfer' % moved)
        assert moved >= 128, 'streamed request moved no KV by transfer'
    else:
        # Store mode finds stored KV only by an identical token prefix. Through the router's
        # sequential chat path the lab saw 1408 tokens from the store in some runs and 0 in others,
        # so only the stream itself is asserted here; the completion test asserts the transfer.
        print('streamed chat (store mode): %d prompt tokens arrived at decode by KV transfer'
              % (decode_counters(request, host)[0] - ext0))



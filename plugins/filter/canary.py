"""The PD canary's pairs (plugins/tools/pd_canary.py): every prefill x decode instance pair a router routes for.

- bundle_canary_pairs(prefills, decodes): [{prefill, prefill_url, bootstrap_url, decode, decode_url}], prefills and
  decodes as the router role holds its workers (bundle_vllm_endpoints dicts, or the inventory's URL overrides:
  prefills {url, bootstrap_port}, decodes plain URLs). A pair's names are host/instance where the inventory knows
  them, else the URL's address (the metrics' labels and status's column use them).
"""
from urllib.parse import urlsplit


def _name(endpoint):
    if isinstance(endpoint, dict) and endpoint.get('host') and endpoint.get('name'):
        return '%s/%s' % (endpoint['host'], endpoint['name'])
    return urlsplit(_url(endpoint)).netloc


def _url(endpoint):
    return str(endpoint.get('url') if isinstance(endpoint, dict) else endpoint).rstrip('/')


def bootstrap_url(prefill):
    """http://HOST:BOOTSTRAP_PORT of a prefill endpoint (the address vllm-router hands its decodes)."""
    host = urlsplit(_url(prefill)).hostname
    if ':' in host:
        host = '[%s]' % host
    return 'http://%s:%s' % (host, prefill['bootstrap_port'])


def canary_pairs(prefills, decodes):
    return [{'prefill': _name(p), 'prefill_url': _url(p), 'bootstrap_url': bootstrap_url(p),
             'decode': _name(d), 'decode_url': _url(d)}
            for p in prefills or [] for d in decodes or []]


class FilterModule(object):
    def filters(self):
        return {'bundle_canary_pairs': canary_pairs}

"""etcd from Python: an etcd3gw client (OpenStack's client for etcd's v3 JSON gateway, pinned in
requirements.txt) whose HTTP requests are sent by curl on a cluster host.

Why through a host: the firewall role admits only cluster hosts (and firewall_extra_sources) to etcd's client
ports, and the controller that runs these tests usually is neither (the lab's docker host is an outsider).
etcd3gw builds every request and decodes every answer (base64 keys and values, leases); only the transport
is curl on the host, with the TLS material the etcd role installed there (its CA bundle and the bundle's
client certificate, CN etcd-client) for the https listener, or nothing for Mooncake's plain listener.
Imported only by the tests that read etcd, so the rest of tests/infra needs no etcd3gw.
"""
import shlex

import etcd3gw
import etcd3gw.exceptions
import requests
from requests.adapters import BaseAdapter

# curl writes the status code on a line of its own after the body.
_CODE_MARK = '\n__pd_bundle_http_code='


class CurlOnHost(BaseAdapter):
    """A requests transport that runs curl on a testinfra host. run(cmd) -> result with rc, stdout, stderr
    (testinfra's host.run, or run_as_root bound to the host when the client key is root-only)."""

    def __init__(self, run, tls_args=(), timeout=10):
        super().__init__()
        self.run, self.tls_args, self.timeout = run, list(tls_args), timeout

    def command(self, request, timeout=None):
        t = timeout if isinstance(timeout, (int, float)) else self.timeout
        argv = ['curl', '-sS', '-m', str(int(t)), '-X', request.method, '-w', _CODE_MARK + '%{http_code}'] + self.tls_args
        ctype = request.headers.get('Content-Type')
        if ctype:
            argv += ['-H', 'Content-Type: %s' % ctype]
        body = request.body
        if body is not None:
            argv += ['--data-binary', body.decode() if isinstance(body, bytes) else body]
        argv.append(request.url)
        return ' '.join(shlex.quote(a) for a in argv)

    def send(self, request, stream=False, timeout=None, verify=True, cert=None, proxies=None):  # noqa: ARG002
        res = self.run(self.command(request, timeout))
        out = res.stdout or ''
        if res.rc != 0 or _CODE_MARK not in out:
            # etcd3gw turns this into its ConnectionFailedError, with curl's own words.
            raise requests.exceptions.ConnectionError('curl on the host: rc=%s %s' % (res.rc, (res.stderr or out).strip()[:300]),
                                                      request=request)
        body, _, code = out.rpartition(_CODE_MARK)
        resp = requests.Response()
        resp.status_code = int(code.strip() or 0)
        resp._content = body.encode()
        resp.encoding = 'utf-8'
        resp.url, resp.request, resp.reason = request.url, request, ''
        return resp

    def close(self):
        pass


def client(run, url, tls_args=(), timeout=10):
    """An etcd3gw client of the member at url ('https://ip:2379' or 'http://ip:2479'), its requests sent by
    curl through run (see CurlOnHost)."""
    scheme, _, hostport = url.partition('://')
    host, _, port = hostport.rstrip('/').rpartition(':')
    session = requests.Session()
    session.mount(scheme + '://', CurlOnHost(run, tls_args, timeout))
    return etcd3gw.client(host=host.strip('[]'), port=int(port), protocol=scheme, timeout=timeout, session=session)


def _said(fn, *args):
    """fn(*args); etcd3gw's errors keep their words in detail_text (str() is empty): an AssertionError that says them."""
    try:
        return fn(*args)
    except etcd3gw.exceptions.Etcd3Exception as e:
        raise AssertionError('etcd (%s): %s' % (type(e).__name__, e.detail_text)) from e


def read_prefix(cli, prefix):
    """{key: {'value': str, 'lease': int (0: none), 'mod_revision': int}} of every key under prefix."""
    out = {}
    for value, meta in _said(cli.get_prefix, prefix):
        key = meta['key'].decode() if isinstance(meta['key'], bytes) else meta['key']
        out[key] = {'value': value.decode(errors='replace'), 'lease': int(meta.get('lease') or 0),
                    'mod_revision': int(meta.get('mod_revision') or 0)}
    return out


def lease_ttl(cli, lease_id):
    """Seconds left on a lease (-1: expired or unknown), as etcd's LeaseTimeToLive says."""
    return _said(etcd3gw.Lease(int(lease_id), client=cli).ttl)

"""Whether a role's certificate chain on the controller has anything to do (speed only).

The etcd and entry roles keep a CA and the certificates it issued on the controller (their tasks/tls_issue.yml:
CA key/CSR/certificate, each host's key/CSR/certificate, etcd's shared client certificate): a dozen
community.crypto module runs per host, each a Python process on the controller that reads every file again to
find nothing to change. These filters answer the same question in the play's own process: a converge runs the
chain only where it is due, and runs all of it then.

- request | tls_chain_stamp(ca_dir, recipe): the fingerprint of one issued name: the request (names, key usages,
  lifetimes, the CAs), the chain's task file (a changed recipe re-runs it), and the bytes of every file it
  reads or writes (the CA's certificate; the name's key, request and certificate). None if a file is missing.
- request | tls_chain_due(ca_dir, recipe, renew_days, now=None): the reason the chain must run for this name,
  or '' when nothing is due. Due when: a file is missing; the stamp differs from <name>.stamp (written by the
  chain after it ran: the request, the recipe or a file changed since); a staged CA rotation is requested
  (request['cas'] names more than 'ca': etcd's ca-next); the CA's or the name's certificate expires within
  renew_days (the chain then renews, or refuses an expiring CA with its fix).
"""
import datetime
import hashlib
import json
import os


def _read(path):
    try:
        with open(path, 'rb') as f:
            return f.read()
    except OSError:
        return None


def _files(ca_dir, name):
    """The chain's files of NAME: the CA's certificate, then the name's key, request and certificate."""
    issued = os.path.join(ca_dir, 'issued')
    return [os.path.join(ca_dir, 'ca.crt')] + [os.path.join(issued, '%s.%s' % (name, ext)) for ext in ('key', 'csr', 'crt')]


def _stamp(request, recipe, files):
    """sha256 of the request, the recipe's bytes and FILES' ([(path, bytes)]); None if any is missing."""
    h = hashlib.sha256()
    h.update(json.dumps(request, sort_keys=True, default=str).encode())
    for path, data in [(recipe, _read(recipe))] + files:
        if data is None:
            return None
        h.update(b'\0%s\0%d\0' % (os.path.basename(path).encode(), len(data)))
        h.update(data)
    return h.hexdigest()


def tls_chain_stamp(request, ca_dir, recipe):
    return _stamp(request, recipe, [(p, _read(p)) for p in _files(ca_dir, request['name'])])


def _not_after(pem):
    from cryptography import x509  # the controller has it: community.crypto needs it
    cert = x509.load_pem_x509_certificate(pem)
    try:
        return cert.not_valid_after_utc
    except AttributeError:  # cryptography < 42
        return cert.not_valid_after.replace(tzinfo=datetime.timezone.utc)


def tls_chain_due(request, ca_dir, recipe, renew_days, now=None):
    name = request['name']
    if any(ca != 'ca' for ca in request.get('cas', ['ca'])):
        return 'a CA rotation is staged'
    files = [(p, _read(p)) for p in _files(ca_dir, name)]  # read once: the stamp and the expiry dates
    stamp = _stamp(request, recipe, files)
    if stamp is None:
        return 'files of %s missing in %s' % (name, ca_dir)
    kept = _read(os.path.join(ca_dir, 'issued', '%s.stamp' % name))
    if kept is None or kept.decode(errors='replace').strip() != stamp:
        return 'the request, the recipe or a file of %s changed since the chain last ran' % name
    now = now or datetime.datetime.now(datetime.timezone.utc)
    horizon = now + datetime.timedelta(days=int(renew_days))
    for path, pem in (files[0], files[3]):  # the CA's certificate and the name's
        try:
            if _not_after(pem) <= horizon:
                return '%s expires within %s days' % (path, renew_days)
        except ValueError:
            return '%s is not a PEM certificate' % path
    return ''


class FilterModule(object):
    def filters(self):
        return {'tls_chain_stamp': tls_chain_stamp, 'tls_chain_due': tls_chain_due}

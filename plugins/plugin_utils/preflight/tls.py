"""Preflight checks of the class tls: every path that TLS uses, while it is on.

Unit-tested in tests/unit/test_preflight_checks.py and tests/unit/test_preflight_classes.py.
"""
from .core import _option, _roles, _tls_path_problem, _truthy, check, refuse


# --- TLS: every path that TLS uses, while it is on ---------------------------------------------------------

# The paths TLS uses, by the role whose hosts hold them and the switch that turns that TLS on (None: always on:
# the entry serves https only; Prometheus' copy of etcd's client certificate is checked whatever etcd's switch,
# which the monitoring hosts read from the first etcd member). Each path: (where, need, what reads it). where:
# host (the role writes or reads it on the host: an absolute path) or controller (ansible-playbook keeps or reads
# it there: absolute, ~ allowed). need: required (not empty while on), optional ("" is legal: both entry files
# empty = a certificate from the bundle's entry CA), own_ca (used only while both entry files are empty).
# tests/unit/test_preflight_checks.py ties the table to the tasks and templates that use the paths.
TLS_PATHS = {
    'etcd': {'switch': 'etcd_tls_enabled', 'paths': {
        'etcd_cert_dir': ('host', 'required', 'the directory of the member\'s CA bundle, certificates and keys'),
        'etcd_ca_file': ('host', 'required', 'the CA bundle etcd and etcdctl trust (ETCD_TRUSTED_CA_FILE, '
                                             'ETCD_PEER_TRUSTED_CA_FILE, --cacert)'),
        'etcd_cert_file': ('host', 'required', 'the member certificate (ETCD_CERT_FILE, ETCD_PEER_CERT_FILE)'),
        'etcd_key_file': ('host', 'required', 'the member key (ETCD_KEY_FILE, ETCD_PEER_KEY_FILE)'),
        'etcd_tls_client_cert_file': ('host', 'required', 'the client certificate of etcdctl, the health checks, the '
                                                          'snapshots and Prometheus (--cert)'),
        'etcd_tls_client_key_file': ('host', 'required', 'the client certificate\'s key (--key)'),
        'etcd_tls_ca_dir': ('controller', 'required', 'the directory of the CA and every issued key and certificate'),
    }},
    'monitoring': {'switch': None, 'paths': {
        'monitoring_etcd_client_dir': ('host', 'required', 'the directory of Prometheus\' copy of etcd\'s client '
                                                           'certificate (etcd\'s /metrics over TLS)'),
    }},
    'entry': {'switch': None, 'paths': {
        'entry_tls_cert_file': ('controller', 'optional', 'HAProxy\'s certificate chain (PEM)'),
        'entry_tls_key_file': ('controller', 'optional', 'the key of HAProxy\'s certificate (PEM)'),
        'entry_tls_ca_dir': ('controller', 'own_ca', 'the directory of the entry CA and the certificates it issues '
                                                     '(clients trust its ca.crt)'),
    }},
}


@check('tls')
def tls_paths(cfg, host, groups, specs):
    """Every path of TLS_PATHS on the hosts of its role while its TLS is on: not empty, absolute."""
    r, out = _roles(host, groups), []
    for role, t in TLS_PATHS.items():
        if not r.get(role) or (t['switch'] and not _truthy(cfg.get(t['switch']), False)):
            continue
        own_ca = not str(cfg.get('entry_tls_cert_file') or '') and not str(cfg.get('entry_tls_key_file') or '')
        for var, (where, need, what) in t['paths'].items():
            value = cfg.get(var)
            if not isinstance(value, str) or (need == 'optional' and not value.strip()) or (need == 'own_ca' and not own_ca):
                continue  # a templated default (the bundle's own) or another type (the spec's); not used
            why = _tls_path_problem(value, where)
            if not why:
                continue
            default = _option(specs, var).get('default')
            out.append(refuse(var, host, '%s%s: it is %s, a path on %s'
                              % (why, ' while %s is true' % t['switch'] if t['switch'] else '', what,
                                 host if where == 'host' else 'the controller (where ansible-playbook runs)'),
                              'set %s to an absolute path%s%s.'
                              % (var, '' if where == 'host' else ' (~ works)',
                                 ', or "" with the other entry file "" too (a certificate from the bundle\'s entry CA)'
                                 if need == 'optional' else
                                 ', or remove it (default %s)' % default if default not in (None, '') else ''),
                              value=value))
    return out

#!/usr/bin/env python3
"""No secret in a log: scan the lab's ansible output (run with --diff, some steps also -v) for the
lab's secrets, and fail naming the log, the line and WHICH secret (never the secret itself).

    secret_scan.py --logs 'lab-results/default/*.log' --vault 'molecule/default/inventory/group_vars/*/vault.yml' \
                   --pem-dir ~/.pd-bundle/pki/pd-lab

Secrets looked for:
  - every string value of the inventory's vault files (decrypted with ansible-vault, the password file
    from ANSIBLE_VAULT_PASSWORD_FILE), 8 characters or longer;
  - every base64 line of every private key under --pem-dir (the etcd CA, member and client keys:
    one line of a key in a log is a leak).
A scan that has no secret to look for, or no log to read, cannot fail, so it is an error (exit 2).
Exit 1 when a secret is found, 0 when none is.
"""
import argparse
import glob
import os
import subprocess
import sys
from pathlib import Path

import yaml

MIN_LEN = 8


def _strings(node, path=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _strings(v, f"{path}.{k}" if path else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _strings(v, f"{path}[{i}]")
    elif isinstance(node, (str, int)) and not isinstance(node, bool):
        yield path, str(node)


def vault_secrets(files, view=None):
    """name -> value for every string leaf of the decrypted vault files."""
    view = view or (lambda f: subprocess.run([str(Path(sys.executable).parent / "ansible-vault"), "view", f], check=True,
                                             capture_output=True, text=True).stdout)
    found = {}
    for f in files:
        for name, value in _strings(yaml.safe_load(view(f)) or {}):
            if len(value) >= MIN_LEN:
                found[f"{Path(f).parent.name}/{Path(f).name}:{name}"] = value
    return found


def _b64_lines(pem_text):
    return [ln.strip() for ln in pem_text.splitlines() if ln.strip() and not ln.startswith("-----")]


def _public_pem(key_text):
    """The key's public half as PEM: an EC key's PEM ends with its public point, and that line can
    equal the public key's own last line, which the certificate modules print (not a secret)."""
    from cryptography.hazmat.primitives import serialization
    key = serialization.load_pem_private_key(key_text.encode(), password=None)
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def pem_secrets(pem_dir, public_pem=None):
    """name -> one base64 line, for every line of every private key under pem_dir that is not part of
    its public key."""
    found = {}
    for key in sorted(Path(pem_dir).rglob("*.key")) if pem_dir else []:
        text = key.read_text()
        public = set(_b64_lines((public_pem or _public_pem)(text)))
        for i, line in enumerate(_b64_lines(text)):
            if len(line) >= 16 and not any(line in p for p in public):
                found[f"{key.name} line {i + 1}"] = line
    return found


def scan(logs, secrets):
    """[(log, line number, secret name)] for every secret found; a private key's PEM header counts too."""
    hits = []
    for log in logs:
        with open(log, errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                if "PRIVATE KEY-----" in line:
                    hits.append((log, n, "a PEM private key header"))
                hits.extend((log, n, name) for name, value in secrets.items() if value in line)
    return hits


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--logs", action="append", required=True, help="glob of logs to scan (repeatable)")
    ap.add_argument("--vault", action="append", default=[], help="glob of vault files (repeatable)")
    ap.add_argument("--pem-dir", default=None, help="directory holding private keys (*.key)")
    a = ap.parse_args(argv)
    logs = sorted({f for g in a.logs for f in glob.glob(os.path.expanduser(g)) if os.path.isfile(f)})
    vaults = sorted({f for g in a.vault for f in glob.glob(g)})
    secrets = {**vault_secrets(vaults), **pem_secrets(os.path.expanduser(a.pem_dir) if a.pem_dir else None)}
    if not logs or not secrets:
        print(f"secret scan: nothing to check ({len(logs)} logs, {len(secrets)} secrets): it could not fail",
              file=sys.stderr)
        return 2
    hits = scan(logs, secrets)
    for log, n, name in hits:
        print(f"SECRET IN LOG: {log}:{n}: {name}", file=sys.stderr)
    size = sum(os.path.getsize(f) for f in logs)
    print(f"secret scan: {len(secrets)} secrets ({len(vaults)} vault files, private keys), {len(logs)} logs "
          f"({size // 1024} KiB), {len(hits)} found")
    return 1 if hits else 0


if __name__ == "__main__":
    sys.exit(main())

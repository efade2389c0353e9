#!/usr/bin/env python3
"""The docker lab's names and addresses, read from where they are defined, for the lab scripts.

- hosts and groups:      molecule/<scenario>/inventory/hosts.yml (tests/unit/test_lab_inventory.py ties
                         it to molecule.yml's platforms);
- each host's address:   molecule.yml's platforms (the docker network);
- vLLM instances:        the inventory's host_vars (vllm_instances);
- ports:                 the inventory's group_vars/all.yml, else the owning role's defaults.

    labinv.py router-url              http://172.30.0.41:8000 (the first router, from inside the cluster)
    labinv.py router-host             router1
    labinv.py client-url              what users call: https://VIP:PORT of the entry (else the router URL)
    labinv.py client-ca               the entry CA's certificate that clients verify with ("" without an entry)
    labinv.py hosts [GROUP[:GROUP]]   one host per line
    labinv.py instances [GROUP...]    host:instance:port per line (default: prefill and decode)
    labinv.py var NAME                a port or setting (inventory, else role default)
    labinv.py role-var ROLE NAME      a fixed internal of a role (roles/ROLE/vars/main.yml), e.g. a key file path
Plain YAML (no Ansible); the client key (client_key(), for the scripts' load loops) is the one reader of the
lab's vault (ansible-vault view with the LAB-ONLY password), never printed by this CLI.
"""
import argparse
import json
import functools
import os
import runpy
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


@functools.lru_cache(maxsize=None)
def _bundle_filter(repo):
    """plugins/filter/bundle.py, whose role_defaults reads the roles' defaults for every other reader too
    (loaded once per repo: var() asks for it on every default it looks up)."""
    load = runpy.run_path(str(REPO / "plugins" / "filter" / "siblings.py"))["load"]  # the one filter-file loader
    return load("bundle", Path(repo) / "plugins" / "filter")


class Lab:
    def __init__(self, scenario="default", repo=REPO):
        self.repo = Path(repo)
        self.dir = self.repo / "molecule" / scenario
        inv = yaml.safe_load((self.dir / "inventory" / "hosts.yml").read_text())["all"]
        self.groups = {g: list((body or {}).get("hosts") or {}) for g, body in (inv.get("children") or {}).items()}
        mol = yaml.safe_load((self.dir / "molecule.yml").read_text())
        self.ips = {}
        for p in mol.get("platforms", []):
            for net in p.get("networks") or []:
                if net.get("ipv4_address"):
                    self.ips[p["name"]] = net["ipv4_address"]
        all_vars = self.dir / "inventory" / "group_vars" / "all.yml"
        self.all_vars = (yaml.safe_load(all_vars.read_text()) if all_vars.exists() else None) or {}

    def hosts(self, pattern="all"):
        if pattern == "all":
            seen = []
            for members in self.groups.values():
                seen.extend(h for h in members if h not in seen)
            return seen
        out = []
        for g in pattern.split(":"):
            out.extend(h for h in self.groups.get(g, []) if h not in out)
        return out

    def host_vars(self, host):
        f = self.dir / "inventory" / "host_vars" / f"{host}.yml"
        return (yaml.safe_load(f.read_text()) if f.exists() else None) or {}

    def var(self, name):
        """The inventory's value (group_vars/all.yml), else the role default that defines it."""
        if name in self.all_vars:
            return self.all_vars[name]
        defaults = _bundle_filter(self.repo).role_defaults(str(self.repo / "roles"))[1]
        if name in defaults:
            return defaults[name]
        raise KeyError(f"{name}: not in the lab inventory's group_vars/all.yml nor in any role's defaults")

    def host_ip(self, host):
        """The address the bundle gives HOST (its common_host_ip), else its address on the lab's docker network."""
        return self.host_vars(host).get("common_host_ip") or self.ips[host]

    def instances(self, groups=("vllm_prefill", "vllm_decode")):
        return [(h, i["name"], int(i["port"])) for g in groups for h in self.groups.get(g, [])
                for i in self.host_vars(h).get("vllm_instances", [])]

    def group_vars(self, group):
        f = self.dir / "inventory" / "group_vars" / group / "main.yml"
        return (yaml.safe_load(f.read_text()) if f.exists() else None) or {}

    def has_entry(self):
        return bool(self.groups.get("entry"))

    def client_url(self):
        """What users call: the entry's https://VIP:PORT when the lab has an entry, else the router."""
        if not self.has_entry():
            return self.router_url()
        g = self.group_vars("entry")
        port = g.get("entry_port", self.var("entry_port"))
        return f"https://{g['entry_vip']}" + ("" if int(port) == 443 else f":{port}")

    def client_ca(self):
        """The entry CA's certificate (entry_tls_ca_dir/ca.crt, the lab names its directory), or ""."""
        if not self.has_entry():
            return ""
        return str(Path(_home_lookup(self.group_vars("entry")["entry_tls_ca_dir"])) / "ca.crt")

    def client_key(self, name="lab"):
        """The entry key NAME from the lab's vault (group_vars/entry/vault.yml, LAB-ONLY password), or "" when
        the lab has no entry (the routers take no client key)."""
        if not self.has_entry():
            return ""
        pw = os.environ.get("ANSIBLE_VAULT_PASSWORD_FILE") or str(self.dir / "vault-pass-LAB-ONLY")
        out = subprocess.run([str(Path(sys.executable).parent / "ansible-vault"), "view", "--vault-password-file", pw,
                              str(self.dir / "inventory" / "group_vars" / "entry" / "vault.yml")],
                             capture_output=True, text=True, check=True).stdout
        return yaml.safe_load(out)["vault_entry_keys"][name]

    def router_host(self):
        return self.groups["vllm_router"][0]

    def router_url(self):
        return f"http://{self.ips[self.router_host()]}:{self.var('vllm_router_port')}"

    def router_workers(self, router, timeout=3):
        """ROUTER's GET /workers list ([] on no answer), asked on its own host with the routers' key: smg demands it
        there (vllm-router ignores it). The key is read from its 0600 file inside the container, so it is on no
        command line of this machine."""
        key_file = role_var("vllm_router", "_vllm_router_key_file")
        url = f"http://{self.host_ip(router)}:{self.var('vllm_router_port')}/workers"
        cmd = (f"curl -s -m {int(timeout)} -H \"Authorization: Bearer $(sed -n 's/^VLLM_ROUTER_API_KEY=//p' {key_file})\" "
               f"{url}")
        res = subprocess.run([os.environ.get("DOCKER", "docker"), "exec", router, "sh", "-c", cmd], capture_output=True,
                             text=True, timeout=timeout + 20)
        try:
            return json.loads(res.stdout or "{}").get("workers", [])
        except ValueError:
            return []


def _home_lookup(value):
    """The lab's one templated path form: "{{ lookup('ansible.builtin.env', 'HOME') }}/..."."""
    head = "{{ lookup('ansible.builtin.env', 'HOME') }}"
    if "{{" in value and not value.startswith(head):
        raise ValueError(f"{value}: only {head}/... is understood here")
    return value.replace(head, os.path.expanduser("~"))


def role_var(role, name):
    """roles/ROLE/vars/main.yml's NAME as written there (a plain value such as a file path), the one place it lives."""
    return yaml.safe_load((REPO / "roles" / role / "vars" / "main.yml").read_text())[name]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-s", "--scenario", default="default")
    ap.add_argument("what", choices=["router-url", "router-host", "client-url", "client-ca", "hosts", "instances", "var",
                                     "role-var"])
    ap.add_argument("args", nargs="*")
    a = ap.parse_args(argv)
    lab = Lab(a.scenario)
    if a.what == "router-url":
        print(lab.router_url())
    elif a.what == "client-url":
        print(lab.client_url())
    elif a.what == "client-ca":
        print(lab.client_ca())
    elif a.what == "router-host":
        print(lab.router_host())
    elif a.what == "hosts":
        print("\n".join(lab.hosts(a.args[0] if a.args else "all")))
    elif a.what == "instances":
        print("\n".join(f"{h}:{n}:{p}" for h, n, p in lab.instances(a.args or ("vllm_prefill", "vllm_decode"))))
    elif a.what == "role-var":
        print(role_var(*a.args[:2]))
    else:
        print(lab.var(a.args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

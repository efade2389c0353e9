"""The lab's plain inventory (molecule/default/inventory/hosts.yml) must name the same hosts and
groups as molecule.yml's platforms, or playbooks run outside molecule would miss hosts."""
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _groups_from_inventory():
    inv = yaml.safe_load((ROOT / "molecule/default/inventory/hosts.yml").read_text())
    return {g: sorted((body or {}).get("hosts", {})) for g, body in inv["all"]["children"].items()}


def _groups_from_molecule():
    text = (ROOT / "molecule/default/molecule.yml").read_text()
    # molecule.yml uses ${VAR:-default} which is plain text to YAML.
    platforms = yaml.safe_load(text)["platforms"]
    groups = {}
    for p in platforms:
        for g in p.get("groups", []):
            groups.setdefault(g, []).append(p["name"])
    return {g: sorted(h) for g, h in groups.items()}


def test_lab_inventory_matches_molecule_platforms():
    assert _groups_from_inventory() == _groups_from_molecule()


def _labinv():
    import importlib.util
    spec = importlib.util.spec_from_file_location("labinv", ROOT / "scripts/lab/labinv.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.Lab()


def test_labinv_reads_names_and_addresses_from_the_lab_definition():
    lab = _labinv()
    assert lab.hosts() == sorted(lab.hosts(), key=lab.hosts().index)  # stable order, no duplicates
    assert len(set(lab.hosts())) == len(lab.hosts())
    router = lab.router_host()
    assert lab.router_url() == f"http://{lab.ips[router]}:{lab.var('vllm_router_port')}"
    for host, name, port in lab.instances():
        assert host in lab.hosts("vllm_prefill:vllm_decode") and name and 1 <= port <= 65535
    # common_host_ip in host_vars, where set, is the container's address on the lab network.
    for host in lab.hosts():
        ip = lab.host_vars(host).get("common_host_ip")
        assert ip in (None, lab.ips[host]), host


def test_lab_scripts_name_no_container():
    """Container names live in the lab inventory; the scripts ask scripts/lab/labinv.py for them."""
    names = _groups_from_inventory()
    hosts = {h for members in names.values() for h in members}
    offenders = []
    for f in sorted((ROOT / "scripts/lab").glob("*")):
        if f.suffix not in (".py", ".sh") or f.name == "labinv.py":
            continue
        for n, line in enumerate(f.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if '"""' in line or code.strip().startswith(("load.py", "scripts/")):
                continue
            offenders += [f"{f.name}:{n}: {h}" for h in hosts if __import__("re").search(rf"\b{h}\b", code)]
    assert offenders == []

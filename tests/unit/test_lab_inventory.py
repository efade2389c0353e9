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

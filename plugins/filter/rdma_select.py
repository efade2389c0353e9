# -*- coding: utf-8 -*-
"""Filter plugins that pick RDMA NICs and the RoCE GID index for a vLLM instance.

Input is the fact dict produced by plugins/modules/rdma_facts.py (``ansible_facts.rdma``).
Pure functions: importable without Ansible (tests import this file directly).

Filters
-------
``rdma_select(rdma, gpus=[], nics='auto', link_layer='any', exclude=[], gid_type='RoCE v2',
require_ipv4=True, min_rate_gbps=0, instance_name=None)`` returns::

    {"nics": ["mlx5_0", ...],        # RDMA device names (Mooncake device_name / MC_TE_FILTERS)
     "netdevs": ["ens1f0np0", ...],  # their netdevs (None entries dropped)
     "gid_index": 3 | None,          # RoCE: the GID index (MC_GID_INDEX); None for InfiniBand
     "ib_port": 1,                   # port number shared by all chosen NICs (MC_IB_PORT)
     "link_layer": "InfiniBand" | "Ethernet",
     "ports": [{nic, port, netdev, link_layer, rate_gbps, gid_index, gid, ipv4, affinity}]}

Rules
-----
* Only RDMA ports are ever considered (plain netdevs such as management NICs are not RDMA
  devices and never appear in the facts).
* ``nics='auto'`` (or omitted/empty): candidates are ports that are ACTIVE, of the requested
  ``link_layer``, not matched by ``exclude`` (fnmatch globs over device name, ``dev:port`` and
  the port's netdevs), with ``rate_gbps >= min_rate_gbps`` and, for Ethernet (RoCE) ports, a GID
  of ``gid_type`` carrying an IPv4 address on the port's netdev (when ``require_ipv4``; else any
  non-link-local GID of that type). For each GPU of the instance the candidates with the best
  affinity (pix > numa > sys) are kept, then among those the fastest; the union over GPUs is
  returned. Without GPUs (CPU host or ``gpus=[]``) all candidates tie and the fastest are kept.
* Explicit ``nics`` (list of device names, ``dev:port`` or netdev names) are validated: the device
  exists, the port is ACTIVE, the link layer matches, and RoCE ports have a suitable GID.
  ``exclude`` and ``min_rate_gbps`` do not apply to an explicit list.
* All chosen NICs must share one link layer and one GID index (Mooncake takes one
  MC_GID_INDEX); otherwise the filter fails and says so.
* Any failure raises AnsibleFilterError listing everything seen on the host.

``rdma_describe(rdma)`` returns the same human-readable inventory used in error messages.
"""

from __future__ import annotations

import fnmatch
import re

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - pure-python use (unit tests without ansible)
    class AnsibleFilterError(Exception):
        """Stand-in used when Ansible is not importable."""

AFFINITY_RANK = {"pix": 0, "numa": 1, "sys": 2}
LINK_LAYERS = ("any", "InfiniBand", "Ethernet")


def _natural_key(text):
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(text))]


def _fmt_rate(rate):
    if rate is None:
        return "? Gb/s"
    return "%g Gb/s" % rate


def rdma_describe(rdma):
    """Human-readable inventory of RDMA facts (devices, ports, GIDs, GPUs)."""
    rdma = rdma or {}
    lines = []
    devices = rdma.get("devices") or []
    if not devices:
        lines.append("RDMA devices: none (no class/infiniband entries under %s)"
                     % rdma.get("sysfs_root", "sysfs"))
    else:
        lines.append("RDMA devices:")
    for dev in devices:
        lines.append("  %s (pci %s, numa %s)" % (dev.get("name"), dev.get("pci"), dev.get("numa_node")))
        if not dev.get("ports"):
            lines.append("    no ports")
        for port in dev.get("ports") or []:
            lines.append("    port %s: %s/%s, %s, %s, netdev %s" % (
                port.get("port"), port.get("state"), port.get("phys_state"), port.get("link_layer"),
                _fmt_rate(port.get("rate_gbps")), port.get("netdev")))
            gids = port.get("gids") or []
            if not gids:
                lines.append("      GIDs: none")
            for gid in gids:
                lines.append("      GID %s: %s %s%s%s" % (
                    gid.get("index"), gid.get("type"), gid.get("gid"),
                    (" ipv4 %s" % gid["ipv4"]) if gid.get("ipv4") else "",
                    (" on %s" % gid["netdev"]) if gid.get("netdev") else ""))
    gpus = rdma.get("gpus") or []
    lines.append("GPUs: %s" % (", ".join("%s=%s(numa %s)" % (g.get("index"), g.get("pci"), g.get("numa_node"))
                                         for g in gpus) or "none"))
    return "\n".join(lines)


def _fail(instance_name, problem, rdma, extra=None):
    head = "rdma_select%s: %s" % ((" [instance %s]" % instance_name) if instance_name else "", problem)
    parts = [head]
    if extra:
        parts.append(extra)
    parts.append("Seen on this host:\n" + rdma_describe(rdma))
    raise AnsibleFilterError("\n".join(parts))


def _pick_gid(port, gid_type, require_ipv4):
    """The GID entry to use on a RoCE port, or None. Prefers GIDs on the port's netdev."""
    netdev = port.get("netdev")
    matches = []
    for gid in port.get("gids") or []:
        if gid_type and gid.get("type") != gid_type:
            continue
        if gid.get("link_local"):
            continue
        if require_ipv4 and not gid.get("ipv4"):
            continue
        if netdev and gid.get("netdev") and gid.get("netdev") != netdev:
            continue
        matches.append(gid)
    return min(matches, key=lambda g: g.get("index", 0)) if matches else None


def _excluded(dev, port, patterns):
    names = [dev.get("name"), "%s:%s" % (dev.get("name"), port.get("port"))]
    names += [n for n in (port.get("netdevs") or [port.get("netdev")]) if n]
    for pattern in patterns:
        for name in names:
            if name and fnmatch.fnmatchcase(name, pattern):
                return pattern
    return None


def _port_problem(port, link_layer, gid_type, require_ipv4):
    """Why a port cannot be used (None when it can). Returns (problem, gid)."""
    if port.get("state") != "ACTIVE":
        return ("port %s is %s (phys_state %s), not ACTIVE"
                % (port.get("port"), port.get("state"), port.get("phys_state")), None)
    if link_layer != "any" and port.get("link_layer") != link_layer:
        return ("port %s link layer is %s, expected %s"
                % (port.get("port"), port.get("link_layer"), link_layer), None)
    if port.get("link_layer") == "InfiniBand":
        return None, None
    gid = _pick_gid(port, gid_type, require_ipv4)
    if gid is None:
        return ("port %s has no %s GID%s on netdev %s (link-local/zero GIDs do not route; "
                "give the netdev an IPv4 address)"
                % (port.get("port"), gid_type or "usable", " with an IPv4 address" if require_ipv4 else "",
                   port.get("netdev")), None)
    return None, gid


def _entry(dev, port, gid, affinity):
    return {
        "nic": dev.get("name"),
        "port": port.get("port"),
        "netdev": port.get("netdev"),
        "link_layer": port.get("link_layer"),
        "rate_gbps": port.get("rate_gbps"),
        "gid_index": gid.get("index") if gid else None,
        "gid": gid.get("gid") if gid else None,
        "ipv4": gid.get("ipv4") if gid else None,
        "affinity": affinity,
    }


def _find_device(devices, token):
    """Resolve 'mlx5_0', 'mlx5_0:1' or a netdev name to (device, port number or None)."""
    name, _, port_txt = str(token).partition(":")
    port_num = int(port_txt) if port_txt.isdigit() else None
    for dev in devices:
        if dev.get("name") == name:
            return dev, port_num
    for dev in devices:
        for port in dev.get("ports") or []:
            if token in (port.get("netdevs") or []) or token == port.get("netdev"):
                return dev, port.get("port")
    return None, None


def _normalise_gpus(gpus):
    if gpus in (None, "", "none"):
        return []
    if isinstance(gpus, (int, str)):
        gpus = [gpus]
    out = []
    for gpu in gpus:
        try:
            out.append(int(gpu))
        except (TypeError, ValueError):
            raise AnsibleFilterError("rdma_select: gpus must be a list of GPU indexes, got %r" % (gpus,)) from None
    return out


def rdma_select(rdma, gpus=None, nics="auto", link_layer="any", exclude=None, gid_type="RoCE v2",
                require_ipv4=True, min_rate_gbps=0, instance_name=None):
    """Choose NICs (+ GID index) for one instance. See module docstring for the rules."""
    rdma = rdma or {}
    if link_layer not in LINK_LAYERS:
        raise AnsibleFilterError("rdma_select: link_layer must be one of %s, got %r"
                                 % (", ".join(LINK_LAYERS), link_layer))
    devices = sorted(rdma.get("devices") or [], key=lambda d: _natural_key(d.get("name")))
    gpu_list = _normalise_gpus(gpus)
    host_gpus = {g.get("index") for g in rdma.get("gpus") or []}
    missing = [g for g in gpu_list if g not in host_gpus]
    if missing and host_gpus:
        _fail(instance_name, "GPU index(es) %s not present on this host (GPUs %s)" % (missing, sorted(host_gpus)), rdma)
    # GPUs absent from a GPU-less host (lab VM with a CPU build) carry no affinity information
    gpu_list = [g for g in gpu_list if g in host_gpus]
    levels = {}
    for item in rdma.get("affinity") or []:
        levels[(item.get("gpu"), item.get("nic"))] = item.get("level", "sys")
    exclude = [str(p) for p in (exclude or [])]
    try:
        min_rate = float(min_rate_gbps or 0)
    except (TypeError, ValueError):
        raise AnsibleFilterError("rdma_select: min_rate_gbps must be a number, got %r" % (min_rate_gbps,)) from None

    def affinity_of(dev):
        return {g: levels.get((g, dev.get("name")), "sys") for g in gpu_list}

    chosen = []
    if nics in (None, "", "auto") or nics == ["auto"]:
        candidates, rejected = [], []
        for dev in devices:
            for port in dev.get("ports") or []:
                label = "%s:%s" % (dev.get("name"), port.get("port"))
                pattern = _excluded(dev, port, exclude)
                if pattern:
                    rejected.append("%s excluded by pattern %r" % (label, pattern))
                    continue
                problem, gid = _port_problem(port, link_layer, gid_type, require_ipv4)
                if problem:
                    rejected.append("%s: %s" % (label, problem))
                    continue
                rate = port.get("rate_gbps")
                if min_rate and (rate is None or rate < min_rate):
                    rejected.append("%s: rate %s below min_rate_gbps %g" % (label, _fmt_rate(rate), min_rate))
                    continue
                candidates.append((dev, port, gid))
        if not candidates:
            _fail(instance_name, "no usable RDMA port for nics=auto (link_layer=%s, gid_type=%s, require_ipv4=%s, "
                                 "min_rate_gbps=%s, exclude=%s)"
                  % (link_layer, gid_type, require_ipv4, min_rate_gbps, exclude),
                  rdma, "Rejected: " + ("; ".join(rejected) if rejected else "nothing to reject (no RDMA ports)"))
        picked = set()
        groups = [[g] for g in gpu_list] or [[]]
        for group in groups:
            def rank(cand, group=group):
                dev = cand[0]
                return min((AFFINITY_RANK.get(levels.get((g, dev.get("name")), "sys"), 2) for g in group), default=2)
            best = min(rank(c) for c in candidates)
            tier = [c for c in candidates if rank(c) == best]
            top_rate = max((c[1].get("rate_gbps") or 0) for c in tier)
            for cand in tier:
                if (cand[1].get("rate_gbps") or 0) == top_rate:
                    picked.add((cand[0].get("name"), cand[1].get("port")))
        for dev, port, gid in candidates:
            if (dev.get("name"), port.get("port")) in picked:
                chosen.append(_entry(dev, port, gid, affinity_of(dev)))
    else:
        tokens = [nics] if isinstance(nics, str) else list(nics)
        tokens = [t.strip() for tok in tokens for t in str(tok).split(",") if t.strip()]
        if not tokens:
            _fail(instance_name, "nics is an empty list; use 'auto' or name the NICs", rdma)
        for token in tokens:
            dev, port_num = _find_device(devices, token)
            if dev is None:
                _fail(instance_name, "NIC %r not found (not an RDMA device or netdev of one)" % token, rdma)
            ports = [p for p in dev.get("ports") or [] if port_num is None or p.get("port") == port_num]
            if not ports:
                _fail(instance_name, "NIC %r has no port %s" % (dev.get("name"), port_num), rdma)
            problems, found = [], None
            for port in ports:
                problem, gid = _port_problem(port, link_layer, gid_type, require_ipv4)
                if problem:
                    problems.append(problem)
                    continue
                found = _entry(dev, port, gid, affinity_of(dev))
                break
            if found is None:
                _fail(instance_name, "explicit NIC %r cannot be used: %s. Bring the port up or remove it from the "
                                     "instance's nics list (or use nics: auto)" % (token, "; ".join(problems)), rdma)
            if any(c["nic"] == found["nic"] and c["port"] == found["port"] for c in chosen):
                continue
            chosen.append(found)

    layers = sorted({c["link_layer"] for c in chosen})
    if len(layers) > 1:
        _fail(instance_name, "chosen NICs mix link layers %s (%s); set link_layer to InfiniBand or Ethernet"
              % (layers, ", ".join(c["nic"] for c in chosen)), rdma)
    gid_indexes = sorted({c["gid_index"] for c in chosen if c["gid_index"] is not None})
    if len(gid_indexes) > 1:
        _fail(instance_name, "chosen RoCE NICs need different GID indexes (%s), but Mooncake takes one MC_GID_INDEX; "
              "list NICs with the same GID layout explicitly" % ", ".join(
                  "%s=%s" % (c["nic"], c["gid_index"]) for c in chosen), rdma)
    port_nums = sorted({c["port"] for c in chosen})
    return {
        "nics": [c["nic"] for c in chosen],
        "netdevs": [c["netdev"] for c in chosen if c["netdev"]],
        "gid_index": gid_indexes[0] if gid_indexes else None,
        "ib_port": port_nums[0] if len(port_nums) == 1 else None,
        "link_layer": layers[0] if layers else None,
        "ports": chosen,
    }


class FilterModule(object):
    """Ansible filter plugin entry point."""

    def filters(self):
        return {
            "rdma_select": rdma_select,
            "rdma_describe": rdma_describe,
        }

#!/usr/bin/env bash
# System packages the controller needs for the test suite (Debian 12, root). Idempotent.
#  - libibverbs1/libnuma1/libcurl4: the Mooncake wheel used by the transfer-check tests
#  - iproute2: network namespaces for the transfer-check integration test
#  - systemd: systemd-analyze verify/security for the rendered units
#  - nftables: nft loads the rendered firewall rulesets in a throwaway network namespace (render test)
#  - util-linux: unshare for that namespace
#  - haproxy, keepalived: the entry role's configs checked by the real daemons, and a live HAProxy on
#    127.0.0.1 (tests/unit/test_entry_haproxy.py, which skips without them); openssl makes its test certificate
#  - prometheus, prometheus-alertmanager: promtool and amtool check the monitoring role's rules, prometheus.yml,
#    alertmanager.yml and the dashboard's queries, and run the alerts' unit tests (tests/unit/test_monitoring_*.py,
#    which fail without them). Only the tools are used; where systemd runs, apt also starts their services.
#  - jq: scripts/lab/status-test.sh reads Prometheus' targets on the controller
# The render tests fail (they do not skip) when systemd-analyze, nft or unshare is missing.
set -euo pipefail
pkgs=(python3-venv libibverbs1 libnuma1 libcurl4 iproute2 systemd nftables util-linux haproxy keepalived openssl prometheus prometheus-alertmanager jq)
missing=()
for p in "${pkgs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p"); done
if ((${#missing[@]})); then
  echo "[install-deps] installing: ${missing[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
fi

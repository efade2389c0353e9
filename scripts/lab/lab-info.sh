#!/usr/bin/env bash
# Prints how to reach the lab's router from this machine, and a request that works.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
labinv() { "$here/../../.venv/bin/python" "$here/labinv.py" "$@"; }
# Names, addresses and the model from the lab inventory (scripts/lab/labinv.py).
router=$(labinv router-host)
url=$(labinv router-url)
model=$(labinv var vllm_served_model_name)
first=$(labinv instances | sed -n 1p)
# The lab's router API key (Ansible Vault in the inventory; on the host in a 0600 env file). vllm-router
# 0.1.17 does not check it on client requests yet, but clients that hold it send it.
key=$(docker exec "$router" sed -n 's/^VLLM_ROUTER_API_KEY=//p' /etc/vllm-router/api-key.env 2>/dev/null || true)
auth="${key:+ -H 'Authorization: Bearer $key'}"
cat <<MSG

The lab is up. Router (vllm-router, PD disaggregation over Mooncake):  $url

  curl -s $url/v1/completions -H 'Content-Type: application/json'$auth \\
    -d '{"model": "$model", "prompt": "The prefill host computes the KV cache and", "max_tokens": 16}'

Inside a host:  docker exec -it ${first%%:*} systemctl status vllm@$(cut -d: -f2 <<<"$first")
Tear down:      make lab-destroy
MSG

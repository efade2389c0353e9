#!/usr/bin/env bash
# Prints how to reach the lab's router from this machine, and a request that works.
set -euo pipefail
ip=$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' router1)
# The lab's router API key (Ansible Vault in the inventory; on the host in a 0600 env file). vllm-router
# 0.1.17 does not check it on client requests yet, but clients that hold it send it.
key=$(docker exec router1 sed -n 's/^VLLM_ROUTER_API_KEY=//p' /etc/vllm-router/api-key.env 2>/dev/null || true)
auth="${key:+ -H 'Authorization: Bearer $key'}"
cat <<MSG

The lab is up. Router (vllm-router, PD disaggregation over Mooncake):  http://$ip:8000

  curl -s http://$ip:8000/v1/completions -H 'Content-Type: application/json'$auth \\
    -d '{"model": "tiny-llama", "prompt": "The prefill host computes the KV cache and", "max_tokens": 16}'

Inside a host:  docker exec -it prefill1 systemctl status vllm@prefill0
Tear down:      make lab-destroy
MSG

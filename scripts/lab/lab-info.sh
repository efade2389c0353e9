#!/usr/bin/env bash
# Prints how to reach the lab from this machine, and a request that works.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
labinv() { "$here/../../.venv/bin/python" "$here/labinv.py" "$@"; }
# Names, addresses and the model from the lab inventory (scripts/lab/labinv.py).
url=$(labinv client-url)
ca=$(labinv client-ca)
model=$(labinv var vllm_served_model_name)
first=$(labinv instances | sed -n 1p)
if [[ -n "$ca" ]]; then
  # The entry (HAProxy behind the keepalived VIP): TLS from the lab's entry CA, a client key from the lab's
  # vault (LAB ONLY password). No key is printed: the first line reads the key "lab" into KEY with ansible-vault
  # (run from the repository root, where `make lab` runs). README.md shows the same lines
  # (tests/unit/test_lab_scripts.py compares them).
  vault=molecule/default/inventory/group_vars/entry/vault.yml
  cat <<MSG

The lab is up. Entry (HAProxy + keepalived VIP, TLS, client keys) in front of the routers:  $url

  KEY=\$(.venv/bin/ansible-vault view --vault-password-file molecule/default/vault-pass-LAB-ONLY \\
        $vault | sed -n 's/^ *lab: //p')
  curl -s --cacert ${ca/#$HOME/\~} -H "Authorization: Bearer \$KEY" \\
    -H 'Content-Type: application/json' $url/v1/completions \\
    -d '{"model": "$model", "prompt": "The prefill host computes the KV cache and", "max_tokens": 16}'
MSG
else
  cat <<MSG

The lab is up. Router (vllm-router, PD disaggregation over Mooncake):  $url

  curl -s $url/v1/completions -H 'Content-Type: application/json' \\
    -d '{"model": "$model", "prompt": "The prefill host computes the KV cache and", "max_tokens": 16}'
MSG
fi
cat <<MSG

Inside a host:  docker exec -it ${first%%:*} systemctl status vllm@$(cut -d: -f2 <<<"$first")
Tear down:      make lab-destroy
MSG

"""scripts/lab/secret_scan.py must be able to fail: a vault value or one line of a private key in a log
is found and named (never printed), and a scan with nothing to look for is an error, not a pass."""
import importlib.util
from pathlib import Path

LAB = Path(__file__).resolve().parents[2] / "scripts" / "lab"
spec = importlib.util.spec_from_file_location("secret_scan", LAB / "secret_scan.py")
scan = importlib.util.module_from_spec(spec)
spec.loader.exec_module(scan)

# Made-up values for the test, not anyone's secrets.
KEY_LINE = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7"
PEM = f"-----BEGIN PRIVATE KEY-----\n{KEY_LINE}\nAbCdEfGhIjKlMnOpQrSt\n-----END PRIVATE KEY-----\n"


def _tree(tmp_path, log_text):
    (tmp_path / "pki").mkdir()
    (tmp_path / "pki" / "etcd1.key").write_text(PEM)
    (tmp_path / "pki" / "etcd1.crt").write_text("-----BEGIN CERTIFICATE-----\nnot-a-secret-line-public\n")
    log = tmp_path / "step-converge.log"
    log.write_text(log_text)
    return log


def test_vault_values_are_found_by_name(tmp_path):
    secrets = scan.vault_secrets(["inv/group_vars/vllm_router/vault.yml"],
                                 view=lambda f: "vault_key: lab-0123456789abcdef\nshort: abc\nn: {k: [x-secret-99]}\n")
    assert secrets == {"vllm_router/vault.yml:vault_key": "lab-0123456789abcdef",
                       "vllm_router/vault.yml:n.k[0]": "x-secret-99"}
    log = _tree(tmp_path, "ok: [router1]\n  Authorization: Bearer lab-0123456789abcdef\n")
    assert scan.scan([str(log)], secrets) == [(str(log), 2, "vllm_router/vault.yml:vault_key")]


def test_one_line_of_a_private_key_is_a_leak_and_certificates_are_not_secrets(tmp_path):
    log = _tree(tmp_path, f"+++ after: /etc/etcd/pki/etcd1.key\n+{KEY_LINE}\nnot-a-secret-line-public\n")
    secrets = scan.pem_secrets(tmp_path / "pki", public_pem=lambda _: "")
    assert list(secrets) == ["etcd1.key line 1", "etcd1.key line 2"]
    assert scan.scan([str(log)], secrets) == [(str(log), 2, "etcd1.key line 1")]


def test_a_pem_header_alone_is_a_leak(tmp_path):
    log = _tree(tmp_path, "-----BEGIN EC PRIVATE KEY-----\n")
    assert scan.scan([str(log)], {}) == [(str(log), 1, "a PEM private key header")]


def test_main_fails_on_a_leak_and_passes_a_clean_log(tmp_path, capsys, monkeypatch):
    log = _tree(tmp_path, f"changed: [etcd1]\n{KEY_LINE}\n")
    monkeypatch.setattr(scan, "_public_pem", lambda _: "")
    assert scan.main(["--logs", str(log), "--pem-dir", str(tmp_path / "pki")]) == 1
    err = capsys.readouterr().err
    assert "etcd1.key line 1" in err and KEY_LINE not in err
    log.write_text("ok: [etcd1]\n")
    assert scan.main(["--logs", str(log), "--pem-dir", str(tmp_path / "pki")]) == 0


def test_the_public_half_of_a_real_ec_key_is_not_a_secret(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                            serialization.NoEncryption()).decode()
    (tmp_path / "k.key").write_text(pem)
    public = scan._public_pem(pem)
    secrets = scan.pem_secrets(tmp_path)
    assert secrets and not set(secrets.values()) & set(scan._b64_lines(public))
    log = tmp_path / "a.log"
    log.write_text(public)                                   # what x509 info modules print
    assert scan.scan([str(log)], secrets) == []


def test_a_scan_that_cannot_fail_is_an_error(tmp_path, monkeypatch):
    log = _tree(tmp_path, "ok\n")
    monkeypatch.setattr(scan, "_public_pem", lambda _: "")
    assert scan.main(["--logs", str(log)]) == 2                                  # no secret to look for
    assert scan.main(["--logs", str(tmp_path / "none*.log"), "--pem-dir", str(tmp_path / "pki")]) == 2

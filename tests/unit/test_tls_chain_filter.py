"""plugins/filter/tls_chain.py: a converge skips the controller's certificate chain only while nothing is due.
Each reason to run it must be seen: a missing file, a changed file, request or recipe, a staged rotation, a
certificate (the name's or the CA's) in its renewal window, and no stamp yet."""
import datetime
import runpy
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

REPO = Path(__file__).resolve().parents[2]
tls = runpy.run_path(str(REPO / "plugins" / "filter" / "siblings.py"))["load"]("tls_chain")
NOW = datetime.datetime(2026, 12, 1, tzinfo=datetime.timezone.utc)


def _cert(days):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "t")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(NOW - datetime.timedelta(days=1))
            .not_valid_after(NOW + datetime.timedelta(days=days)).sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM)


@pytest.fixture
def chain(tmp_path):
    """A CA directory as the chain leaves it for member m1: CA, key, CSR, certificate and the stamp."""
    (tmp_path / "issued").mkdir()
    (tmp_path / "ca.crt").write_bytes(_cert(3650))
    (tmp_path / "issued" / "m1.key").write_text("KEY")
    (tmp_path / "issued" / "m1.csr").write_text("CSR")
    (tmp_path / "issued" / "m1.crt").write_bytes(_cert(365))
    recipe = tmp_path / "tls_issue.yml"
    recipe.write_text("- name: the chain\n")
    request = {"name": "m1", "sans": ["IP:10.0.0.1"], "eku": ["serverAuth"], "cas": ["ca"], "cert_days": 365}
    stamp = tls.tls_chain_stamp(request, str(tmp_path), str(recipe))
    (tmp_path / "issued" / "m1.stamp").write_text(stamp + "\n")
    return tmp_path, request, str(recipe)


def due(chain, request=None, **kw):
    ca_dir, req, recipe = chain
    return tls.tls_chain_due(request or req, str(ca_dir), recipe, kw.get("renew", 30), now=kw.get("now", NOW))


def test_nothing_due_when_all_matches(chain):
    assert due(chain) == ""


@pytest.mark.parametrize("path", ["ca.crt", "issued/m1.key", "issued/m1.csr", "issued/m1.crt"])
def test_a_missing_file_is_due(chain, path):
    (chain[0] / path).unlink()
    assert "missing" in due(chain)


@pytest.mark.parametrize("path", ["issued/m1.key", "issued/m1.csr"])
def test_a_changed_file_is_due(chain, path):
    (chain[0] / path).write_text("other")
    assert "changed" in due(chain)


def test_no_stamp_yet_is_due(chain):
    (chain[0] / "issued" / "m1.stamp").unlink()
    assert "changed" in due(chain)


def test_a_changed_request_is_due(chain):
    assert "changed" in due(chain, dict(chain[1], sans=["IP:10.0.0.1", "DNS:new"]))


def test_a_changed_recipe_is_due(chain):
    Path(chain[2]).write_text("- name: the chain, changed\n")
    assert "changed" in due(chain)


def test_a_staged_rotation_is_due(chain):
    assert "rotation" in due(chain, dict(chain[1], cas=["ca", "ca-next"]))


def test_a_certificate_in_its_renewal_window_is_due(chain):
    assert due(chain, now=NOW + datetime.timedelta(days=340)).endswith("expires within 30 days")
    assert due(chain, now=NOW + datetime.timedelta(days=330)) == ""


def test_a_ca_in_its_renewal_window_is_due(chain):
    ca_dir, req, recipe = chain
    (ca_dir / "ca.crt").write_bytes(_cert(20))
    (ca_dir / "issued" / "m1.stamp").write_text(tls.tls_chain_stamp(req, str(ca_dir), recipe))
    assert "ca.crt expires" in due(chain)


def test_a_broken_certificate_is_due(chain):
    ca_dir, req, recipe = chain
    (ca_dir / "issued" / "m1.crt").write_text("not a certificate")
    (ca_dir / "issued" / "m1.stamp").write_text(tls.tls_chain_stamp(req, str(ca_dir), recipe))
    assert "not a PEM certificate" in due(chain)

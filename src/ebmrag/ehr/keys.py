"""The client's key pair for SMART Backend Services: made once (`ebmrag ehr keygen`), the public half registered
with the EHR as a JWKS, the private half read from `[ehr.connections.<name>] private_key_file` to sign assertions.

A key's default `kid` is its RFC 7638 thumbprint, so the JWKS keygen prints and a PEM file configured without
`key_id` name the same key without anyone copying an id around.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from ebmrag.errors import ConfigError

RSA_BITS = 3072  # RS384 wants a key of at least 2048 bits; 3072 is the NIST size for use beyond 2030
_PUBLIC_MEMBERS = {"RSA": ("e", "kty", "n"), "EC": ("crv", "kty", "x", "y")}  # RFC 7638, in lexicographic order

PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey


@dataclass(frozen=True)
class SigningKey:
    """A private key fit for its algorithm, and the `kid` the EHR knows its public half by."""

    key: PrivateKey
    algorithm: str
    kid: str


def generate(algorithm: str) -> PrivateKey:
    if algorithm == "ES384":
        return ec.generate_private_key(ec.SECP384R1())
    if algorithm == "RS384":
        return rsa.generate_private_key(public_exponent=65537, key_size=RSA_BITS)
    raise ConfigError(f"the algorithm must be RS384 or ES384, got {algorithm!r}")


def public_jwk(key: PrivateKey, algorithm: str, kid: str = "") -> dict[str, Any]:
    """The public half as a JWK with `kid` (default: its thumbprint), `alg`, `use` and `key_ops`."""
    public = key.public_key()
    jwk: dict[str, Any] = dict(jwt.algorithms.RSAAlgorithm.to_jwk(public, as_dict=True)
                               if isinstance(public, rsa.RSAPublicKey)
                               else jwt.algorithms.ECAlgorithm.to_jwk(public, as_dict=True))
    jwk.update({"kid": kid or thumbprint(jwk), "alg": algorithm, "use": "sig", "key_ops": ["verify"]})
    return jwk


def thumbprint(jwk: dict[str, Any]) -> str:
    """RFC 7638: SHA-256 over the required public members, base64url without padding."""
    members = _PUBLIC_MEMBERS.get(str(jwk.get("kty")))
    if members is None:
        raise ConfigError(f"a JWK of type {jwk.get('kty')!r} has no thumbprint here (RSA or EC only)")
    canonical = json.dumps({k: jwk[k] for k in members}, separators=(",", ":"), sort_keys=True)
    return base64.urlsafe_b64encode(hashlib.sha256(canonical.encode()).digest()).rstrip(b"=").decode()


def write_private_key(key: PrivateKey, out: Path) -> None:
    """PKCS#8 PEM, owner-only (0600) from its first byte, and atomic: a crash leaves no half key, and an existing
    file is replaced only by a complete one."""
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    out.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)  # created 0600
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(pem)
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, out)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def load_signing_key(path: str | Path, algorithm: str, kid: str = "") -> SigningKey:
    """A PEM private key, or a JWK (or a JWKS holding the one named `kid`) with its private members. The key must
    fit the algorithm: RSA of 2048 bits or more for RS384, EC P-384 for ES384."""
    file = Path(path)
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise ConfigError(f"the private key file {file} cannot be read ({type(exc).__name__})") from None
    key, named = _from_jwk(raw, algorithm, kid, file) if raw.lstrip().startswith(b"{") else (_from_pem(raw, file), "")
    _check_fit(key, algorithm, file)
    return SigningKey(key, algorithm, kid or named or str(public_jwk(key, algorithm)["kid"]))


def _from_pem(raw: bytes, file: Path) -> PrivateKey:
    try:
        key = serialization.load_pem_private_key(raw, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{file} is not an unencrypted PEM private key ({type(exc).__name__})") from None
    if not isinstance(key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey):
        raise ConfigError(f"{file} holds a {type(key).__name__}; RS384 needs RSA, ES384 an EC P-384 key")
    return key


def _from_jwk(raw: bytes, algorithm: str, kid: str, file: Path) -> tuple[PrivateKey, str]:
    try:
        data = json.loads(raw)
    except ValueError:
        raise ConfigError(f"{file} is neither a PEM key nor JSON (a JWK or JWKS)") from None
    candidates = data.get("keys") if isinstance(data, dict) and "keys" in data else [data]
    private = [k for k in candidates if isinstance(k, dict) and "d" in k] if isinstance(candidates, list) else []
    chosen = [k for k in private if not kid or k.get("kid") == kid]
    if len(chosen) != 1:
        raise ConfigError(f"{file} must hold exactly one private JWK" + (f" with kid {kid!r}" if kid else "")
                          + f", found {len(chosen)}")
    try:
        key = jwt.PyJWK(chosen[0], algorithm).key
    except (jwt.PyJWKError, ValueError, TypeError, KeyError) as exc:
        raise ConfigError(f"{file} does not hold a usable {algorithm} JWK ({type(exc).__name__})") from None
    if not isinstance(key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey):
        raise ConfigError(f"{file} holds a public JWK; the private members are needed to sign")
    return key, str(chosen[0].get("kid") or "")


def _check_fit(key: PrivateKey, algorithm: str, file: Path) -> None:
    if algorithm == "RS384" and not (isinstance(key, rsa.RSAPrivateKey) and key.key_size >= 2048):
        raise ConfigError(f"{file}: RS384 needs an RSA key of at least 2048 bits")
    if algorithm == "ES384" and not (isinstance(key, ec.EllipticCurvePrivateKey)
                                     and isinstance(key.curve, ec.SECP384R1)):
        raise ConfigError(f"{file}: ES384 needs an EC key on the P-384 curve")

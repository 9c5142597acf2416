#!/usr/bin/env python3
"""Mints the JWTs of tests/jwt.rs with PyJWT (and writes its JWKS file), as an issuer would.

Usage: jwt_tokens.py SPEC.json — prints {"<name>": "<token>", ...} on stdout.

SPEC: {"tokens": [{"name", "kind", "alg", "key", "claims", "headers"?}], "jwks"?: {"path",
"keys": [{"kid", "alg", "key"}]}}. A token's kind:
  - "signed": PyJWT signs `claims` with the private key (PEM) or HS256 secret in file `key`;
  - "none":   an unsigned token, header {"alg": "none"} (PyJWT has no key to give it);
  - "hmac":   header alg HS256, HMAC-SHA256 with the raw bytes of file `key` as the secret
              (an RSA public key: the algorithm-confusion attack, which PyJWT refuses to
              sign, so it is done by hand here).
A JWKS key's `key` is the public key's PEM file, or the secret's file for HS256.
"""
import base64
import hashlib
import hmac
import json
import sys

import jwt
from jwt.algorithms import get_default_algorithms


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def segment(obj) -> str:
    return b64(json.dumps(obj, separators=(",", ":")).encode())


def secret(path: str) -> bytes:
    data = open(path, "rb").read()
    return data[:-1] if data.endswith(b"\n") else data


def mint(t) -> str:
    kind = t.get("kind", "signed")
    headers = dict(t.get("headers", {}))
    claims = t["claims"]
    if kind == "signed":
        key = secret(t["key"]) if t["alg"] == "HS256" else open(t["key"], "rb").read()
        return jwt.encode(claims, key, algorithm=t["alg"], headers=headers or None)
    if kind == "none":
        header = {"alg": "none", "typ": "JWT", **headers}
        return f"{segment(header)}.{segment(claims)}."
    if kind == "hmac":
        header = {"alg": "HS256", "typ": "JWT", **headers}
        message = f"{segment(header)}.{segment(claims)}".encode()
        mac = hmac.new(open(t["key"], "rb").read(), message, hashlib.sha256).digest()
        return f"{message.decode()}.{b64(mac)}"
    raise SystemExit(f"unknown token kind {kind!r}")


def jwk(k) -> dict:
    algorithms = get_default_algorithms()
    alg = algorithms[k["alg"]]
    if k["alg"] == "HS256":
        out = json.loads(alg.to_jwk(secret(k["key"])))
    else:
        out = json.loads(alg.to_jwk(alg.prepare_key(open(k["key"], "rb").read())))
    out["kid"] = k["kid"]
    out["alg"] = k["alg"]
    return out


def main() -> None:
    spec = json.load(open(sys.argv[1]))
    if "jwks" in spec:
        keys = [jwk(k) for k in spec["jwks"]["keys"]]
        with open(spec["jwks"]["path"], "w") as f:
            json.dump({"keys": keys}, f)
    print(json.dumps({t["name"]: mint(t) for t in spec["tokens"]}))


if __name__ == "__main__":
    main()

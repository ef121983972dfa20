"""``--web-config-file``: TLS and basic authentication in the Prometheus exporter-toolkit's web
configuration format, so an exporter set up like every other on a node needs no new knowledge.

The file is read once, at start, and checked whole before the exporter listens: every key is known
(a misspelt key would silently leave a setting off), every path is read, every password hash is a
bcrypt hash. The toolkit's settings that Python's ssl module cannot honour as Go does (inline
certificates, Go cipher suite and curve names, client certificates accepted unverified, allowed
SANs, rate limits) are refused by name rather than ignored. :func:`parse` is pure;
:func:`load` and :func:`tls_context` read files.
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nvc.errors import InputError, shown

MAX_SIZE = 1 << 20  # bytes of web configuration: a real one is a few hundred
OPTION = "--web-config-file"

# client_auth_type → what the server asks of a client's certificate (Go's names; the two that take
# a certificate without verifying it have no ssl equivalent and are refused).
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# http_server_config.headers the toolkit accepts, and the values it allows (None: any one-line text).
HEADERS: dict[str, tuple[str, ...] | None] = {
    "Content-Security-Policy": None,
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-Content-Type-Options": ("nosniff",),
    "X-XSS-Protection": None,
    "Strict-Transport-Security": None,
}
_BCRYPT = re.compile(r"\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")
_HEADER_VALUE = re.compile(r"[\x20-\x7e]{1,1024}")

_TLS_KEYS = {
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "min_version",
    "max_version",
    "prefer_server_cipher_suites",
}
# The toolkit's settings refused by name, and what to do instead.
_TLS_UNSUPPORTED = {
    "cert": "give cert_file",
    "key": "give key_file",
    "client_ca": "give client_ca_file",
    "cipher_suites": "OpenSSL's defaults apply",
    "curve_preferences": "OpenSSL's defaults apply",
    "client_allowed_sans": "use client_ca_file with a CA of its own",
}
_TOP_UNSUPPORTED = {"rate_limit": "connections are bounded instead (docs/metrics.md)"}


@dataclass(frozen=True)
class Tls:
    cert_file: str
    key_file: str
    client_auth: str = "NoClientCert"  # a key of CLIENT_AUTH
    client_ca_file: str | None = None
    min_version: str = "TLS12"  # keys of VERSIONS
    max_version: str = "TLS13"
    prefer_server_ciphers: bool = True


@dataclass(frozen=True)
class WebConfig:
    tls: Tls | None = None  # None: plain HTTP
    users: Mapping[str, bytes] = field(default_factory=dict)  # name → bcrypt hash; empty: no authentication
    headers: Mapping[str, str] = field(default_factory=dict)  # added to every response


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise InputError(f"{where}: not a mapping of names")
    return value


def _known(document: dict[str, Any], known: set[str], where: str, unsupported: Mapping[str, str] | None = None) -> None:
    for key in document:
        if unsupported and key in unsupported:
            raise InputError(f"{where}{key}: not supported by nvc-py ({unsupported[key]})")
        if key not in known:
            raise InputError(f"{where}{shown(key)}: not a web configuration setting")


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise InputError(f"{where}: not a non-empty string")
    return value


def _choice(value: Any, choices: Mapping[str, Any] | tuple[str, ...], where: str) -> str:
    if value not in choices:
        raise InputError(f"{where}: {shown(str(value))} is not one of {', '.join(choices)}")
    return value


def _tls(section: dict[str, Any], base: str, where: str) -> Tls | None:
    _known(section, _TLS_KEYS, where, _TLS_UNSUPPORTED)
    given = {key: value for key, value in section.items() if value not in (None, "")}
    if not given:  # the toolkit's reading of an empty section: plain HTTP
        return None
    paths = {
        key: os.path.join(base, _text(given[key], where + key)) if key in given else None
        for key in ("cert_file", "key_file", "client_ca_file")
    }
    for key in ("cert_file", "key_file"):
        if paths[key] is None:
            raise InputError(f"{where}{key}: missing (TLS needs a certificate and its key)")
    auth = _choice(given.get("client_auth_type", "NoClientCert"), CLIENT_AUTH, where + "client_auth_type")
    if (auth == "NoClientCert") != (paths["client_ca_file"] is None):
        raise InputError(
            f"{where}client_auth_type: {auth} "
            + (
                "with a client_ca_file (name RequireAndVerifyClientCert or VerifyClientCertIfGiven)"
                if auth == "NoClientCert"
                else "needs client_ca_file (the CA that signs the clients' certificates)"
            )
        )
    low = _choice(given.get("min_version", "TLS12"), VERSIONS, where + "min_version")
    high = _choice(given.get("max_version", "TLS13"), VERSIONS, where + "max_version")
    if VERSIONS[low] > VERSIONS[high]:
        raise InputError(f"{where}min_version: {low} is above max_version {high}")
    prefer = given.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        raise InputError(f"{where}prefer_server_cipher_suites: not true or false")
    return Tls(
        paths["cert_file"],
        paths["key_file"],
        auth,
        paths["client_ca_file"],
        low,
        high,  # type: ignore[arg-type]
        prefer,
    )


def _users(section: dict[str, Any], where: str) -> dict[str, bytes]:
    users = {}
    for name, hashed in section.items():
        if not name or ":" in name or not name.isprintable():
            raise InputError(f"{where}{shown(name)}: not a user name (printable, without ':')")
        if not isinstance(hashed, str) or not _BCRYPT.fullmatch(hashed):
            raise InputError(
                f"{where}{name}: not a bcrypt hash ($2y$10$ and 53 characters; "
                "`htpasswd -nBC 10 \"\" | tr -d ':\\n'` makes one)"
            )
        users[name] = hashed.encode()
    return users


def _headers(section: dict[str, Any], where: str) -> dict[str, str]:
    _known(section, set(HEADERS), where)
    headers = {}
    for name, value in section.items():
        if value in (None, ""):
            continue  # the toolkit's "unset if blank"
        if not isinstance(value, str) or not _HEADER_VALUE.fullmatch(value):
            raise InputError(f"{where}{name}: not one line of printable ASCII (at most 1024 characters)")
        allowed = HEADERS[name]
        if allowed is not None:
            _choice(value.lower(), allowed, where + name)
        headers[name] = value
    return headers


def parse(document: Any, path: str) -> WebConfig:
    """The web configuration in ``document`` (the file's YAML); relative paths are taken from the
    file's directory, as the toolkit takes them."""
    top = _mapping(document, path)
    _known(top, {"tls_server_config", "http_server_config", "basic_auth_users"}, f"{path}: ", _TOP_UNSUPPORTED)
    base = os.path.dirname(os.path.abspath(path))
    tls = _tls(
        _mapping(top.get("tls_server_config"), f"{path}: tls_server_config"), base, f"{path}: tls_server_config."
    )
    http = _mapping(top.get("http_server_config"), f"{path}: http_server_config")
    _known(http, {"http2", "headers"}, f"{path}: http_server_config.")
    if not isinstance(http.get("http2", True), bool):  # HTTP/1 is served either way (docs/metrics.md)
        raise InputError(f"{path}: http_server_config.http2: not true or false")
    headers = _headers(
        _mapping(http.get("headers"), f"{path}: http_server_config.headers"), f"{path}: http_server_config.headers."
    )
    users = _users(_mapping(top.get("basic_auth_users"), f"{path}: basic_auth_users"), f"{path}: basic_auth_users.")
    return WebConfig(tls, users, headers)


def load(path: str) -> WebConfig:
    """The web configuration file at ``path``, read and checked."""
    from nvc.config.yamlfile import read_yaml
    from nvc.system.untrusted import read_file

    try:
        data, _ = read_file(path, MAX_SIZE)
    except OSError as err:
        raise InputError(f"{OPTION} {path}: {err.strerror}") from None
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text") from None
    return parse(read_yaml(text, path), path)


def tls_context(tls: Tls) -> ssl.SSLContext:
    """A server context with the certificate, key and client CA loaded (each file's error named)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version, context.maximum_version = VERSIONS[tls.min_version], VERSIONS[tls.max_version]
    if tls.prefer_server_ciphers:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    except OSError as err:  # ssl.SSLError included
        detail = err.strerror or getattr(err, "reason", None) or str(err)
        raise InputError(
            f"{tls.cert_file}, {tls.key_file}: cannot load the certificate and its key: {detail}"
        ) from None
    context.verify_mode = CLIENT_AUTH[tls.client_auth]
    if tls.client_ca_file is not None:
        try:
            context.load_verify_locations(cafile=tls.client_ca_file)
        except OSError as err:
            detail = err.strerror or getattr(err, "reason", None) or str(err)
            raise InputError(f"{tls.client_ca_file}: cannot load the client CA: {detail}") from None
    return context

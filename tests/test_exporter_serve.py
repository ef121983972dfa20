"""``nvc-py exporter``'s HTTP endpoint under hostile clients (a slow one, idle ones, oversize and
malformed requests: a scrape beside each is answered within a second) and its web configuration
(TLS, client certificates, basic authentication, refused files). Real sockets on 127.0.0.1, the
installed exporter; every client and exporter stops within the test.

Test double only: no figure here is a GPU result.
"""

from __future__ import annotations

import http.client
import select
import signal
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.exporter import start as _exporter
from harness.installed import SCRIPTS
from nvc.exporter.serve import HEAD_TIMEOUT, MAX_CONNECTIONS, MAX_HEAD

HOST = "127.0.0.1"
SCRAPE_LIMIT = 1.0  # seconds a scrape may take beside an attack (one takes milliseconds alone)

Start = Callable[..., int]


@pytest.fixture
def exporter(tmp_path: Path) -> Iterator[Start]:
    """Starts the installed exporter on a free loopback port with the given options; its port.
    Each is stopped with SIGTERM at the end, and must exit 0 having printed nothing more."""
    started: list[subprocess.Popen] = []

    def run(*args: str) -> int:
        proc, url = _exporter(
            tmp_path,
            f"{HOST}:0",
            "--no-nvml",
            "--state-dir",
            str(tmp_path / "none"),
            "--hook-log",
            str(tmp_path / "hook.log"),
            *args,
        )
        started.append(proc)
        return int(url.rsplit(":", 1)[1].split("/")[0])

    yield run
    for proc in started:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        assert proc.stderr.read() == ""  # no traceback from any connection's thread


def _get(
    port: int,
    *,
    context: ssl.SSLContext | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = SCRAPE_LIMIT,
) -> tuple[http.client.HTTPResponse, str, float]:
    """One GET of /metrics: the response, its body and the seconds it took."""
    begun = time.monotonic()
    conn = (
        http.client.HTTPSConnection(HOST, port, timeout=timeout, context=context)
        if context
        else http.client.HTTPConnection(HOST, port, timeout=timeout)
    )
    try:
        conn.request("GET", "/metrics", headers=headers or {})
        response = conn.getresponse()
        body = response.read().decode()
    finally:
        conn.close()
    return response, body, time.monotonic() - begun


def _scrape(port: int, **given: object) -> None:
    """A scrape, answered with the metrics within SCRAPE_LIMIT."""
    response, body, took = _get(port, **given)  # type: ignore[arg-type]
    assert response.status == 200 and "nvc_py_share_containers" in body and took < SCRAPE_LIMIT, (response.status, took)


def _connect(port: int) -> socket.socket:
    return socket.create_connection((HOST, port), timeout=10)


def _closed(sock: socket.socket) -> bool:
    """Whether the exporter closed ``sock`` (readable at its end, or reset)."""
    if not select.select([sock], [], [], 0)[0]:
        return False
    try:
        return sock.recv(1 << 16) == b""
    except OSError:
        return True


def _answer(sock: socket.socket) -> bytes:
    """Everything the exporter sends until it closes the connection."""
    data = b""
    while chunk := sock.recv(1 << 16):
        data += chunk
    return data


# ---------------------------------------------------------------- hostile clients


def test_a_slow_client_holds_up_no_scrape_and_is_dropped(exporter: Start) -> None:
    """A client sending its head a byte every 3 s: scrapes beside it are answered at once, and the
    exporter closes it HEAD_TIMEOUT after it connected, however steadily it sends."""
    port = exporter()
    slow = _connect(port)
    begun = time.monotonic()
    slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    dropped = None
    with slow:
        for _ in range(5):
            _scrape(port)
            if select.select([slow], [], [], 3)[0] and _closed(slow):
                dropped = time.monotonic() - begun
                break
            slow.sendall(b"X")
    assert dropped is not None and HEAD_TIMEOUT - 0.5 < dropped < HEAD_TIMEOUT + 3.5, dropped


@pytest.mark.parametrize("count", [100, 3 * MAX_CONNECTIONS])
def test_idle_connections_hold_up_no_scrape(exporter: Start, count: int) -> None:
    """Connections that send nothing: a scrape is answered beside 100 of them; beyond MAX_CONNECTIONS
    the oldest are closed to make room (the bound holds, a scrape still gets in); the rest are
    closed HEAD_TIMEOUT after they connected."""
    port = exporter()
    idle = [_connect(port) for _ in range(count)]
    connected = time.monotonic()
    try:
        _scrape(port)
        closed = [sock for sock in idle if _closed(sock)]
        assert len(closed) >= count - MAX_CONNECTIONS, len(closed)
        assert set(closed) <= set(idle[: count - MAX_CONNECTIONS + 1])  # the oldest ones
        open_ = [sock for sock in idle if sock not in closed]
        while open_ and time.monotonic() - connected < HEAD_TIMEOUT + 3:
            select.select(open_, [], [], 0.5)
            open_ = [sock for sock in open_ if not _closed(sock)]
        assert not open_ and time.monotonic() - connected > HEAD_TIMEOUT - 0.5
        _scrape(port)
    finally:
        for sock in idle:
            sock.close()


@pytest.mark.parametrize(
    "headers",
    [
        [b"X-Big: " + b"a" * 70_000],  # one 70 KB header
        [b"X-Part-%d: " % i + b"a" * 10_000 for i in range(7)],  # 70 KB in lines http.server takes one by one
    ],
    ids=["one-line", "seven-lines"],
)
def test_a_70k_head_is_answered_431_and_holds_up_no_scrape(exporter: Start, headers: list[bytes]) -> None:
    """A head over MAX_HEAD bytes: 431, whether one line or many; a scrape while it is half sent is
    answered at once."""
    port = exporter()
    head = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"\r\n".join(headers) + b"\r\n\r\n"
    assert len(head) > 70_000 > MAX_HEAD
    with _connect(port) as big:
        big.sendall(head[:40_000])
        _scrape(port)
        try:
            big.sendall(head[40_000:])
        except (BrokenPipeError, ConnectionResetError):  # the exporter may answer before it all arrived
            pass
        answer = _answer(big)
    assert answer.startswith(b"HTTP/1.0 431 Request Header Fields Too Large\r\n"), answer[:100]
    _scrape(port)


@pytest.mark.parametrize(
    ("request_", "status"),
    [
        (b"GARBAGE\r\n\r\n", b"400 Bad Request"),
        (b"GET /metrics HTTP/1.1 extra\r\n\r\n", b"400 Bad Request"),
        (b"GET /metrics HTTP/x.y\r\n\r\n", b"400 Bad Request"),
        (b"GET /" + b"a" * MAX_HEAD + b" HTTP/1.1\r\n\r\n", b"414 Request-URI Too Long"),
        (
            b"GET /metrics HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(101)) + b"\r\n",
            b"431 Request Header Fields Too Large",
        ),
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"501 Not Implemented"),
    ],
    ids=["one-word", "four-words", "bad-version", "long-request-line", "101-headers", "post"],
)
def test_malformed_requests_get_a_status_line(exporter: Start, request_: bytes, status: bytes) -> None:
    port = exporter()
    with _connect(port) as sock:
        sock.sendall(request_)
        answer = _answer(sock)
    assert answer.startswith(b"HTTP/1.0 " + status + b"\r\n"), answer[:100]
    assert b"Python" not in answer  # the Server header names no interpreter version


# ---------------------------------------------------------------- web configuration


def _certificate(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate (also its own CA) for 127.0.0.1, and its key."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "2",
            "-subj",
            f"/CN={name}",
            "-addext",
            f"subjectAltName=IP:{HOST}",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


def _client_context(server_cert: Path, client: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(server_cert))
    if client is not None:
        context.load_cert_chain(*map(str, client))
    return context


def test_tls_serves_https_only(exporter: Start, tmp_path: Path) -> None:
    """cert_file and key_file (relative: beside the configuration): a scrape over TLS verifying the
    certificate is answered; plain HTTP gets no answer; a TLS client that never finishes its
    handshake holds up no scrape."""
    cert, _ = _certificate(tmp_path, "server")
    (tmp_path / "web.yml").write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n")
    port = exporter("--web-config-file", str(tmp_path / "web.yml"))
    with _connect(port):  # opens TCP, sends no ClientHello
        _scrape(port, context=_client_context(cert))
        with pytest.raises((http.client.HTTPException, OSError)):
            _get(port, timeout=5)
        _scrape(port, context=_client_context(cert))


def test_tls_client_certificates_are_verified(exporter: Start, tmp_path: Path) -> None:
    """RequireAndVerifyClientCert with client_ca_file: a client with a certificate the CA signed is
    answered; one without a certificate, or with another, is not."""
    cert, key = _certificate(tmp_path, "server")
    client = _certificate(tmp_path, "client")
    stranger = _certificate(tmp_path, "stranger")
    (tmp_path / "web.yml").write_text(
        f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
        f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {client[0]}\n  min_version: TLS13\n"
    )
    port = exporter("--web-config-file", str(tmp_path / "web.yml"))
    _scrape(port, context=_client_context(cert, client))
    for refused in (None, stranger):
        with pytest.raises((http.client.HTTPException, OSError)):
            _get(port, context=_client_context(cert, refused), timeout=5)


def test_basic_auth_with_bcrypt_hashes(exporter: Start, tmp_path: Path) -> None:
    """basic_auth_users: no credentials, a wrong password or an unknown user get 401 with a Basic
    challenge; the right ones the metrics (again at once: a verified password is remembered).
    http_server_config.headers go on every response."""
    import base64

    import bcrypt

    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(10)).decode().replace("$2b$", "$2y$", 1)  # as htpasswd writes it
    (tmp_path / "web.yml").write_text(
        f"basic_auth_users:\n  prometheus: '{hashed}'\n"
        "http_server_config:\n  headers:\n    X-Frame-Options: deny\n    X-Content-Type-Options: nosniff\n"
    )
    port = exporter("--web-config-file", str(tmp_path / "web.yml"))

    def basic(user: str, password: str) -> dict[str, str]:
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}

    for headers in (
        {},
        basic("prometheus", "wrong"),
        basic("nobody", "s3cret"),
        {"Authorization": "Bearer s3cret"},
        {"Authorization": "Basic !!!"},
        basic("prometheus", "s3cret" * 20),
    ):
        response, body, _ = _get(port, headers=headers, timeout=5)
        assert response.status == 401 and "nvc_py" not in body, (headers, response.status)
        assert response.getheader("WWW-Authenticate", "").startswith('Basic realm="nvc-py exporter"')
        assert response.getheader("X-Frame-Options") == "deny"
    for _ in range(2):
        response, body, _ = _get(port, headers=basic("prometheus", "s3cret"), timeout=5)
        assert response.status == 200 and "nvc_py_share_containers" in body
        assert (response.getheader("X-Frame-Options"), response.getheader("X-Content-Type-Options")) == (
            "deny",
            "nosniff",
        )
    _scrape(port, headers=basic("prometheus", "s3cret"))


HASH = "$2y$10$X0h1gDsPszWURQaxFh.zoubFi6DXncSjhoQNJgRrnGs7EsimhC7zG"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "--web-config-file {path}: No such file or directory"),
        ("tls_server_config: [", "{path}: not valid YAML at line 1"),
        ("- a list", "{path}: not a mapping of names"),
        ("basic_auth_user:\n  a: x\n", "{path}: 'basic_auth_user': not a web configuration setting"),
        ("basic_auth_users:\n  alice: plain-password\n", "{path}: basic_auth_users.alice: not a bcrypt hash"),
        ("basic_auth_users:\n  'a:b': '" + HASH + "'\n", "{path}: basic_auth_users.'a:b': not a user name"),
        ("tls_server_config:\n  key_file: k.pem\n", "{path}: tls_server_config.cert_file: missing"),
        (
            "tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
            "{path}: tls_server_config.cipher_suites: not supported by nvc-py",
        ),
        (
            "tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n  client_auth_type: RequireAndVerifyClientCert\n",
            "{path}: tls_server_config.client_auth_type: RequireAndVerifyClientCert needs client_ca_file",
        ),
        (
            "tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n  client_auth_type: RequireAnyClientCert\n",
            "{path}: tls_server_config.client_auth_type: 'RequireAnyClientCert' is not one of",
        ),
        (
            "tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n  min_version: TLS13\n  max_version: TLS12\n",
            "{path}: tls_server_config.min_version: TLS13 is above max_version TLS12",
        ),
        (
            "tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n",
            "{dir}/c.pem, {dir}/k.pem: cannot load the certificate and its key: No such file",
        ),
        (
            "tls_server_config:\n  cert_file: web.yml\n  key_file: web.yml\n",
            "{dir}/web.yml, {dir}/web.yml: cannot load",
        ),
        (
            'http_server_config:\n  headers:\n    X-Frame-Options: "deny\\r\\nX-Evil: 1"\n',
            "{path}: http_server_config.headers.X-Frame-Options: not one line of printable ASCII",
        ),
        ("rate_limit:\n  interval: 1s\n", "{path}: rate_limit: not supported by nvc-py"),
    ],
    ids=[
        "missing",
        "yaml",
        "list",
        "unknown-key",
        "plain-password",
        "colon-user",
        "no-cert",
        "cipher-suites",
        "no-client-ca",
        "unverified-client-certs",
        "versions",
        "missing-cert",
        "not-pem",
        "header-injection",
        "rate-limit",
    ],
)
def test_a_bad_web_configuration_is_refused_before_listening(tmp_path: Path, text: str | None, message: str) -> None:
    path = tmp_path / "web.yml"
    if text is not None:
        path.write_text(text)
    result = subprocess.run(
        [
            str(SCRIPTS / "nvc-py"),
            "exporter",
            "--listen",
            f"{HOST}:0",
            "--no-nvml",
            "--state-dir",
            str(tmp_path / "none"),
            "--web-config-file",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    expected = "nvc-py: input error: " + message.format(path=path, dir=tmp_path)
    assert result.returncode == 2 and result.stderr.startswith(expected), result.stderr
    assert result.stderr.count("\n") == 1 and "listening" not in result.stderr


def test_loopback_stays_the_default() -> None:
    help_text = subprocess.run(
        [str(SCRIPTS / "nvc-py"), "exporter", "--help"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    assert "[default: 127.0.0.1:9402]" in " ".join(help_text.split())


def test_scrapes_at_once_from_threads(exporter: Start) -> None:
    """Eight scrapes at once, twice over: each answered, the collector taking them in turn."""
    port = exporter()
    failures: list[BaseException] = []

    def scrape() -> None:
        try:
            response, _, _ = _get(port, timeout=10)
            assert response.status == 200
        except BaseException as err:  # noqa: BLE001 - reported below
            failures.append(err)

    for _ in range(2):
        threads = [threading.Thread(target=scrape) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
    assert not failures

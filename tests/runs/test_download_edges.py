"""Download edges, against file:// URLs and a local HTTP server on 127.0.0.1 (never the network): a file already in
place with the wrong checksum, a 416 answer with nothing to resume, a body shorter than announced, and checksums
given in upper case."""

from __future__ import annotations

import hashlib
import http.server
import socket
import threading

import pytest

from targetpo.runs.download import Remote, download


class _Handler(http.server.BaseHTTPRequestHandler):
    status = 200
    body = b""
    announced: int | None = None  # Content-Length to send (the body's own length when None)

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.status != 200:
            self.send_error(self.status)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body) if self.announced is None else self.announced))
        self.end_headers()
        self.wfile.write(self.body)
        self.wfile.flush()
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    handler = type("H", (_Handler,), {})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield handler, f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _file_remote(tmp_path, body: bytes, checksum: str) -> Remote:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "x.bin").write_bytes(body)
    return Remote((src / "x.bin").as_uri(), checksum, "x.bin")


def test_a_file_in_place_with_the_wrong_checksum_is_refused(tmp_path):
    body = b"the published bytes"
    remote = _file_remote(tmp_path, body, "sha256:" + _sha(body))
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "x.bin").write_bytes(b"something else")
    with pytest.raises(ValueError, match="exists but its SHA256 is not the published"):
        download(remote, dest, progress=False)
    assert (dest / "x.bin").read_bytes() == b"something else"  # left for the user to move away


def test_an_upper_case_checksum_matches(tmp_path):
    body = b"hex digits in either case"
    remote = _file_remote(tmp_path, body, "sha256:" + _sha(body).upper())
    assert download(remote, tmp_path / "dest", progress=False).read_bytes() == body


def test_http_416_without_a_partial_file_is_an_error(server, tmp_path):
    """416 (range not satisfiable) means "already complete" only when a partial file was there to resume."""
    handler, url = server
    handler.status = 416
    with pytest.raises(OSError, match="HTTP 416"):
        download(Remote(f"{url}/x.bin", "sha256:" + _sha(b"x"), "x.bin"), tmp_path, progress=False)
    assert not (tmp_path / "x.bin").exists()


def test_a_body_one_byte_short_keeps_the_partial_file(server, tmp_path):
    """The server announces 101 bytes and sends 100: the transfer stopped early, so the 100 bytes stay in the
    .part file for the next run to resume."""
    handler, url = server
    full = bytes(range(101))
    handler.body, handler.announced = full[:100], 101
    with pytest.raises(OSError, match="the transfer stopped at 100 of 101 bytes"):
        download(Remote(f"{url}/x.bin", "sha256:" + _sha(full), "x.bin"), tmp_path, progress=False)
    assert (tmp_path / "x.bin.part").read_bytes() == full[:100]

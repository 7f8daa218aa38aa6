"""Explicit downloads against a local HTTP server on 127.0.0.1 serving files the test creates (never the
network): checksums (of a file already in place, in either case), resume with HTTP Range, a server that ignores
Range, a 416 answer with nothing to resume, a body shorter than announced, and the `targetpo data` command."""

from __future__ import annotations

import hashlib
import http.server
import socket
import threading
import time
from pathlib import Path

import pytest

from targetpo.cli import main
from targetpo.runs.download import Remote, download


class _Handler(http.server.BaseHTTPRequestHandler):
    files: dict[str, bytes] = {}
    honour_range = True
    seen_ranges: list[str | None] = []
    cut_after: int | None = None  # send this many bytes of the answer, then close the connection
    chunked = False               # answer with Transfer-Encoding: chunked (no Content-Length)
    stall_s = 0.0                 # wait this long after the headers before the body
    status: int | None = None     # answer every request with this error status

    def do_GET(self):  # noqa: N802 (http.server's name)
        body = self.files.get(self.path.rsplit("/", 1)[-1])
        if self.status is not None or body is None:
            self.send_error(self.status or 404)
            return
        rng = self.headers.get("Range")
        self.seen_ranges.append(rng)
        start = int(rng.split("=")[1].rstrip("-")) if rng and self.honour_range else 0
        self.send_response(206 if start else 200)
        if self.chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        time.sleep(self.stall_s)
        data = body[start:] if self.cut_after is None else body[start:start + self.cut_after]
        if self.chunked:
            data = b"%x\r\n" % len(data) + data + b"\r\n"
        self.wfile.write(data)
        if self.cut_after is not None:
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    handler = type("H", (_Handler,), {"files": {}, "seen_ranges": [], "honour_range": True, "cut_after": None,
                                      "chunked": False, "stall_s": 0.0, "status": None})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield handler, f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _sha(b: bytes) -> str:
    return "sha256:" + hashlib.sha256(b).hexdigest()


def test_download_verifies_and_resumes(server, tmp_path):
    handler, url = server
    body = bytes(range(256)) * 400
    handler.files["a.bin"] = body
    remote = Remote(f"{url}/a.bin", _sha(body), "a.bin")
    (tmp_path / "a.bin.part").write_bytes(body[:1000])  # an interrupted earlier download
    path = download(remote, tmp_path, progress=False)
    assert path.read_bytes() == body and handler.seen_ranges == ["bytes=1000-"]
    assert not (tmp_path / "a.bin.part").exists()
    download(remote, tmp_path, progress=False)  # already there and verified: no request
    assert len(handler.seen_ranges) == 1


def test_server_ignoring_range_restarts_the_file(server, tmp_path):
    handler, url = server
    handler.honour_range = False
    body = b"x" * 5000 + b"y" * 5000
    handler.files["b.bin"] = body
    (tmp_path / "b.bin.part").write_bytes(b"garbage")
    path = download(Remote(f"{url}/b.bin", _sha(body), "b.bin"), tmp_path, progress=False)
    assert path.read_bytes() == body


def test_checksum_mismatch_deletes_the_download(server, tmp_path):
    handler, url = server
    handler.files["c.bin"] = b"tampered"
    with pytest.raises(ValueError, match="SHA256 .* does not match the published"):
        download(Remote(f"{url}/c.bin", _sha(b"original"), "c.bin"), tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="must look like 'sha256:HEX'"):
        download(Remote(f"{url}/c.bin", "crc:1", "c.bin"), tmp_path, progress=False)


@pytest.mark.parametrize("chunked", [False, True])
def test_a_transfer_cut_short_keeps_its_bytes_and_resumes(server, tmp_path, chunked):
    """A server that closed early made the short file fail its checksum and be deleted (with a Content-Length), or
    raised http.client.IncompleteRead as a traceback (chunked). Both now keep the .part and say to run again."""
    handler, url = server
    body = bytes(range(256)) * 400
    handler.files["d.bin"] = body
    handler.cut_after, handler.chunked = 30_000, chunked
    remote = Remote(f"{url}/d.bin", _sha(body), "d.bin")
    with pytest.raises(OSError, match="the transfer stopped .*run the same command again to resume") as err:
        download(remote, tmp_path, progress=False)
    assert "\n" not in str(err.value)
    assert (tmp_path / "d.bin.part").read_bytes() == body[:30_000]
    handler.cut_after, handler.chunked = None, False
    assert download(remote, tmp_path, progress=False).read_bytes() == body
    assert handler.seen_ranges[-1] == "bytes=30000-"


def test_a_file_in_place_with_the_wrong_checksum_is_refused(tmp_path):
    body = b"the published bytes"
    (tmp_path / "x.bin").write_bytes(body)
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "x.bin").write_bytes(b"something else")
    with pytest.raises(ValueError, match="exists but its SHA256 is not the published"):
        download(Remote((tmp_path / "x.bin").as_uri(), _sha(body), "x.bin"), dest, progress=False)
    assert (dest / "x.bin").read_bytes() == b"something else"  # left for the user to move away


def test_an_upper_case_checksum_matches(tmp_path):
    body = b"hex digits in either case"
    (tmp_path / "x.bin").write_bytes(body)
    remote = Remote((tmp_path / "x.bin").as_uri(), "sha256:" + _sha(body).split(":")[1].upper(), "x.bin")
    assert download(remote, tmp_path / "dest", progress=False).read_bytes() == body


def test_http_416_without_a_partial_file_is_an_error(server, tmp_path):
    """416 (range not satisfiable) means "already complete" only when a partial file was there to resume."""
    handler, url = server
    handler.status = 416
    with pytest.raises(OSError, match="HTTP 416"):
        download(Remote(f"{url}/x.bin", _sha(b"x"), "x.bin"), tmp_path, progress=False)
    assert not (tmp_path / "x.bin").exists()


def test_a_body_one_byte_short_keeps_the_partial_file(server, tmp_path):
    """The server announces 101 bytes and sends 100: the transfer stopped early, so the 100 bytes stay in the
    .part file for the next run to resume."""
    handler, url = server
    full = bytes(range(101))
    handler.files["x.bin"], handler.cut_after = full, 100
    with pytest.raises(OSError, match="the transfer stopped at 100 of 101 bytes"):
        download(Remote(f"{url}/x.bin", _sha(full), "x.bin"), tmp_path, progress=False)
    assert (tmp_path / "x.bin.part").read_bytes() == full[:100]


def test_a_server_that_stalls_is_named_in_one_line(server, tmp_path):
    handler, url = server
    handler.files["e.bin"] = b"late"
    handler.stall_s = 1.0
    with pytest.raises(OSError, match=r"e\.bin: the transfer stopped after 0 bytes \(timed out\)"):
        download(Remote(f"{url}/e.bin", _sha(b"late"), "e.bin"), tmp_path, progress=False, timeout=0.2)


def test_data_command_fetches_gsm8k_from_a_mirror(server, tmp_path, monkeypatch, capsys):
    from targetpo.llm import data as llm_data

    handler, url = server
    files = {"train.jsonl": b'{"question": "1+1?", "answer": "#### 2"}\n',
             "test.jsonl": b'{"question": "2+2?", "answer": "#### 4"}\n'}
    handler.files.update(files)
    monkeypatch.setattr(llm_data, "GSM8K_SHA256", {k: hashlib.sha256(v).hexdigest() for k, v in files.items()})
    dest = tmp_path / "gsm8k"
    assert main(["data", "gsm8k", str(dest), "--base-url", url, "--no-progress"]) == 0
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == files
    assert "2 files verified" in capsys.readouterr().out


def test_data_command_errors_are_one_line(server, tmp_path, capsys):
    _, url = server
    assert main(["data", "mnist", str(tmp_path / "m"), "--base-url", url, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "HTTP 404" in err[0] and "train-images-idx3-ubyte.gz" in err[0]
    assert not (tmp_path / "m").exists()  # nothing written when no file could be had
    for bad in ("mirror.example/mnist", "ftp://127.0.0.1/mnist"):
        assert main(["data", "mnist", str(tmp_path / "n"), "--base-url", bad, "--no-progress"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "must start with http://, https:// or file://" in err[0]
        assert not (tmp_path / "n").exists()
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["data", "gsm8k", str(blocker / "sub"), "--base-url", url, "--no-progress"]) == 2
    assert "targetpo: error:" in capsys.readouterr().err


def test_published_checksums_are_well_formed():
    from targetpo.llm.data import gsm8k_remotes
    from targetpo.mnist.data import remotes

    for r in gsm8k_remotes() + remotes("mnist") + remotes("fashion-mnist"):
        algo, _, digest = r.checksum.partition(":")
        assert len(digest) == {"sha256": 64, "md5": 32}[algo] and r.url.endswith("/" + r.name)


def test_gsm8k_checksums_match_the_shared_copy(gsm8k_dir):
    """The checksums are those of the authors' release; the copy used by CI must match them."""
    from targetpo.llm.data import GSM8K_SHA256

    for name, digest in GSM8K_SHA256.items():
        assert hashlib.sha256((Path(gsm8k_dir) / name).read_bytes()).hexdigest() == digest

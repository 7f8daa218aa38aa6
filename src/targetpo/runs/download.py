"""Explicit downloads of public data sets: resumable, checksum-verified, with a progress bar.

Nothing in targetpo downloads unless a user asks (`targetpo data NAME DIR`, or an experiment's `--download`).
A file is written to ``NAME.part`` first; an interrupted download resumes from the bytes already there (an HTTP
``Range`` request; a server that ignores it sends the whole file again), and the file is moved into place only
after its checksum matches. A mismatch deletes the partial file and raises, so a bad download never looks like
data; a transfer that stops early (fewer bytes than announced, a broken connection, a timeout) keeps the
partial file and says to run the command again, which resumes it.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

CHUNK = 1 << 16


@dataclass(frozen=True)
class Remote:
    """One public file: where it lives and the checksum ("sha256:HEX" or "md5:HEX") it must have."""

    url: str
    checksum: str
    name: str  # file name in the destination directory


def file_checksum(path: str | os.PathLike, algorithm: str) -> str:
    h = hashlib.new(algorithm, usedforsecurity=False)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _split_checksum(checksum: str) -> tuple[str, str]:
    algorithm, _, digest = checksum.partition(":")
    if algorithm not in ("sha256", "md5") or not digest:
        raise ValueError(f"checksum {checksum!r} must look like 'sha256:HEX' or 'md5:HEX'")
    return algorithm, digest.lower()


def download(remote: Remote, dest_dir: str | os.PathLike, *, progress: bool = True, timeout: float = 60.0) -> Path:
    """Fetch `remote` into `dest_dir` (created once the server answers), resuming a partial download; returns
    the file's path.

    A file already in place with the right checksum is kept without any network access."""
    algorithm, digest = _split_checksum(remote.checksum)
    dest_dir = Path(dest_dir)
    if dest_dir.exists() and not dest_dir.is_dir():
        raise NotADirectoryError(f"{dest_dir} exists and is not a directory")
    scheme = remote.url.partition("://")[0] if "://" in remote.url else ""
    if scheme not in ("http", "https", "file"):
        raise ValueError(f"{remote.url}: the URL must start with http://, https:// or file:// (check --base-url)")
    target = dest_dir / remote.name
    if target.exists():
        if file_checksum(target, algorithm) == digest:
            return target
        raise ValueError(f"{target} exists but its {algorithm.upper()} is not the published {digest}; move it away and "
                         f"run again")
    part = target.with_name(target.name + ".part")
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(remote.url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        resp = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # the partial file is already complete
            resp = None
        else:
            raise OSError(f"{remote.url}: HTTP {exc.code} {_one_line(exc.reason)}") from None
    except urllib.error.URLError as exc:
        raise OSError(f"{remote.url}: cannot connect ({_one_line(exc.reason)})") from None
    except (http.client.HTTPException, OSError) as exc:  # a timeout, a reset, a malformed answer
        raise OSError(f"{remote.url}: no answer ({_one_line(exc) or type(exc).__name__})") from None
    # The folder is made only once a server answers, so a wrong URL leaves nothing behind.
    dest_dir.mkdir(parents=True, exist_ok=True)
    if resp is not None:
        with resp:
            resumed = have and resp.status == 206
            if not resumed:
                have = 0  # the server sent the whole file
            length = resp.headers.get("Content-Length")
            total = have + int(length) if length is not None else None
            with open(part, "ab" if resumed else "wb") as out, tqdm(
                    total=total, initial=have, unit="B", unit_scale=True, desc=remote.name,
                    disable=not progress, mininterval=0.5) as bar:
                try:
                    for block in iter(lambda: resp.read(CHUNK), b""):
                        out.write(block)
                        bar.update(len(block))
                except (http.client.HTTPException, OSError) as exc:
                    # The bytes already written stay in the .part file, so a second run resumes from them (with
                    # those of the read that broke off: a chunked answer hands them over in the exception).
                    if isinstance(exc, http.client.IncompleteRead):
                        out.write(exc.partial)
                    raise OSError(f"{remote.url}: the transfer stopped after {out.tell():,} bytes "
                                  f"({_one_line(exc) or type(exc).__name__}); run the same command again to resume"
                                  ) from None
            size = part.stat().st_size
            if total is not None and size < total:  # the server closed early: not a corrupt file, a short one
                raise OSError(f"{remote.url}: the transfer stopped at {size:,} of {total:,} bytes; run the same "
                              "command again to resume")
    got = file_checksum(part, algorithm)
    if got != digest:
        part.unlink()
        raise ValueError(f"{remote.url}: {algorithm.upper()} {got} does not match the published {digest}; the "
                         f"download was deleted")
    os.replace(part, target)
    return target


def _one_line(x) -> str:
    """A message on one line (urllib's redirect-loop error spans three)."""
    return " ".join(str(x).split())


def download_all(remotes: list[Remote], dest_dir: str | os.PathLike, *, progress: bool = True) -> list[Path]:
    return [download(r, dest_dir, progress=progress) for r in remotes]

"""Fetching the benchmark datasets from their public sources, and checking files against their SHA-256.

Every download lands in a temporary file beside its target and is renamed into place only once its digest
is the registry's (:mod:`training.registry`), so a file under a dataset's name is always the verified one.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from http.client import HTTPException
from pathlib import Path

from training.registry import DatasetSpec, dataset_spec

__all__ = ["DOWNLOAD_COMMAND", "ChecksumError", "DownloadError", "download", "file_sha256", "verify"]

_log = logging.getLogger(__name__)

DOWNLOAD_COMMAND = "python -m training download --data-dir {data_dir}"


class ChecksumError(ValueError):
    """A file's SHA-256 is not the expected one.

    Attributes
    ----------
    path : Path
        The file checked.
    expected, actual : str
        Hex digests.
    """

    def __init__(self, path: str | os.PathLike[str], expected: str, actual: str, *, detail: str = "") -> None:
        self.path = Path(path)
        self.expected = expected
        self.actual = actual
        super().__init__(f"{self.path}: SHA-256 is {actual}, expected {expected}{detail}")


class DownloadError(RuntimeError):
    """A dataset file could not be fetched (no source, or a network or HTTP failure)."""


_CHUNK_BYTES = 1 << 20
# A download slower than this on average is given up: the socket timeout alone lets a server that drips a
# byte now and then hold the command forever. The largest file (3.5 MB) gets 3.6 minutes beyond the timeout.
_SLOWEST_BYTES_PER_SECOND = 16 << 10


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def verify(path: str | os.PathLike[str], sha256: str) -> None:
    """Check that the file at ``path`` has the SHA-256 ``sha256`` (hex, any case).

    Raises
    ------
    ChecksumError
        If it has another; the message names the file and both digests.
    FileNotFoundError
        If there is no file.
    """
    actual = file_sha256(path)
    if actual != sha256.lower():
        raise ChecksumError(path, sha256.lower(), actual)


def _source_url(spec: DatasetSpec, base_urls: str | Mapping[str, str] | None) -> str | None:
    if base_urls is None:
        return spec.url
    base = base_urls if isinstance(base_urls, str) else base_urls.get(spec.name)
    if base is None:
        return spec.url
    return base.rstrip("/") + "/" + spec.file_name


def _fetch_verified(url: str, target: Path, sha256: str, size: int, timeout: float) -> None:
    """Stream ``url`` into a temporary file beside ``target``, check it, then rename it into place.

    The rename is atomic, so ``target`` is either absent, the old file, or the complete verified download;
    the temporary file never outlives this call. At most ``size`` + 1 bytes are read, and for at most
    ``timeout`` seconds plus the time ``size`` bytes take at :data:`_SLOWEST_BYTES_PER_SECOND`.
    """
    try:
        handle, temporary_name = tempfile.mkstemp(
            dir=target.parent, prefix=f".{target.name}.", suffix=".part"
        )
    except OSError as error:
        raise DownloadError(f"{target}: cannot be written ({error.strerror or error})") from error
    temporary = Path(temporary_name)
    deadline = time.monotonic() + timeout + size / _SLOWEST_BYTES_PER_SECOND
    try:
        digest = hashlib.sha256()
        received = 0
        try:
            with os.fdopen(handle, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as response:
                announced = response.headers.get("Content-Length")
                if announced is not None and announced.isdigit() and int(announced) != size:
                    raise DownloadError(
                        f"{url} announces {announced} bytes for {target}, which has {size}: not fetched"
                    )
                # read1: what has arrived, so that the deadline is looked at while a server drips.
                read = getattr(response, "read1", response.read)
                while chunk := read(min(_CHUNK_BYTES, size + 1 - received)):
                    digest.update(chunk)
                    out.write(chunk)
                    received += len(chunk)
                    if received > size:
                        raise DownloadError(
                            f"{url} sends more than the {size} bytes of {target}: stopped, discarded"
                        )
                    if time.monotonic() > deadline:
                        raise DownloadError(
                            f"download of {target} from {url} too slow: {received} of {size} bytes in "
                            f"{timeout + size / _SLOWEST_BYTES_PER_SECOND:.0f} s, discarded"
                        )
        except (urllib.error.URLError, HTTPException, OSError) as error:
            raise DownloadError(f"could not fetch {target} from {url}: {error}") from error
        # http.client may end a body cut short without an error; the announced length tells it apart from a
        # corrupt one, which only the digest can.
        if received != size:
            raise DownloadError(
                f"incomplete download of {target} from {url}: {received} of {size} bytes, discarded"
            )
        actual = digest.hexdigest()
        if actual != sha256.lower():
            raise ChecksumError(
                target,
                sha256.lower(),
                actual,
                detail=f" (downloaded from {url}: corrupt or incomplete, discarded)",
            )
        # mkstemp creates the file private to its owner; data files are world-readable like any download.
        try:
            temporary.chmod(0o644)
            os.replace(temporary, target)
        except OSError as error:
            raise DownloadError(f"{target}: cannot be written ({error.strerror or error})") from error
    finally:
        temporary.unlink(missing_ok=True)


def download(
    names: Iterable[str | DatasetSpec],
    data_dir: str | os.PathLike[str],
    *,
    base_urls: str | Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> list[Path]:
    """Fetch dataset files into ``data_dir`` from their public sources, verifying each SHA-256.

    A file already present with the right digest is not fetched again; one with a wrong digest is replaced.
    Each download goes to a temporary file in ``data_dir`` and is renamed into place only once verified, so
    an interrupted or corrupt download never leaves a file under the dataset's name. Failures are raised at
    once, never retried.

    Parameters
    ----------
    names : iterable of str or DatasetSpec
        Datasets to fetch (keys of :data:`DATASETS`, or specs); all are resolved before any is fetched.
    data_dir : path
        Destination directory, created if needed.
    base_urls : str or mapping of str to str, optional
        Where to fetch from instead of the specs' URLs: one base URL for every dataset, or a base URL per
        dataset name (others keep their spec's URL). The file name is appended to the base.
    timeout : float
        Seconds to wait on the network before giving up on a file; a whole file may take as long again as
        its size at 16 KiB/s.

    Returns
    -------
    list of Path
        The verified files, in the order of ``names``.

    Raises
    ------
    ChecksumError
        A download does not have the expected digest (the message names the file); nothing is kept.
    DownloadError
        A dataset has no known source, digest or size, the fetch failed, sent more bytes than the file has
        or sent them too slowly, or the data directory or the file cannot
        be read or written (a file where the directory goes, a directory where the file does).
    """
    specs = [dataset_spec(name) for name in names]
    data_dir = Path(data_dir)
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise DownloadError(f"{data_dir}: not a directory; name a directory for the data") from None
    except OSError as error:
        raise DownloadError(f"{data_dir}: cannot be made ({error.strerror or error})") from error
    fetched = []
    for spec in specs:
        if spec.file_name is None:
            raise DownloadError(f"{spec.name} is generated, there is nothing to download")
        target = data_dir / spec.file_name
        url = _source_url(spec, base_urls)
        if url is None:
            raise DownloadError(
                f"{spec.name} ({spec.file_name}) has no public source configured: put the file in {data_dir}"
            )
        if spec.sha256 is None:
            # Without a digest a truncated or substituted file could not be told from the real one.
            raise DownloadError(
                f"{spec.name} ({spec.file_name}) has no known SHA-256: refusing an unverified download"
            )
        if spec.size_bytes is None:  # nothing to stop an endless body at
            raise DownloadError(
                f"{spec.name} ({spec.file_name}) has no known size: refusing an unbounded download"
            )
        if target.is_dir():  # found out once fetched, the file could not take its name
            raise DownloadError(f"{target}: a directory, not the data file; move it away and fetch again")
        if target.is_file():
            try:
                verify(target, spec.sha256)
            except OSError as error:
                raise DownloadError(f"{target}: cannot be read ({error.strerror or error})") from error
            except ChecksumError:
                _log.warning("%s has the wrong SHA-256; fetching it again", target)
            else:
                _log.info("%s is present and verified", target)
                fetched.append(target)
                continue
        _log.info("fetching %s from %s", target, url)
        _fetch_verified(url, target, spec.sha256, spec.size_bytes, timeout)
        fetched.append(target)
    return fetched

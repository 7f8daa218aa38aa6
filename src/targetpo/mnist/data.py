r"""MNIST-format data (MNIST, Fashion-MNIST) from a directory of standard IDX files (docs/experiments.md §E3).

The loader reads the four standard files, each optionally gzipped::

    train-images-idx3-ubyte[.gz]  train-labels-idx1-ubyte[.gz]  t10k-images-idx3-ubyte[.gz]  t10k-labels-idx1-ubyte[.gz]

and validates everything it reads (magic number, dims, byte count, label range, images/labels count) so a
broken file fails with an error naming the file, never with a silently wrong data set.

- Train and test files present: the paper's protocol, 60,000 train / 10,000 test.
- Only the test files present (e.g. the public MNIST test split alone): a fixed, seeded split of those 10,000
  real digits into 8,000 train / 2,000 test (`SPLIT_SEED`). Every report says which one was used.

Images become float32 in [0, 1] (/255, flattened to 784, no mean/std normalisation) and labels int64, as in
the authors' code. Nothing is downloaded unless `download=True` is asked for explicitly; the download checks
the official MD5 of every file before it is used.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from targetpo.runs.data import MissingDataError
from targetpo.runs.download import Remote, download

IMAGES_MAGIC = 2051  # 0x00000803: unsigned byte, 3 dims
LABELS_MAGIC = 2049  # 0x00000801: unsigned byte, 1 dim
SIDE = 28
NUM_CLASSES = 10
SPLIT_SEED = 0
SPLIT_TRAIN = 8000  # of the 10,000 test digits when no training split is available

FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
DATASETS = ("mnist", "fashion-mnist")
ENV_VARS = {"mnist": "TARGETPO_MNIST_DIR", "fashion-mnist": "TARGETPO_FASHION_MNIST_DIR"}
# Where a system package puts the data when nothing else is given (Debian: `apt install dataset-fashion-mnist`).
SYSTEM_DIRS = {"fashion-mnist": Path("/usr/share/datasets/fashion-mnist")}
# Official download locations and MD5s of the published .gz files (the ones torchvision verifies against).
URLS = {
    "mnist": "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "fashion-mnist": "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
}
MD5 = {
    "mnist": {
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    },
    "fashion-mnist": {
        "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
    },
}


@dataclass(frozen=True)
class MnistData:
    train_x: Tensor  # [N, 784] float32 in [0, 1]
    train_y: Tensor  # [N] int64
    test_x: Tensor
    test_y: Tensor
    dataset: str
    protocol: str  # "official" (train/test files) or "test-split" (seeded split of the test file)
    directory: Path
    # Which of the 784 pixels the columns of train_x / test_x are (None: all of them, in order); see `inked`.
    pixels: Tensor | None = None

    def to(self, device: torch.device | str) -> MnistData:
        """The same data with its four arrays on `device` (itself where they are there already)."""
        return dataclasses.replace(self, train_x=self.train_x.to(device), train_y=self.train_y.to(device),
                                   test_x=self.test_x.to(device), test_y=self.test_y.to(device))

    def inked(self) -> MnistData:
        """The same data on only the pixels with ink in at least one of its images, train or test (`pixels`
        names them, ascending): 668 of 784 for the seeded split of the MNIST test file. A pixel blank in every
        image multiplies its first-layer weights by 0 in every forward pass a run makes, on training batches and
        test digits alike, and gives them a zero gradient, so the network computes the same function of the same
        trained weights without them and its first layer does 15 % fewer multiply-adds here (docs/experiments.md
        §E3). Only the rounding of the first layer's sums changes. Data without any ink keeps every pixel."""
        if self.pixels is not None:
            return self
        inked = (self.train_x != 0).any(0) | (self.test_x != 0).any(0)
        keep = (inked if bool(inked.any()) else torch.ones_like(inked)).nonzero().squeeze(1)
        return dataclasses.replace(self, train_x=self.train_x.index_select(1, keep).contiguous(),
                                   test_x=self.test_x.index_select(1, keep).contiguous(), pixels=keep.cpu())

    @property
    def fingerprint(self) -> str:
        """The first 16 hex digits of a SHA-256 over the arrays a run reads: a resume on other data (another copy,
        relabelled, another split) is refused by it (docs/architecture.md, run folder format)."""
        h = hashlib.sha256()
        for t in (self.train_x, self.train_y, self.test_x, self.test_y):
            h.update(str((tuple(t.shape), t.dtype)).encode())
            h.update(t.contiguous().cpu().numpy().tobytes())
        return h.hexdigest()[:16]

    @property
    def description(self) -> str:
        name = {"mnist": "MNIST", "fashion-mnist": "Fashion-MNIST"}[self.dataset]
        other = "" if self.dataset == "mnist" else "; not the paper's data set, its numbers are context only"
        if self.protocol == "official":
            return (f"{name} official split: {len(self.train_y):,} train / {len(self.test_y):,} test "
                    f"(the paper's protocol{other}) from {self.directory}")
        return (f"{name} TEST SPLIT ONLY: a fixed seeded split (seed {SPLIT_SEED}) of its 10,000 real test images "
                f"into {len(self.train_y):,} train / {len(self.test_y):,} test, from {self.directory} "
                f"(not the paper's 60k/10k protocol: numbers are not directly comparable{other})")


# ----------------------------------------------------------------------------- IDX parsing

def _read_bytes(path: Path) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as fh:
                return fh.read()
        return path.read_bytes()
    except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as exc:
        raise ValueError(f"{path}: cannot read the file ({type(exc).__name__}: {exc}); "
                         "it is truncated or not a gzip/IDX file") from None


def parse_idx(data: bytes, expected_magic: int, name: str = "IDX data") -> np.ndarray:
    """Parse an unsigned-byte IDX payload: 4-byte big-endian magic (0x0000 08 ndim), ndim big-endian uint32
    dims, then prod(dims) bytes. Raises ValueError naming `name` for a wrong magic or a byte-count mismatch."""
    if len(data) < 4:
        raise ValueError(f"{name}: {len(data)} bytes is too short for an IDX header")
    magic = int.from_bytes(data[:4], "big")
    if magic != expected_magic:
        kind = {IMAGES_MAGIC: "images (idx3)", LABELS_MAGIC: "labels (idx1)"}.get(expected_magic, "")
        raise ValueError(f"{name}: magic number {magic} (0x{magic:08x}), expected {expected_magic} "
                         f"(0x{expected_magic:08x}) for {kind} unsigned-byte data")
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(f"{name}: truncated header ({len(data)} bytes, need {header} for {ndim} dims)")
    dims = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    expected = int(np.prod(dims))
    if len(data) - header != expected:
        what = "truncated" if len(data) - header < expected else "has trailing bytes"
        raise ValueError(f"{name}: {what}: header says shape {dims} = {expected:,} bytes of data, "
                         f"file holds {len(data) - header:,}")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


def read_images(path: Path) -> Tensor:
    arr = parse_idx(_read_bytes(path), IMAGES_MAGIC, str(path))
    if arr.shape[1:] != (SIDE, SIDE):
        raise ValueError(f"{path}: images have shape {arr.shape[1:]}, expected ({SIDE}, {SIDE})")
    return torch.from_numpy(arr.reshape(len(arr), SIDE * SIDE).astype(np.float32) / 255.0)


def read_labels(path: Path) -> Tensor:
    arr = parse_idx(_read_bytes(path), LABELS_MAGIC, str(path))
    if arr.size and arr.max() >= NUM_CLASSES:
        raise ValueError(f"{path}: label {int(arr.max())} outside 0..{NUM_CLASSES - 1}")
    return torch.from_numpy(arr.astype(np.int64))


def _find(directory: Path, stem: str) -> Path | None:
    for name in (stem + ".gz", stem):
        if (directory / name).is_file():
            return directory / name
    return None


def _read_pair(directory: Path, split: str) -> tuple[Tensor, Tensor] | None:
    img, lab = _find(directory, FILES[f"{split}_images"]), _find(directory, FILES[f"{split}_labels"])
    if img is None and lab is None:
        return None
    if img is None or lab is None:
        have = img if lab is None else lab
        miss = FILES[f"{split}_labels"] if lab is None else FILES[f"{split}_images"]
        raise ValueError(f"{directory}: found {have.name} but not {miss}[.gz]; the {split} split needs both files")
    x, y = read_images(img), read_labels(lab)
    if len(x) != len(y):
        raise ValueError(f"{directory}: {img.name} holds {len(x):,} images but {lab.name} holds {len(y):,} labels")
    return x, y


# ----------------------------------------------------------------------------- locating and loading

def resolve_dir(data_dir: str | os.PathLike | None, dataset: str) -> Path | None:
    """The directory to read: `data_dir`, else the dataset's environment variable, else its system location
    (Fashion-MNIST's Debian package). None if nothing is configured."""
    if dataset not in DATASETS:
        raise ValueError(f"dataset must be one of {DATASETS}, got {dataset!r}")
    if data_dir:
        return Path(data_dir).expanduser()
    env = os.environ.get(ENV_VARS[dataset])
    if env:
        return Path(env).expanduser()
    return SYSTEM_DIRS.get(dataset)


def how_to_provide(dataset: str) -> str:
    flag = "" if dataset == "mnist" else f" --dataset {dataset}"
    extra = " or `apt install dataset-fashion-mnist`" if dataset == "fashion-mnist" else ""
    return (f"pass `--data-dir DIR{flag}` (a directory with the standard IDX files), "
            f"set {ENV_VARS[dataset]}=DIR, or add `--download` to fetch the official files{extra}")


def check_available(data_dir: str | os.PathLike | None, dataset: str) -> Path:
    """The data directory if it holds at least the test files, and not another dataset's official ones;
    MissingDataError (saying how to provide the data) otherwise. Cheap: file names and one 4.5 KB checksum."""
    directory = resolve_dir(data_dir, dataset)
    if directory is None:
        raise MissingDataError(f"no {dataset} data directory given: {how_to_provide(dataset)}")
    if not directory.is_dir():
        state = "is a file, not a directory" if directory.exists() else "does not exist"
        raise MissingDataError(f"{dataset} data directory {directory} {state}: {how_to_provide(dataset)}")
    if _find(directory, FILES["test_images"]) is None or _find(directory, FILES["test_labels"]) is None:
        present = sorted(p.name for p in directory.iterdir())[:8]
        raise MissingDataError(f"{directory} lacks {FILES['test_images']}[.gz] and/or {FILES['test_labels']}[.gz] "
                               f"(found: {present or 'nothing'}): {how_to_provide(dataset)}")
    other = official_dataset_of(_find(directory, FILES["test_labels"]))
    if other is not None and other != dataset:  # e.g. --dataset fashion-mnist on a folder of MNIST digits
        raise MissingDataError(f"{directory} holds {other}, not {dataset} (its {FILES['test_labels']} are "
                               f"{other}'s official test labels): pass --dataset {other}, or "
                               f"{how_to_provide(dataset)}")
    return directory


# MD5 of the uncompressed official test labels (IDX header + 10,000 labels): it names the data set whatever the
# file's compression (a re-gzipped copy has another .gz MD5).
RAW_TEST_LABELS_MD5 = {"mnist": "27ae3e4e09519cfbb04c329615203637"}


def official_dataset_of(labels: Path) -> str | None:
    """The dataset whose official test labels `labels` holds, by MD5 of the file (official .gz) or of its content;
    None for any other file, such as a user's own data set (or one the loader will refuse as broken)."""
    data = labels.read_bytes()  # 4.5 KB gzipped, 10 KB raw
    packed = hashlib.md5(data).hexdigest()
    found = next((d for d, sums in MD5.items() if sums[FILES["test_labels"] + ".gz"] == packed), None)
    if found is not None:
        return found
    try:
        raw = gzip.decompress(data) if labels.suffix == ".gz" else data
    except (OSError, EOFError, zlib.error):
        return None
    digest = hashlib.md5(raw).hexdigest()
    return next((d for d, known in RAW_TEST_LABELS_MD5.items() if known == digest), None)


def load(data_dir: str | os.PathLike | None = None, dataset: str = "mnist", *, download: bool = False) -> MnistData:
    """Load train/test tensors (see the module docstring for the two protocols)."""
    if download:
        target = resolve_dir(data_dir, dataset)
        if target is None or (target == SYSTEM_DIRS.get(dataset) and _find(target, FILES["test_images"]) is None):
            target = default_download_dir(dataset)
        data_dir = fetch(dataset, target)
    directory = check_available(data_dir, dataset)
    test = _read_pair(directory, "test")
    train = _read_pair(directory, "train")
    if test is None:  # unreachable after check_available, kept for direct callers
        raise MissingDataError(f"{directory}: no test split")
    if train is not None:
        return MnistData(*train, *test, dataset=dataset, protocol="official", directory=directory)
    x, y = test
    if len(y) < SPLIT_TRAIN + 1:
        raise ValueError(f"{directory}: only a test split with {len(y):,} examples; a train/test split of the test "
                         f"file needs more than {SPLIT_TRAIN:,}")
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(SPLIT_SEED))
    tr, te = perm[:SPLIT_TRAIN], perm[SPLIT_TRAIN:]
    return MnistData(x[tr], y[tr], x[te], y[te], dataset=dataset, protocol="test-split", directory=directory)


# ----------------------------------------------------------------------------- explicit download

def default_download_dir(dataset: str) -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "targetpo" / dataset


def remotes(dataset: str, base_url: str | None = None, checksums: dict[str, str] | None = None) -> list[Remote]:
    """The dataset's four official .gz files with their published MD5s."""
    if dataset not in DATASETS:
        raise ValueError(f"dataset must be one of {DATASETS}, got {dataset!r}")
    base = (base_url or URLS[dataset]).rstrip("/")
    return [Remote(f"{base}/{name}", f"md5:{md5}", name) for name, md5 in (checksums or MD5[dataset]).items()]


def fetch(dataset: str, dest: str | os.PathLike, *, base_url: str | None = None,
          checksums: dict[str, str] | None = None, quiet: bool = False) -> Path:
    """Download the dataset's four official .gz files into `dest` (resumable, MD5-checked before a file is moved
    into place: a failed check raises ValueError and leaves nothing behind). Files already present are kept."""
    dest = Path(dest)
    for remote in remotes(dataset, base_url, checksums):
        if (dest / remote.name.removesuffix(".gz")).exists():
            continue  # an unpacked copy is already there
        download(remote, dest, progress=not quiet)
    return dest

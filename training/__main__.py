"""``python -m training <command>``: the training package's command line.

python -m training download [--data-dir DIR] [--dataset NAME ...] [--mirror URL]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from training import data


def _download(args: argparse.Namespace) -> int:
    names = args.dataset or [name for name, spec in data.DATASETS.items() if spec.downloadable]
    try:
        for path in data.download(names, args.data_dir, base_urls=args.mirror):
            print(f"ok  {path}")
    except (data.ChecksumError, data.DownloadError, KeyError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    fetch = commands.add_parser(
        "download", help="fetch the benchmark datasets from their public sources and verify their SHA-256"
    )
    fetch.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get("DBF_DATA_DIR", "data")),
        help="destination (default: $DBF_DATA_DIR or ./data)",
    )
    fetch.add_argument(
        "--dataset",
        action="append",
        choices=sorted(data.DATASETS),
        help="one dataset (repeatable; default all)",
    )
    fetch.add_argument("--mirror", help="base URL to fetch every file from instead of its public source")
    fetch.set_defaults(run=_download)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())

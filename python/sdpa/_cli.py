"""The `sdpa` console script of the wheel: execs the C++ CLI shipped inside the package
(sdpa/bin/sdpa, built by pyproject.toml's build with apps/sdpa), so `sdpa run ...`,
`sdpa check`, `sdpa demo` behave as the CLI built from the repository. Nothing of the
package is needed at run time but the path of the binary."""

from __future__ import annotations

import os
import pathlib
import sys


def binary() -> pathlib.Path:
    return pathlib.Path(__file__).resolve().parent / "bin" / "sdpa"


def main() -> None:
    path = binary()
    if not os.access(path, os.X_OK):
        sys.exit(f"sdpa: the command-line tool is not in this installation ({path} is missing); the package was "
                 "built without apps/sdpa (SDPA_BUILD_APPS=OFF)")
    # exec: the CLI's exit status, signals and standard streams are the caller's own.
    os.execv(path, ["sdpa", *sys.argv[1:]])


if __name__ == "__main__":
    main()

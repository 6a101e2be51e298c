"""Compile the scheduler core's hot modules with mypyc, in place (`make native`).

Run: `.venv/bin/python scripts/compile_core.py [--clean]`. The modules are those of
`scheduler_core.native.MODULES`; their extensions land beside their ``.py`` files and
`scheduler_core/native.json` records the source each was built from, so an edited
module runs from source until the next build (native.py). ``--clean`` removes the
build: everything then runs from source.

The build runs in a scratch folder: setuptools reads the working folder's
pyproject.toml, and the venv's setuptools predates this project's license field.
A failed build (no C compiler) leaves pure Python, which decides the same, slower;
the script then exits 1 with the compiler's last lines.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["BUDGETHUB_PURE_PYTHON"] = "1"  # read the source's hashes, not a build's

from scheduler_core import native  # noqa: E402

SETUP = """
import sys
from setuptools import setup
from mypyc.build import mypycify

paths = sys.argv[1:]
sys.argv[1:] = ["build_ext", "--build-lib", "lib", "--build-temp", "tmp", "--parallel", "2"]
setup(
    name="budgethub-native",
    ext_modules=mypycify(paths, opt_level="3", group_name={group!r}),
)
"""


def clean() -> None:
    for path in native.built():
        path.unlink()
    native.MANIFEST.unlink(missing_ok=True)


def build() -> int:
    hashes = native.sources()
    paths = [str(native.source_of(m)) for m in native.MODULES]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="budgethub-native-") as scratch:
        work = Path(scratch)
        (work / "setup_native.py").write_text(SETUP.format(group=native.GROUP))
        done = subprocess.run(
            [sys.executable, "setup_native.py", *paths],
            cwd=work,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
            print(f"compile_core: mypyc failed; the core runs from source\n{tail}", file=sys.stderr)
            return 1
        clean()
        lib = work / "lib" / "scheduler_core"
        for built in lib.rglob("*"):
            if built.is_file():
                target = native.ROOT / built.relative_to(lib)
                shutil.copy2(built, target)
    if native.sources() != hashes:
        clean()
        print("compile_core: the source changed during the build; run it again", file=sys.stderr)
        return 1
    native.MANIFEST.write_text(json.dumps({"sources": hashes}, indent=1, sort_keys=True) + "\n")
    print(
        f"compile_core: {len(paths)} modules compiled in {time.monotonic() - started:.0f} s "
        f"({len(native.built())} extensions in scheduler_core)"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clean", action="store_true", help="remove the build")
    args = parser.parse_args(argv)
    if args.clean:
        clean()
        return 0
    return build()


if __name__ == "__main__":
    sys.exit(main())

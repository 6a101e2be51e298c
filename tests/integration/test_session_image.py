"""The session image as built (images/build), in the real engine: installed packages
land in the home volume and survive a new container; kernels checkpoint with the
image's own config and come back in a new container from the snapshot; every session
image's kernel imports the scientific stack it promises.

Nothing is built here (the `engine` fixture fails when the images are missing) and
no container has a network: the wheels are made by the test and copied in.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import tarfile
import textwrap
import zipfile
from collections.abc import Iterator

import docker
import pytest

IMAGE = "budgethub/base:latest"
TIMEOUT = 180  # one container's script, bounded
SESSION_IMAGES = ("budgethub/base:latest", "budgethub/gpu:latest", "budgethub/dataprep:latest")
"""Every session image: each carries the scientific stack (issue 50)."""


def make_wheel(name: str, value: str) -> tuple[str, bytes]:
    """A pure-Python wheel of one module ``name`` with ``VALUE = value``."""
    dist = f"{name}-0.1.dist-info"
    files = {
        f"{name}/__init__.py": f"VALUE = {value!r}\n".encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n".encode(),
        f"{dist}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: budgethub-test\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n"
        ),
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return f"{name}-0.1-py3-none-any.whl", out.getvalue()


def tar_of(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uid, info.gid = len(data), 0o644, 1000, 100
            tf.addfile(info, io.BytesIO(data))
    return out.getvalue()


def run_in(
    engine: docker.DockerClient,
    volume: str | None,
    script: str,
    files: dict[str, bytes] | None = None,
    env: dict[str, str] | None = None,
    image: str = IMAGE,
) -> str:
    """Run ``script`` (sh) in a new container of ``image`` with the home volume (None:
    the image's own home); its output."""
    container = engine.containers.create(
        image,
        ["sh", "-c", script],
        network_mode="none",
        volumes={volume: {"bind": "/home/jovyan", "mode": "rw"}} if volume else {},
        environment=env or {},
        labels={"org.budgethub.test": "session-image"},
    )
    try:
        if files:
            container.put_archive("/tmp", tar_of(files))
        container.start()
        result = container.wait(timeout=TIMEOUT)
        output = container.logs().decode(errors="replace")
        assert result["StatusCode"] == 0, f"exit {result['StatusCode']}:\n{output[-4000:]}"
        return output
    finally:
        container.remove(force=True)


@pytest.fixture
def home_volume(engine: docker.DockerClient) -> Iterator[str]:
    name = f"bh-test-session-home-{os.getpid()}"
    engine.volumes.create(name)
    try:
        yield name
    finally:
        engine.volumes.get(name).remove(force=True)


def test_pip_installs_land_in_the_home_and_survive_a_new_container(
    engine: docker.DockerClient, home_volume: str
) -> None:
    shell_whl, shell_data = make_wheel("bhwheel_shell", "from pip")
    magic_whl, magic_data = make_wheel("bhwheel_magic", "from %pip")
    out = run_in(
        engine,
        home_volume,
        textwrap.dedent(
            f"""\
            set -e
            stat -c 'venv %U %a' /opt/venv/lib/python3.11/site-packages
            test -w /opt/venv/lib/python3.11/site-packages || echo venv-not-writable
            # The very first install in a fresh home, with %pip, imports at once.
            ipython -c "%pip install --no-index /tmp/{magic_whl}
            import bhwheel_magic; print('magic', bhwheel_magic.VALUE, bhwheel_magic.__file__)"
            pip install --no-index /tmp/{shell_whl} 2>&1
            """
        ),
        {shell_whl: shell_data, magic_whl: magic_data},
    )
    assert "venv root 755" in out and "venv-not-writable" in out
    assert "Defaulting to user installation because normal site-packages is not writeable" in out
    assert "magic from %pip /home/jovyan/.local/lib/python3.11/site-packages/bhwheel_magic" in out

    # A new container with the same home: both import, from the home.
    out = run_in(
        engine,
        home_volume,
        'python -c "import bhwheel_shell as s, bhwheel_magic as m; '
        "print(s.VALUE, '|', m.VALUE, '|', s.__file__)\"",
    )
    assert out.strip() == (
        "from pip | from %pip | /home/jovyan/.local/lib/python3.11/site-packages/"
        "bhwheel_shell/__init__.py"
    )


CHECKPOINT = """\
import json, shutil
from pathlib import Path
from budgethub_session.localserver import LocalServer

home = Path.home()
with LocalServer(home, home=home, install_config=False) as s:
    k = s.open_notebook("work/n.ipynb")
    k.ok("import bhwheel_shell\\nv = {'x': [1, 2]}\\ninc = lambda q: q + len(v)\\n"
         "import socket\\nsock = socket.socket()")
    status, report = s.agent("POST", "checkpoint", {"within": 30})
    print("REPORT", json.dumps(report["kernels"]))
    shutil.copytree(s.state_dir, home / "snap")
"""

RESTORE = """\
import json
from pathlib import Path
from budgethub_session.localserver import LocalServer

home = Path.home()
with LocalServer(home, home=home, install_config=False, restore_dir=home / "snap") as s:
    k = s.open_notebook("work/n.ipynb")
    print("NOTE", k.ok("pass").stdout.strip())
    print("VALUES", json.dumps(k.value("[v, inc(1), bhwheel_shell.VALUE, 'sock' in globals()]")))
"""


def test_kernels_checkpoint_and_restore_with_the_images_own_config(
    engine: docker.DockerClient, home_volume: str
) -> None:
    whl, data = make_wheel("bhwheel_shell", "from pip")
    run_in(engine, home_volume, f"pip install -q --no-index /tmp/{whl}", {whl: data})
    out = run_in(
        engine,
        home_volume,
        "python /tmp/checkpoint.py",
        {"checkpoint.py": CHECKPOINT.encode()},
        {"BUDGETHUB_AGENT_SECRET": "x"},
    )
    line = next(x for x in out.splitlines() if x.startswith("REPORT "))
    (kernel,) = json.loads(line[len("REPORT ") :])
    assert kernel["state"] == "saved", kernel
    assert {"v", "inc", "bhwheel_shell"} <= set(kernel["saved"])
    assert kernel["unsaved"]["sock"].startswith("socket.socket: ")

    out = run_in(
        engine,
        home_volume,
        "python /tmp/restore.py",
        {"restore.py": RESTORE.encode()},
        {"BUDGETHUB_AGENT_SECRET": "x"},
    )
    note = next(x for x in out.splitlines() if x.startswith("NOTE "))
    assert "budgethub: restored 4 variables (bhwheel_shell, inc, socket, v)" in note
    assert "not restored: sock (socket.socket: " in note
    values = next(x for x in out.splitlines() if x.startswith("VALUES "))
    assert json.loads(values[len("VALUES ") :]) == [
        {"x": [1, 2]},
        2,
        "from pip",
        False,
    ]


SCIENCE = """\
import json
from pathlib import Path
from budgethub_session.localserver import LocalServer

home = Path.home()
with LocalServer(home, home=home, install_config=False) as s:
    k = s.open_notebook("work/science.ipynb")
    k.ok("import numpy, scipy, pandas, matplotlib, ipywidgets, pynvml")
    print("VERSIONS", json.dumps(k.value(
        "{m.__name__: getattr(m, '__version__', 'n/a') for m in "
        "(numpy, scipy, pandas, matplotlib, ipywidgets)}")))
    # Each does its work, not only imports: a solve, an optimum, a frame, a PNG, a widget.
    print("WORKS", json.dumps(k.value(
        "[float(numpy.linalg.solve(numpy.eye(2) * 2, numpy.ones(2))[0]), "
        "round(float(__import__('scipy.optimize').optimize.minimize_scalar("
        "lambda x: (x - 3) ** 2).x), 3), "
        "int(pandas.DataFrame({'a': [1, 2, 3]})['a'].sum()), "
        "__import__('matplotlib.pyplot').pyplot.plot([1, 2])[0].__class__.__name__, "
        "ipywidgets.IntSlider(value=7).value, "
        "callable(pynvml.nvmlInit)]")))
"""


@pytest.mark.parametrize("image", SESSION_IMAGES)
def test_every_session_images_kernel_imports_the_scientific_stack(
    engine: docker.DockerClient, image: str
) -> None:
    """In a running session of each image (its own Jupyter server and kernel, with the
    image's config), the kernel imports numpy, scipy, pandas, matplotlib, ipywidgets and
    pynvml, and each does its work. No network: nothing is installed at run time."""
    out = run_in(
        engine,
        None,
        "python /tmp/science.py",
        {"science.py": SCIENCE.encode()},
        {"BUDGETHUB_AGENT_SECRET": "x", "MPLBACKEND": "Agg"},
        image=image,
    )
    versions = json.loads(next(x for x in out.splitlines() if x.startswith("VERSIONS "))[9:])
    assert set(versions) == {"numpy", "scipy", "pandas", "matplotlib", "ipywidgets"}, out
    assert all(v != "n/a" for v in versions.values()), versions
    works = json.loads(next(x for x in out.splitlines() if x.startswith("WORKS "))[6:])
    assert works == [0.5, 3.0, 6, "Line2D", 7, True], out

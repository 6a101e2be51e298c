"""A real Jupyter Server with the budgethub extensions, started here on 127.0.0.1
without a Hub, driven over REST and websockets (:class:`LocalServer`, its
:class:`LocalKernel`). The kernels of a session behind a Hub's proxy are the test
harness's (``harness/kernels.py``).

For the tests and the benchmarks (bench/restore_fidelity.py, bench/snapshot*.py):
it starts ``python -m jupyter_server`` with the same two configuration
files the session image installs (the kernel config loading the snapshot
extension, the server config enabling the agent), in private config, data and
runtime directories, so nothing of the machine's own Jupyter setup leaks in.
Standard library and websocket-client only (a dependency of jupyter_server).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import websocket

from budgethub_session.agent import HEADER

__all__ = ["CellResult", "LocalKernel", "LocalServer"]

ETC = Path(__file__).resolve().parent / "etc"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def execute_request(
    msg_id: str, session: str, code: str, username: str, **content: Any
) -> dict[str, Any]:
    """A Jupyter ``execute_request`` message for a kernel's websocket (protocol 5.3)."""
    return {
        "header": {
            "msg_id": msg_id,
            "msg_type": "execute_request",
            "username": username,
            "session": session,
            "date": "",
            "version": "5.3",
        },
        "parent_header": {},
        "metadata": {},
        "content": {
            "code": code,
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
            **content,
        },
        "channel": "shell",
        "buffers": [],
    }


@dataclass
class CellResult:
    status: str
    stdout: str = ""
    stderr: str = ""
    result: str | None = None  # text/plain of the execute_result
    error: str | None = None
    seconds: float = 0.0  # execute_request sent -> execute_reply received
    messages: list[dict[str, Any]] = field(default_factory=list)


class LocalKernel:
    """A notebook's kernel, through the server's websocket (like JupyterLab)."""

    def __init__(self, server: LocalServer, kernel_id: str, path: str) -> None:
        self.server = server
        self.kernel_id = kernel_id
        self.path = path
        self.session = uuid.uuid4().hex
        url = (
            f"ws://127.0.0.1:{server.port}/api/kernels/{kernel_id}/channels"
            f"?session_id={self.session}"
        )
        self.ws = websocket.create_connection(
            url, header=[f"Authorization: token {server.token}"], timeout=60
        )

    def send(self, code: str, **content: Any) -> str:
        msg_id = uuid.uuid4().hex
        self.ws.send(json.dumps(execute_request(msg_id, self.session, code, "test", **content)))
        return msg_id

    def wait(self, msg_id: str, timeout: float = 120, t0: float | None = None) -> CellResult:
        t0 = time.perf_counter() if t0 is None else t0
        deadline = time.monotonic() + timeout
        out = CellResult(status="?")
        replied = idle = False
        while not (replied and idle):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.path}: no reply to {msg_id} within {timeout} s")
            self.ws.settimeout(left)
            msg = json.loads(self.ws.recv())
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            out.messages.append(msg)
            kind, content = msg["msg_type"], msg["content"]
            if kind == "execute_reply":
                out.seconds = time.perf_counter() - t0
                out.status = content["status"]
                if content["status"] == "error":
                    out.error = f"{content['ename']}: {content['evalue']}"
                replied = True
            elif kind == "stream":
                if content["name"] == "stdout":
                    out.stdout += content["text"]
                else:
                    out.stderr += content["text"]
            elif kind == "execute_result":
                out.result = content["data"].get("text/plain")
            elif kind == "error":
                out.error = f"{content['ename']}: {content['evalue']}"
            elif kind == "status" and content["execution_state"] == "idle":
                idle = True
        return out

    def run(self, code: str, timeout: float = 120) -> CellResult:
        t0 = time.perf_counter()
        return self.wait(self.send(code), timeout, t0)

    def ok(self, code: str, timeout: float = 120) -> CellResult:
        result = self.run(code, timeout)
        if result.status != "ok":
            raise AssertionError(f"cell failed in {self.path}: {result.error}\n{code}")
        return result

    def expression(self, expr: str, timeout: float = 120) -> Any:
        """A user expression's value, evaluated silently (no cell: no checkpoint hooks)."""
        msg_id = self.send("", silent=True, store_history=False, user_expressions={"x": expr})
        reply = self.wait(msg_id, timeout)
        content = next(m for m in reply.messages if m["msg_type"] == "execute_reply")["content"]
        result = content["user_expressions"]["x"]
        if result["status"] != "ok":
            raise AssertionError(f"{self.path}: {expr}: {result.get('ename')}: {result}")
        return ast.literal_eval(result["data"]["text/plain"])

    def value(self, expr: str) -> Any:
        """A JSON-able value from the kernel (json.dumps on its side)."""
        res = self.ok(f"print(__import__('json').dumps({expr}))")
        return json.loads(res.stdout.strip().splitlines()[-1])

    def close(self) -> None:
        try:
            self.ws.close()
        except Exception:
            pass


class LocalServer:
    """``python -m jupyter_server`` in ``root`` with the budgethub extensions."""

    def __init__(
        self,
        root: Path,
        *,
        home: Path | None = None,
        secret: str | None = "agent-secret",
        restore_dir: Path | None = None,
        checkpoint: bool = True,
        install_config: bool = True,
        env: dict[str, str] | None = None,
        python: str = sys.executable,
    ) -> None:
        self.root = Path(root)
        self.home = Path(home) if home is not None else self.root.parent / "home"
        self.secret = secret
        self.restore_dir = restore_dir
        self.checkpoint = checkpoint
        self.install_config = install_config  # False: the image's own config files
        self.extra_env = env or {}
        self.python = python
        self.port = free_port()
        self.token = uuid.uuid4().hex
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.home / "server.log"
        self.kernels: list[LocalKernel] = []

    @property
    def state_dir(self) -> Path:
        return self.home / ".budgethub" / "kernels"

    def _env(self) -> dict[str, str]:
        jupyter = self.home / "jupyter"
        config = jupyter / "etc" / "jupyter" / "jupyter_server_config.d"
        config.mkdir(parents=True, exist_ok=True)
        profile = self.home / ".ipython" / "profile_default"
        profile.mkdir(parents=True, exist_ok=True)
        if self.install_config:
            shutil.copy(ETC / "jupyter_server_config.json", config / "budgethub_session.json")
            shutil.copy(ETC / "ipython_kernel_config.py", profile / "ipython_kernel_config.py")
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("JUPYTER", "JPY_", "BUDGETHUB_", "IPYTHON"))
        }
        env.update(
            HOME=str(self.home),
            IPYTHONDIR=str(self.home / ".ipython"),
            JUPYTER_CONFIG_DIR=str(jupyter / "config"),
            JUPYTER_CONFIG_PATH=str(jupyter / "etc" / "jupyter"),
            JUPYTER_DATA_DIR=str(jupyter / "data"),
            JUPYTER_RUNTIME_DIR=str(jupyter / "runtime"),
            JUPYTER_PLATFORM_DIRS="1",
            PYTHONUNBUFFERED="1",
        )
        if self.secret is not None:
            env["BUDGETHUB_AGENT_SECRET"] = self.secret
        if self.restore_dir is not None:
            env["BUDGETHUB_RESTORE_DIR"] = str(self.restore_dir)
        if not self.checkpoint:
            env["BUDGETHUB_CHECKPOINT"] = "0"
        env.update(self.extra_env)
        return env

    def start(self, timeout: float = 60) -> LocalServer:
        self.root.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        cmd = [
            self.python,
            "-m",
            "jupyter_server",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root}",
            "--ServerApp.open_browser=False",
        ]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-root")  # CI machines run the tests as root
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, env=self._env(), stdout=log, stderr=subprocess.STDOUT, cwd=self.root
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter_server exited {self.proc.returncode}: {self.log()}")
            try:
                if self.api("GET", "/api/status")[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"jupyter_server did not answer within {timeout} s: {self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float = 120,
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", data=data, method=method, headers=headers or {}
        )
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
                status = resp.status
        except urllib.error.HTTPError as error:
            raw, status = error.read(), error.code
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return self.request(method, path, body, {"Authorization": f"token {self.token}"})

    def agent(
        self,
        method: str,
        route: str,
        body: Any = None,
        secret: str | None = "",
        headers: dict[str, str] | None = None,
        timeout: float = 120,
    ) -> tuple[int, Any]:
        """Ask the agent as the spawner does (secret "" = this server's own)."""
        h = dict(headers or {})
        if secret is not None:
            h[HEADER] = secret or (self.secret or "")
        return self.request(method, f"/budgethub-agent/{route}", body, h, timeout)

    def open_notebook(self, path: str) -> LocalKernel:
        """A session for ``path`` (as JupyterLab makes one) and its kernel's websocket."""
        status, model = self.api(
            "POST",
            "/api/sessions",
            {
                "path": path,
                "name": os.path.basename(path),
                "type": "notebook",
                "kernel": {"name": "python3"},
            },
        )
        if status != 201:
            raise RuntimeError(f"POST /api/sessions {path}: {status} {model}")
        kernel = LocalKernel(self, model["kernel"]["id"], path)
        self.kernels.append(kernel)
        return kernel

    def create_notebook(self, path: str) -> None:
        """An empty notebook file at ``path`` (its folders too), as JupyterLab's "New"."""
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            self.api("PUT", "/api/contents/" + "/".join(parts[:i]), {"type": "directory"})
        empty = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
        status, body = self.api(
            "PUT", f"/api/contents/{path}", {"type": "notebook", "content": empty}
        )
        if status not in (200, 201):
            raise RuntimeError(f"PUT /api/contents/{path}: {status} {body}")

    def shutdown(self, kernel: LocalKernel) -> None:
        """Stop a notebook's kernel (and close its websocket)."""
        kernel.close()
        if kernel in self.kernels:
            self.kernels.remove(kernel)
        self.api("DELETE", f"/api/kernels/{kernel.kernel_id}")

    def stop(self) -> None:
        for k in self.kernels:
            k.close()
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

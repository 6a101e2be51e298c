"""Real kernels of a session, driven as JupyterLab drives them: the Jupyter Server REST
API (contents, sessions) and the kernel's websocket, through the Hub's proxy."""

from __future__ import annotations

import base64
import io
import json
import uuid
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import websocket
from budgethub_session.localserver import execute_request

from harness.hub import ADMIN_TOKEN, Hub


@dataclass
class Result:
    stdout: str = ""
    value: str | None = None
    error: str | None = None
    outputs: list[dict[str, Any]] = field(default_factory=list)


class Server:
    """One user's Jupyter server, reached through the Hub's proxy with the tester token."""

    def __init__(self, hub: Hub, user: str, server: str = "") -> None:
        self.hub = hub
        self.prefix = f"/user/{user}/{server + '/' if server else ''}"
        self.base = f"{hub.url}{self.prefix}"

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.hub.http.request(method, f"{self.base}api/{path}", timeout=60, **kwargs)
        assert response.status_code < 300, (method, path, response.status_code, response.text)
        return response.json() if response.content else None

    def mkdirs(self, path: str) -> None:
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            self.api("PUT", "contents/" + "/".join(parts[:i]), json={"type": "directory"})

    def put_file(self, path: str, content: bytes) -> None:
        self.mkdirs(path)
        encoded = base64.b64encode(content).decode()
        body = {"type": "file", "format": "base64", "content": encoded}
        self.api("PUT", f"contents/{path}", json=body)

    def get_file(self, path: str) -> bytes:
        model = self.api("GET", f"contents/{path}", params={"format": "base64", "type": "file"})
        return base64.b64decode(model["content"])

    def put_notebook(self, path: str) -> None:
        self.mkdirs(path)
        content = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
        self.api("PUT", f"contents/{path}", json={"type": "notebook", "content": content})

    def open(self, path: str) -> Kernel:
        """A session for the notebook (as opening it in JupyterLab makes), and its kernel."""
        model = self.api(
            "POST",
            "sessions",
            json={"path": path, "name": path, "type": "notebook", "kernel": {"name": "python3"}},
        )
        return Kernel(self, model["kernel"]["id"])

    def sessions(self) -> list[dict[str, Any]]:
        return list(self.api("GET", "sessions"))


class Kernel:
    def __init__(self, server: Server, kernel_id: str) -> None:
        self.server = server
        self.id = kernel_id
        url = server.base.replace("http://", "ws://") + f"api/kernels/{kernel_id}/channels"
        self.ws = websocket.create_connection(
            url, header=[f"Authorization: token {ADMIN_TOKEN}"], timeout=120
        )
        self.session = uuid.uuid4().hex

    def close(self) -> None:
        self.ws.close()

    def __enter__(self) -> Kernel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, code: str) -> str:
        """Start executing a cell without waiting for it; its message id."""
        msg_id = uuid.uuid4().hex
        self._send(msg_id, code)
        return msg_id

    def run(self, code: str, timeout: float = 120) -> Result:
        """Execute a cell; its stdout, its value (text/plain), or its error."""
        msg_id = uuid.uuid4().hex
        self.ws.settimeout(timeout)
        self._send(msg_id, code)
        return self._collect(msg_id)

    def _send(self, msg_id: str, code: str) -> None:
        self.ws.send(json.dumps(execute_request(msg_id, self.session, code, "tester")))

    def _collect(self, msg_id: str) -> Result:
        result = Result()
        replied = idle = False
        for _ in range(100_000):
            message = json.loads(self.ws.recv())
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = message["msg_type"]
            content = message["content"]
            if kind == "stream":
                result.stdout += content["text"]
            elif kind in ("execute_result", "display_data"):
                result.outputs.append(content)
                if kind == "execute_result":
                    result.value = content["data"].get("text/plain")
            elif kind == "error":
                result.error = f"{content['ename']}: {content['evalue']}"
            elif kind == "execute_reply":
                replied = True
            elif kind == "status" and content["execution_state"] == "idle":
                idle = True
            if replied and idle:
                return result
        raise AssertionError("the kernel never finished the cell")

    def value(self, expression: str) -> Any:
        """``expression`` evaluated in the kernel, as JSON."""
        result = self.run(f"import json as _j; print(_j.dumps({expression}))")
        assert result.error is None, result.error
        return json.loads(result.stdout.strip().splitlines()[-1])


def toy_wheel(directory: Path, name: str = "bhtoy", value: str = "toy-42") -> Path:
    """A tiny pure-Python wheel, built here (no network, no build backend)."""
    dist = f"{name}-1.0.dist-info"
    files = {
        f"{name}/__init__.py": f"VALUE = {value!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = "".join(f"{path},,\n" for path in files) + f"{dist}/RECORD,,\n"
    files[f"{dist}/RECORD"] = record
    path = directory / f"{name}-1.0-py3-none-any.whl"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        for member, text in files.items():
            wheel.writestr(member, text)
    path.write_bytes(buffer.getvalue())
    return path

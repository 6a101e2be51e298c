"""configure_hub's proxy, log redaction, file modes and spawn limit; the proxy launcher."""

from __future__ import annotations

import logging
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from traitlets.config import Application, Config

from spawner import chp, hubconfig, logfilters

LAUNCHER = [sys.executable, "-I", str(Path(chp.__file__).resolve())]


@pytest.fixture
def umask() -> Iterator[None]:
    """configure_hub sets the process umask (for the Hub): put the test's back."""
    old = os.umask(0o022)
    os.umask(old)
    yield
    os.umask(old)


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for proxy/node_modules/.../configurable-http-proxy and node on PATH."""
    bin_ = tmp_path / "configurable-http-proxy"
    bin_.write_text("")
    monkeypatch.setattr(chp, "CHP_BIN", bin_)
    monkeypatch.setattr(hubconfig.shutil, "which", lambda name: f"/opt/{name}")
    return bin_


@pytest.mark.parametrize(
    ("line", "secret"),
    [
        ("302 GET /user/bo/api?token=0123abcdSECRET -> /hub/user/bo/api", "0123abcdSECRET"),
        ("GET /hub/api/users?x=1&token=SECRET99", "SECRET99"),
        ("GET /user/a/lab?_xsrf=2|abc&access_token=AT123", "AT123"),
        ("error page: /hub/error/503?url=%2Fuser%2Fbo%2Fapi%3Ftoken%3DENC123%26q%3D1", "ENC123"),
        ("next=%252Fuser%252Fbo%253Ftoken%253DTWICE123", "TWICE123"),
        ("Rejecting API request from: token 0123456789abcdef0123456789abcdef", "0123456789abcdef"),
        ('{"Authorization": "token HEADERVALUE1"}', "HEADERVALUE1"),
        ("Authorization: Bearer eyJhbGciOi.J9x", "eyJhbGciOi.J9x"),
        ("Setting new xsrf cookie for b'None:DHBCYjjTlTr8p2e52z=' {'path': '/hub/'}", "DHBCYjj"),
    ],
)
def test_redact_removes_tokens_from_urls_and_authorization_values(line: str, secret: str) -> None:
    clean = chp.redact(line)
    assert secret not in clean
    assert chp.REDACTED in clean


@pytest.mark.parametrize(
    "line",
    [
        "200 GET /hub/api/users/ann?include_stopped_servers=1 (tester@127.0.0.1) 3.21ms",
        "Adding API token for service budgethub",
        "token authentication failed for this user, see the docs",
        "302 GET /user/bo/api?token=[secret] -> /hub/login",
    ],
)
def test_redact_leaves_ordinary_lines_alone(line: str) -> None:
    assert chp.redact(line) == line


def test_the_filter_redacts_formatted_messages() -> None:
    record = logging.LogRecord(
        "JupyterHub", logging.INFO, __file__, 1, "%s requested %s", ("bo", "/x?token=S3CRETX"), None
    )
    assert chp.RedactFilter().filter(record)
    assert record.getMessage() == "bo requested /x?token=[redacted]"


def test_configure_hub_runs_the_local_node_proxy_through_the_launcher(installed, umask):
    c = Config()
    hubconfig.configure_hub(c, token="t")
    assert c.ConfigurableHTTPProxy.command == [*LAUNCHER, "/opt/node", str(installed)]
    assert os.umask(0o077) == 0o077
    assert c.JupyterHub.concurrent_spawn_limit == 0


def test_the_real_install_is_found_from_the_package_not_the_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bin_ = Path("proxy/node_modules/configurable-http-proxy/bin/configurable-http-proxy")
    assert chp.CHP_BIN == chp.ROOT / bin_
    assert chp.ROOT.is_absolute()
    assert (chp.ROOT / "proxy" / "package-lock.json").is_file()


def test_a_missing_proxy_says_to_run_make(tmp_path, monkeypatch, umask):
    monkeypatch.setattr(chp, "CHP_BIN", tmp_path / "nothing")
    with pytest.raises(hubconfig.ProxyNotInstalled, match="run `make proxy`"):
        hubconfig.configure_hub(Config(), token="t")
    monkeypatch.setattr(hubconfig.shutil, "which", lambda name: None)
    with pytest.raises(hubconfig.ProxyNotInstalled, match="Node.js"):
        hubconfig.proxy_command()


def test_the_operators_choices_are_kept(tmp_path, monkeypatch, umask):
    monkeypatch.setattr(chp, "CHP_BIN", tmp_path / "nothing")  # not needed: not looked for
    c = Config()
    c.ConfigurableHTTPProxy.command = ["/usr/local/bin/configurable-http-proxy"]
    c.JupyterHub.concurrent_spawn_limit = 500
    c.JupyterHub.logging_config = {"handlers": {"file": {"class": "logging.NullHandler"}}}
    hubconfig.configure_hub(c, token="t")
    assert c.ConfigurableHTTPProxy.command == ["/usr/local/bin/configurable-http-proxy"]
    assert c.JupyterHub.concurrent_spawn_limit == 500
    handlers = c.JupyterHub.logging_config["handlers"]
    both = [hubconfig.REFUSAL_FILTER, hubconfig.REDACT_FILTER]
    assert handlers["file"]["filters"] == both
    assert handlers["console"]["filters"] == both
    external = Config()
    external.ConfigurableHTTPProxy.should_start = False
    hubconfig.configure_hub(external, token="t")
    assert "command" not in external.ConfigurableHTTPProxy


def test_the_logging_config_puts_the_filter_on_the_apps_console_handler(installed, umask, capfd):
    c = Config()
    hubconfig.configure_hub(c, token="t")
    app = Application(config=c)
    app.logging_config = c.JupyterHub.logging_config  # the Hub's class name differs
    app.log_level = logging.INFO  # traitlets rebuilds the handlers: the filter stays
    app.log.info("302 GET /user/bo/api?token=%s", "LEAKED123")
    assert "LEAKED123" not in capfd.readouterr().err


def test_existing_state_files_are_made_private(tmp_path):
    db = tmp_path / "hub.sqlite"
    paths = hubconfig.sqlite_files(f"sqlite:///{db}")
    assert paths == [db, *(tmp_path / f"hub.sqlite{s}" for s in ("-wal", "-shm", "-journal"))]
    assert hubconfig.sqlite_files("postgresql+psycopg://h/db") == []
    for path in paths[:3]:
        path.write_text("")
        path.chmod(0o644)
    hubconfig.restrict_files([*paths, tmp_path / "missing"])
    assert [stat.S_IMODE(p.stat().st_mode) for p in paths[:3]] == [0o600] * 3


CHILD = """
import signal, sys, time
def bye(*_):
    print("Terminated after GET /user/x/api?token=CHILDSECRET1", flush=True)
    sys.exit(2)
signal.signal(signal.SIGTERM, bye)
print("503 GET /user/x/api?token=CHILDSECRET2 ECONNREFUSED", flush=True)
for _ in range(600):
    time.sleep(0.1)
"""


def test_the_launcher_redacts_the_output_and_passes_sigterm_on():
    with subprocess.Popen(
        [*LAUNCHER, sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True
    ) as launcher:
        assert launcher.stdout is not None
        first = launcher.stdout.readline()
        assert first.startswith("503 GET /user/x/api?token=[redacted]"), first
        launcher.send_signal(signal.SIGTERM)
        rest = launcher.stdout.read()
        assert launcher.wait(timeout=10) == 2
    assert "Terminated" in rest and "CHILDSECRET" not in rest


def alive(pid: int) -> bool:
    """Running (a zombie waiting for init to reap it counts as gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in status


def test_the_proxy_goes_when_the_launcher_is_killed(tmp_path):
    pid_file = tmp_path / "child.pid"
    child = f"import os; open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n" + CHILD
    with subprocess.Popen(
        [*LAUNCHER, sys.executable, "-c", child], stdout=subprocess.PIPE
    ) as launcher:
        for _ in range(100):
            if pid_file.exists() and pid_file.read_text():
                break
            time.sleep(0.05)
        pid = int(pid_file.read_text())
        launcher.kill()
        launcher.wait(timeout=10)
    for _ in range(100):
        if not alive(pid):
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    pytest.fail("the proxy outlived its launcher")


def test_a_refused_spawn_form_is_one_warning_line_and_other_errors_stay() -> None:
    from jupyterhub.spawner import SpawnException

    def record(error: BaseException) -> logging.LogRecord:
        try:
            raise error
        except BaseException:
            info = sys.exc_info()
        return logging.LogRecord(
            "JupyterHub",
            logging.ERROR,
            __file__,
            1,
            "Failed to spawn single-user server with form",
            (),
            info,
        )

    refusal = SpawnException("Cannot start: gpus: no.", reason="form", status_code=400)
    refusal.jupyterhub_message = "Cannot start: gpus: no."
    quiet = record(refusal)
    assert logfilters.QuietRefusalFilter().filter(quiet)
    assert quiet.levelno == logging.WARNING and quiet.exc_info is None
    assert quiet.getMessage() == "Spawn form refused (400): Cannot start: gpus: no."
    broken = record(RuntimeError("engine down"))
    assert logfilters.QuietRefusalFilter().filter(broken)
    assert broken.levelno == logging.ERROR and broken.exc_info is not None


def test_configure_hub_adds_the_templates_vars_and_proxy_class(
    installed: Path, umask: None
) -> None:
    c = Config()
    c.JupyterHub.template_paths = ["/srv/mine"]
    hubconfig.configure_hub(c, token="t")
    assert c.JupyterHub.template_paths == [str(hubconfig.TEMPLATES), "/srv/mine"]
    assert (hubconfig.TEMPLATES / "home.html").is_file()
    assert callable(c.JupyterHub.template_vars["budgethub"])
    assert c.JupyterHub.proxy_class == "spawner.hub.hubproxy.BudgetProxy"
    handlers = c.JupyterHub.logging_config["handlers"]
    assert hubconfig.REFUSAL_FILTER in handlers["console"]["filters"]

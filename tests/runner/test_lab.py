"""`make lab`: a JupyterLab server with the repository's settings serves notebooks/NN_topic.py as a notebook,
makes the Jupytext notebook the default viewer of Python files, and keeps token authentication on localhost; it
starts as root too (the server below is started through `make lab` itself), and `make help` names every target."""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from taskloss.utils import REPO_ROOT

pytestmark = pytest.mark.slow
NOTEBOOK = "notebooks/01_optimization_as_sampling.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, token: str | None = None):
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"} if token else {})
    with urllib.request.urlopen(req, timeout=20) as r:
        return r.status, r.read().decode()


def test_make_lab_uses_the_repository_settings():
    makefile = (REPO_ROOT / "Makefile").read_text()
    lab = re.search(r"^LAB_ENV := (.*)$", makefile, re.MULTILINE).group(1)
    assert "JUPYTER_CONFIG_PATH=$(CURDIR)/.jupyter" in lab
    recipe = makefile.split("\nlab:", 1)[1].split("\n\n", 1)[0]
    for unsafe in ("token=''", 'token=""', "0.0.0.0", "--ip", "disable_check_xsrf", "password"):
        assert unsafe not in recipe, unsafe
    config = json.loads((REPO_ROOT / ".jupyter" / "jupyter_server_config.json").read_text())
    assert config["ServerApp"]["ip"] == "localhost" and "token" not in json.dumps(config).lower()


def _make(*args: str, env: dict | None = None) -> str:
    proc = subprocess.run(["make", "-s", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


@needs_make
@pytest.mark.parametrize("uid, root", [("0", True), ("1000", False)])
def test_make_lab_allows_root_only_as_root_and_passes_lab_args(tmp_path, uid, root):
    fake = tmp_path / "id"                      # what `id -u` answers decides; the real user does not matter
    fake.write_text(f"#!/bin/sh\necho {uid}\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    command = _make("-n", "lab", f"PY={sys.executable}", "LAB_ARGS=--port=8899 --no-browser", env=env)
    line = next(ln for ln in command.splitlines() if "jupyter lab" in ln)
    assert ("--allow-root" in line) is root, line
    assert line.rstrip().endswith("--port=8899 --no-browser"), line


@needs_make
def test_make_help_names_every_target():
    makefile = (REPO_ROOT / "Makefile").read_text()
    targets = {t for line in re.findall(r"^\.PHONY:(.*)$", makefile, re.MULTILINE) for t in line.split()}
    listed = set(re.findall(r"make ([a-z][\w-]*)", _make("help")))
    assert targets - {"help"} and targets - {"help"} <= listed, sorted(targets - listed - {"help"})


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory):
    """JupyterLab started by ``make lab`` (as root where the tests run as root: CI does), on a free port."""
    pytest.importorskip("jupyterlab")
    pytest.importorskip("jupytext")
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    port, token = _free_port(), secrets.token_hex(16)
    runtime = tmp_path_factory.mktemp("jupyter-runtime")
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(runtime), "JUPYTER_TOKEN": token}
    env.pop("JUPYTER_CONFIG_PATH", None)
    log = runtime / "server.log"
    lab_args = f"--no-browser --port={port} --ServerApp.port_retries=0 --ServerApp.root_dir={REPO_ROOT}"
    with open(log, "wb") as f:
        proc = subprocess.Popen(["make", "-s", "-C", str(REPO_ROOT), "lab", f"PY={sys.executable}",
                                 f"LAB_ARGS={lab_args}"], env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)   # its own process group: make, the shell and Jupyter
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                _get(f"{base}/api/status", token)
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                if proc.poll() is not None:            # e.g. Jupyter refusing root without --allow-root
                    pytest.fail(f"make lab exited with {proc.returncode}: {log.read_text()[-800:]}")
                if time.time() > deadline:
                    pytest.skip(f"jupyter-server did not answer within 90 s: {log.read_text()[-500:]}")
                time.sleep(0.5)
        yield base, token, log
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def test_contents_api_serves_the_py_source_as_a_notebook(lab_server):
    base, token, _ = lab_server
    try:
        _, body = _get(f"{base}/api/contents/{NOTEBOOK}?type=notebook&content=1", token)
    except urllib.error.HTTPError as exc:  # e.g. Jupytext refusing a .py older than its paired .ipynb
        pytest.fail(f"the contents API refused {NOTEBOOK}: {exc.code} {exc.read().decode()[:600]}")
    model = json.loads(body)
    assert model["type"] == "notebook"
    cells = model["content"]["cells"]
    assert len(cells) > 10 and any("parameters" in c["metadata"].get("tags", []) for c in cells)


def test_jupytext_notebook_is_the_default_viewer_of_python_files(lab_server):
    base, token, _ = lab_server
    _, body = _get(f"{base}/lab/api/settings/@jupyterlab/docmanager-extension:plugin", token)
    settings = json.loads(body)
    # the repository's override becomes the setting's default (a user's own setting still wins)
    assert settings["schema"]["properties"]["defaultViewers"]["default"]["python"] == "Jupytext Notebook"
    assert "python" not in settings["settings"].get("defaultViewers", {})
    _, page = _get(f"{base}/lab", token)
    assert "jupyterlab-jupytext" in page  # the extension that provides the "Jupytext Notebook" viewer


def test_token_authentication_and_localhost_only(lab_server):
    base, _, log = lab_server
    with pytest.raises(urllib.error.HTTPError) as err:
        _get(f"{base}/api/contents/{NOTEBOOK}")
    assert err.value.code == 403
    text = log.read_text()
    assert re.search(r"http://(localhost|127\.0\.0\.1):\d+/lab\?token=", text), text[-800:]
    assert "0.0.0.0" not in text


def test_the_file_browser_lists_each_notebook_once(lab_server):
    """One entry per notebook: the .py source (opened as a notebook with the paired outputs); the .ipynb is hidden
    from the listing but still served by its path."""
    base, token, _ = lab_server
    _, body = _get(f"{base}/api/contents/notebooks?content=1", token)
    names = {item["name"] for item in json.loads(body)["content"]}
    assert "01_optimization_as_sampling.py" in names and not any(n.endswith(".ipynb") for n in names), names
    status, _ = _get(f"{base}/api/contents/notebooks/01_optimization_as_sampling.ipynb?content=0", token)
    assert status == 200

"""`make lab`: a JupyterLab server with the repository's settings serves notebooks/NN_topic.py as a notebook,
makes the Jupytext notebook the default viewer of Python files, and keeps token authentication on localhost."""
from __future__ import annotations

import json
import os
import re
import secrets
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


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory):
    pytest.importorskip("jupyterlab")
    pytest.importorskip("jupytext")
    port, token = _free_port(), secrets.token_hex(16)
    runtime = tmp_path_factory.mktemp("jupyter-runtime")
    env = {**os.environ, "JUPYTER_CONFIG_PATH": str(REPO_ROOT / ".jupyter"), "JUPYTER_RUNTIME_DIR": str(runtime),
           "JUPYTER_TOKEN": token}
    log = runtime / "server.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}",
                                 "--ServerApp.port_retries=0", f"--ServerApp.root_dir={REPO_ROOT}",
                                 *(["--allow-root"] if os.geteuid() == 0 else [])],  # CI runs as root
                                env=env, stdout=f, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                _get(f"{base}/api/status", token)
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                if proc.poll() is not None or time.time() > deadline:
                    pytest.skip(f"jupyter-server could not start: {log.read_text()[-500:]}")
                time.sleep(0.5)
        yield base, token, log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


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

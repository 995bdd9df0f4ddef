"""Ready means a real completion was answered; a server that dies is reported with how it died."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from consumer import localmodel
from consumer.localmodel import server
from consumer.testing.ports import free_port
from tests.local_model.installed import require_server_installed

FAKE = Path(__file__).with_name("fake_llama_server.py")


def test_a_server_that_lists_its_model_but_dies_on_a_completion_is_not_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the model listing answers, so only the completion can tell that the kernels crash
    monkeypatch.setattr(server, "server_installed", lambda: True)
    monkeypatch.setattr(
        server, "server_command",
        lambda _model, *, port, **_kw: [sys.executable, str(FAKE), "llama_cpp.server", "--port", str(port)],
    )
    port = free_port()
    with pytest.raises(localmodel.LocalModelError, match="exited with signal SIGILL") as caught:
        localmodel.serve(port=port, model_path=tmp_path / "unused.gguf", directory=tmp_path, wait_s=60)
    assert "fake server listening" in str(caught.value)  # the log's last lines come with it
    assert not (tmp_path / f"server-{port}.pid").exists()


def test_a_server_that_crashes_later_is_reported_by_status(model_path: Path, tmp_path: Path) -> None:
    require_server_installed()
    port = free_port()
    handle = localmodel.serve(port=port, n_ctx=1024, n_threads=1, wait_s=120, model_path=model_path,
                              directory=tmp_path)
    try:
        recorded = json.loads((tmp_path / f"server-{port}.pid").read_text())
        assert recorded["pid"] == handle.info.pid and recorded["supervisor_pid"] == handle.process.pid
        os.kill(handle.info.pid, signal.SIGKILL)
        handle.process.wait(timeout=30)
        st = localmodel.status(port, tmp_path)
        assert (st.running, st.crashed) == (False, True)
        assert st.exit is not None and st.exit.how.startswith("signal SIGKILL")
        env = {**os.environ, "PROMPTBUS_LOCAL_STATE_DIR": str(tmp_path)}
        cli = [sys.executable, "-m", "consumer.localmodel"]
        out = subprocess.run([*cli, "status", "--port", str(port)], capture_output=True, text=True, env=env,
                             timeout=60, check=False)
        assert out.returncode == 1
        assert json.loads(out.stdout)["crashed"] is True
        assert f"the server on port {port} crashed: signal SIGKILL" in out.stderr
        # a stop asked for is not a crash: stop forgets it
        assert localmodel.stop(port, tmp_path) is False
        assert localmodel.status(port, tmp_path).crashed is False
    finally:
        handle.stop()


def test_a_stopped_server_is_not_a_crash(model_path: Path, tmp_path: Path) -> None:
    require_server_installed()
    port = free_port()
    handle = localmodel.serve(port=port, n_ctx=1024, n_threads=1, wait_s=120, model_path=model_path,
                              directory=tmp_path)
    handle.stop()
    ended = localmodel.read_exit(tmp_path / f"server-{port}.exit")
    assert ended is None or ended.stopped
    assert localmodel.status(port, tmp_path).crashed is False


def test_foreground_serve_exits_non_zero_when_its_server_dies(model_path: Path, tmp_path: Path) -> None:
    require_server_installed()
    port = free_port()
    env = {**os.environ, "PROMPTBUS_LOCAL_STATE_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "consumer.localmodel", "serve", "--port", str(port), "--n-ctx", "1024",
         "--foreground"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline()
        assert "ready" in ready, proc.stderr.read() if proc.stderr else ""
        pid = json.loads((tmp_path / f"server-{port}.pid").read_text())["pid"]
        os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 1
        assert "exited with signal SIGKILL" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and localmodel.status(port, tmp_path).running:
            time.sleep(0.1)
        localmodel.stop(port, tmp_path)

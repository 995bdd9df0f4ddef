"""`promptbus local-model ...` argument handling, the subparser shaped as cli/local_model.py has it."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from consumer import localmodel
from consumer.testing.ports import free_port
from tests.local_model.installed import require_server_installed


def parser() -> argparse.ArgumentParser:
    # the shape consumer/cli/local_model.py uses: a `local-model` subparser handed to add_arguments
    root = argparse.ArgumentParser(prog="promptbus")
    sub = root.add_subparsers(dest="command", required=True)
    lm = sub.add_parser("local-model")
    localmodel.add_arguments(lm)
    lm.set_defaults(func=localmodel.run_from_args)
    return root


def test_defaults_and_options_parse() -> None:
    args = parser().parse_args(["local-model", "serve"])
    # no --n-ctx: the server's default (DEFAULT_N_CTX, or DEFAULT_EMBED_N_CTX with --embeddings)
    assert (args.host, args.port, args.n_ctx, args.n_threads, args.wait_s, args.embeddings) == (
        "127.0.0.1", 8080, None, None, 120.0, False,
    )
    assert parser().parse_args(["local-model", "serve", "--embeddings"]).embeddings is True
    args = parser().parse_args(
        ["local-model", "serve", "--port", "9001", "--n-ctx", "2048", "--n-threads", "2", "--foreground"]
    )
    assert (args.port, args.n_ctx, args.n_threads, args.foreground) == (9001, 2048, 2, True)
    with pytest.raises(SystemExit):
        parser().parse_args(["local-model"])  # a subcommand is required


def test_status_and_stop_when_nothing_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PROMPTBUS_LOCAL_STATE_DIR", str(tmp_path))
    port = free_port()
    args = parser().parse_args(["local-model", "status", "--port", str(port)])
    assert args.func(args) == 1
    assert json.loads(capsys.readouterr().out)["running"] is False
    args = parser().parse_args(["local-model", "stop", "--port", str(port)])
    assert args.func(args) == 0
    assert "not running" in capsys.readouterr().out


def test_stale_pid_file_is_cleaned(tmp_path: Path) -> None:
    port = free_port()
    # a pid that is not a llama_cpp.server (this test process) must never be signalled
    info = {"pid": os.getpid(), "host": "127.0.0.1", "port": port, "base_url": f"http://127.0.0.1:{port}/v1",
            "model": localmodel.MODEL_ALIAS, "log_path": "x", "n_ctx": 1, "n_threads": 1,
            "n_threads_batch": 1, "started_at": 0.0}
    (tmp_path / f"server-{port}.pid").write_text(json.dumps(info))
    assert localmodel.stop(port, tmp_path) is False
    assert not (tmp_path / f"server-{port}.pid").exists()


@pytest.mark.slow
def test_foreground_serve_stops_on_sigterm(model_path: Path, tmp_path: Path) -> None:
    require_server_installed()
    port = free_port()
    env = {**os.environ, "PROMPTBUS_LOCAL_STATE_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "consumer.localmodel", "serve", "--port", str(port), "--n-ctx", "1024",
         "--foreground"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 300  # a bound for a start on a busy machine, not a time asserted
        while time.monotonic() < deadline and not localmodel.status(port, tmp_path).answering:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        # /v1/models answers before `serve` has run its test completion and printed "ready"; while that
        # completion runs the server may be too busy to answer a status probe, so read status after the line
        assert proc.stdout is not None
        ready_line = proc.stdout.readline()
        assert "ready" in ready_line, ready_line
        st = localmodel.status(port, tmp_path)
        assert st.answering and st.info is not None
        server_pid = st.info.pid
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert not (tmp_path / f"server-{port}.pid").exists()
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2)
        with pytest.raises(ProcessLookupError):
            os.kill(server_pid, 0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        localmodel.stop(port, tmp_path)


@pytest.mark.slow
def test_sigterm_during_start_leaves_no_server(model_path: Path, tmp_path: Path) -> None:
    require_server_installed()
    port = free_port()
    pid_file = tmp_path / f"server-{port}.pid"
    env = {**os.environ, "PROMPTBUS_LOCAL_STATE_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "consumer.localmodel", "serve", "--port", str(port), "--foreground"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not pid_file.exists():
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.01)
        server_pid = json.loads(pid_file.read_text())["pid"]
        proc.send_signal(signal.SIGTERM)  # almost surely before the model has loaded
        _, err = proc.communicate(timeout=60)
        assert proc.returncode in (0, 130), err
        assert not pid_file.exists()
        with pytest.raises(ProcessLookupError):
            os.kill(server_pid, 0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        localmodel.stop(port, tmp_path)

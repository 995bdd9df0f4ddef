"""API keys that rotate: read from a file that is replaced in place, or printed by a command.

A static key (`api_key_env`) is a `SecretStr` handed to the adapter once. The two rotating
kinds are `KeySource`s the adapter asks before each request (`await source.key()`, the cached
key almost always) and once more after a 401 (`await source.renewed(rejected)`: a different
key, or None when there is none and the 401 stands):

    FileKey     a mounted secret (Kubernetes updates one by swapping a symlink): the file's
                identity (inode, size, mtime) is looked at no more than every
                `FILE_CHECK_S`, and at once after a 401; a changed file is read again. A file
                that cannot be read keeps the key read last.
    CommandKey  a command whose standard output is the token, or JSON
                `{"token": ..., "expires_at": epoch seconds or ISO 8601}`: run at start
                (`prime`), cached, run again before it expires (`REFRESH_BEFORE_S`, or a fifth
                of its life when that is shorter) and once after a 401, each run bounded by
                `timeout_s`; one run at a time, the others wait for its token.

A key that cannot be had raises `KeyUnavailable`, which the adapter turns into a
`ConnectionFailed` of the deployment: its work is held as in an outage, never dead-lettered.
Neither the key nor the command's output is ever part of an error or a log line.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import subprocess
import time
from collections.abc import Sequence
from typing import Protocol

import orjson
from pydantic import SecretStr

log = logging.getLogger(__name__)

#: a mounted secret's file is looked at no more often than this (and at once after a 401)
FILE_CHECK_S = 1.0
#: a command's token is renewed this long before it expires (or at four fifths of its life)
REFRESH_BEFORE_S = 120.0


class KeyUnavailable(Exception):
    """No key can be had now (the file unreadable at start, the command failed); the message
    names the deployment and the reason, never a key."""


class KeySource(Protocol):
    """A key that may change while the service runs (see the module docstring)."""

    async def key(self) -> str:
        """The key to send now; KeyUnavailable when there is none."""
        ...

    async def renewed(self, rejected: str) -> str | None:
        """After a 401 for `rejected`: a different key, or None when none is newer."""
        ...


#: what an adapter takes as its key: none, a static one, or a rotating source
ApiKey = SecretStr | KeySource | None


class FileKey:
    """The key in `path`, re-read when the file changes (`where` names the deployment in errors)."""

    def __init__(self, path: str, where: str, *, check_s: float = FILE_CHECK_S) -> None:
        self.path = path
        self.where = where
        self.check_s = check_s
        self._key: str | None = None
        self._identity: tuple[int, int, int] | None = None
        self._checked_s = float("-inf")

    def __repr__(self) -> str:
        return f"FileKey(path={self.path!r})"

    def prime(self) -> None:
        """Read the file now; KeyUnavailable when it cannot be read or is empty."""
        self._look(force=True)
        if self._key is None:
            raise KeyUnavailable(f"{self.where}: api_key_file {self.path} is missing or empty")

    async def key(self) -> str:
        if time.monotonic() - self._checked_s >= self.check_s:
            self._look(force=False)
        if self._key is None:
            raise KeyUnavailable(f"{self.where}: api_key_file {self.path} is missing or empty")
        return self._key

    async def renewed(self, rejected: str) -> str | None:
        self._look(force=False)
        return self._key if self._key is not None and self._key != rejected else None

    def _look(self, *, force: bool) -> None:
        self._checked_s = time.monotonic()
        try:
            st = os.stat(self.path)
            identity = (st.st_ino, st.st_size, st.st_mtime_ns)
            if not force and identity == self._identity:
                return
            with open(self.path, encoding="utf-8") as f:
                value = f.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            if self._key is not None:
                log.warning(
                    "%s: api_key_file %s unreadable (%s); the key read last is kept",
                    self.where,
                    self.path,
                    type(exc).__name__,
                )
            return
        if value:
            if self._key is not None and value != self._key:
                log.info("%s: api_key_file %s changed; its new key is used from now", self.where, self.path)
            self._key = value
            self._identity = identity


class CommandKey:
    """The token `command` prints (see the module docstring); `where` names the deployment."""

    def __init__(self, command: Sequence[str], where: str, *, timeout_s: float) -> None:
        self.command = tuple(command)
        self.where = where
        self.timeout_s = timeout_s
        self.runs = 0
        self._token: str | None = None
        self._refresh_at_s = float("inf")  # time.time() after which the token is renewed
        self._lock: asyncio.Lock | None = None

    def __repr__(self) -> str:
        return f"CommandKey(command={self.command[0]!r}...)"

    def prime(self) -> None:
        """Run the command now (at start); a failure is logged and the first request tries again."""
        try:
            completed = subprocess.run(self.command, capture_output=True, timeout=self.timeout_s, check=False)
            self._take(completed.returncode, completed.stdout)
        except KeyUnavailable as exc:
            log.warning("%s; its requests wait until it succeeds", exc)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("%s", self._failure(exc))

    async def key(self) -> str:
        token = self._token
        if token is not None and time.time() < self._refresh_at_s:
            return token
        return await self._run_once(stale=token)

    async def renewed(self, rejected: str) -> str | None:
        token = await self._run_once(stale=rejected)
        return token if token != rejected else None

    async def _run_once(self, *, stale: str | None) -> str:
        """Run the command unless another request's run replaced `stale` meanwhile."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            token = self._token
            if token is not None and token != stale and time.time() < self._refresh_at_s:
                return token  # a run while we waited renewed it
            try:
                returncode, stdout = await self._run()
            except (OSError, TimeoutError) as exc:
                raise KeyUnavailable(self._failure(exc)) from None
            return self._take(returncode, stdout)

    async def _run(self) -> tuple[int, bytes]:
        proc = await asyncio.create_subprocess_exec(
            *self.command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        try:
            async with asyncio.timeout(self.timeout_s):
                stdout, _ = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
        assert proc.returncode is not None
        return proc.returncode, stdout

    def _failure(self, exc: BaseException) -> str:
        if isinstance(exc, (TimeoutError, subprocess.TimeoutExpired)):
            return f"{self.where}: api_key_command took longer than {self.timeout_s:g} s"
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        return f"{self.where}: api_key_command could not run ({reason})"

    def _take(self, returncode: int, stdout: bytes) -> str:
        """Keep the token of one run (KeyUnavailable when the run failed or printed none)."""
        self.runs += 1
        if returncode != 0:
            raise KeyUnavailable(f"{self.where}: api_key_command exited with status {returncode}")
        token, expires_at_s = _parse_token(stdout)
        if not token:
            raise KeyUnavailable(f"{self.where}: api_key_command printed no token")
        now_s = time.time()
        if expires_at_s is None:
            self._refresh_at_s = float("inf")
        else:
            life_s = max(0.0, expires_at_s - now_s)
            self._refresh_at_s = expires_at_s - min(REFRESH_BEFORE_S, life_s / 5)
        self._token = token
        return token


def _parse_token(stdout: bytes) -> tuple[str | None, float | None]:
    """(token, expires_at as epoch seconds or None) of a command's output."""
    text = stdout.decode("utf-8", "replace").strip()
    if not text.startswith("{"):
        return (text or None), None
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None, None
    token = doc.get("token") if isinstance(doc, dict) else None
    if not isinstance(token, str):
        return None, None
    expires = doc.get("expires_at")
    if isinstance(expires, (int, float)) and not isinstance(expires, bool):
        return token, float(expires)
    if isinstance(expires, str):
        try:
            when = datetime.datetime.fromisoformat(expires.replace("Z", "+00:00"))
        except ValueError:
            return token, None
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.UTC)
        return token, when.timestamp()
    return token, None

"""A Harbor environment (``harbor run --environment-import-path lockbox.harbor:LockboxEnvironment``):
each trial's environment is a long-lived lockbox sandbox on the task's image, in the process that
runs Harbor (no daemon, no root).

- **Image**: the task's ``docker_image`` (pulled into the runtime's image store if missing; a
  loopback registry may be plain ``http``), or its ``environment/Dockerfile`` built with
  ``lockbox image build`` (cached by layer, so an unchanged task rebuilds in milliseconds;
  ``--force-build`` builds with ``--no-cache``). Compose environments are refused.
- **Network**, enforced exactly or the task is refused before it starts: ``no-network`` is
  lockbox's default (loopback only); ``allowlist`` becomes ``net_allow`` (each name, ``*.domain``
  wildcard, address or CIDR block on every port, resolved and checked by lockbox's network
  supervisor, docs/policy.md); ``public`` (Harbor's default) is ``net="host"``, the host's own
  network, which includes the host's loopback services: give tasks ``no-network`` or
  ``allowlist`` where that matters.
- **exec** runs ``bash -c COMMAND`` as its own process (like ``docker exec``: no state is kept
  between calls), with the task's ``workdir``, the merged environment, and ``timeout_sec``:
  at the timeout, or when Harbor cancels the call (its agent timeout), the command's whole
  process tree is killed. Inside an image sandbox the caller is uid 0 of its own user
  namespace (docs/images.md "Ownership"); ``user`` cannot switch to another uid and is
  ignored with a debug message, as other single-user environments do.
- **Files** move through the sandbox's file API (no ``tar`` needed in the image).
- **stop** deletes the sandbox (its processes, its writes); nothing is left behind.

Options (``--ek KEY=VALUE``): ``state_dir`` (the lockbox runtime's state directory; default: a
free one of ``<default_state_dir()>/sdk/N``, see docs/python.md), ``max_memory`` (e.g.
``"2G"``; default: the task's ``memory_mb``).

This module needs Harbor (``pip install harbor``, Python 3.12+); the rest of ``lockbox`` does
not import it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path, PurePosixPath
from typing import Any

from harbor.environments.base import (  # type: ignore[import-not-found]
    BaseEnvironment,
    ExecResult,
    SandboxBuildFailedError,
)
from harbor.environments.capabilities import EnvironmentCapabilities  # type: ignore[import-not-found]
from harbor.environments.definition import (  # type: ignore[import-not-found]
    COMPOSE_FILE_NAME,
    DOCKERFILE_NAME,
    environment_content_hash,
    require_agent_environment_definition,
    should_use_prebuilt_docker_image,
)
from harbor.environments.options import EnvironmentOptions  # type: ignore[import-not-found]
from harbor.models.task.config import NetworkMode  # type: ignore[import-not-found]

from .client import Process, RemoteSandbox
from .errors import ServerError
from .local import LocalClient

__all__ = ["LockboxEnvironment", "LockboxOptions"]


class LockboxOptions(EnvironmentOptions):  # type: ignore[misc]
    """User-facing kwargs of :class:`LockboxEnvironment` (``--ek KEY=VALUE``)."""

    state_dir: str | None = None
    max_memory: str | None = None


def _net_spec(host: str) -> str:
    """Harbor's allow-list entry (a name, ``*.domain``, an address or a CIDR block, no port) as
    lockbox's ``--net-allow`` spec: every port; IPv6 in brackets."""
    try:
        ipaddress.ip_network(host, strict=False)
    except ValueError:
        return f"{host}:*"
    return f"[{host}]:*" if ":" in host else f"{host}:*"


class LockboxEnvironment(BaseEnvironment):  # type: ignore[misc]
    """A Harbor trial environment in a lockbox sandbox (see the module's documentation)."""

    options_model = LockboxOptions
    options: LockboxOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._box: RemoteSandbox | None = None
        self._client: LocalClient | None = None
        super().__init__(*args, **kwargs)

    @staticmethod
    def type() -> str:
        return "lockbox"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(
            disable_internet=True,
            network_allowlist=True,
            network_allowlist_hostnames=True,
            network_allowlist_wildcard_hostnames=True,
            network_allowlist_ipv4_addresses=True,
            network_allowlist_ipv6_addresses=True,
            network_allowlist_ipv4_cidrs=True,
            network_allowlist_ipv6_cidrs=True,
        )

    def _validate_definition(self) -> None:
        require_agent_environment_definition(
            self.environment_dir, docker_image=self.task_env_config.docker_image
        )
        if (self.environment_dir / COMPOSE_FILE_NAME).exists() and not self.task_env_config.docker_image \
                and not (self.environment_dir / DOCKERFILE_NAME).exists():
            raise ValueError(
                f"{self.environment_dir / COMPOSE_FILE_NAME}: the lockbox environment runs one "
                "image, not a Compose project; give the task a Dockerfile or docker_image"
            )

    # -- start and stop -------------------------------------------------------------------

    def _lockbox(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Runs the ``lockbox`` CLI of this package on the runtime's state directory."""
        assert self._client is not None
        env = {**os.environ, "LOCKBOX_STATE_DIR": self._client.state_dir}
        return subprocess.run([sys.executable, "-m", "lockbox._cli", *args], env=env,
                              capture_output=True, text=True, check=False)

    def _image(self, force_build: bool) -> str:
        docker_image = self.task_env_config.docker_image
        if should_use_prebuilt_docker_image(self.environment_dir, docker_image=docker_image,
                                            force_build=force_build):
            return str(docker_image)
        digest = environment_content_hash(self.environment_dir)[:12]
        name = "".join(c if c.isalnum() or c in "._-" else "-" for c in self.environment_name.lower())
        tag = f"lockbox-harbor/{name or 'task'}:{digest}"
        args = ["image", "build", "-t", tag, "--network", "host"]
        if force_build:
            args.append("--no-cache")
        built = self._lockbox(*args, str(self.environment_dir))
        if built.returncode != 0:
            raise SandboxBuildFailedError(
                f"lockbox image build of {self.environment_dir / DOCKERFILE_NAME} failed "
                f"(exit {built.returncode}):\n{built.stderr.strip()}"
            )
        self.logger.debug(f"built {tag}: {built.stdout.strip()}")
        return tag

    def _net(self) -> dict[str, Any]:
        policy = self.network_policy
        if policy.network_mode == NetworkMode.NO_NETWORK:
            return {}
        if policy.network_mode == NetworkMode.PUBLIC:
            return {"net": "host"}
        return {"net_allow": [_net_spec(h) for h in policy.allowed_hosts]}

    def _max_memory(self) -> str | None:
        if self.options is not None and self.options.max_memory:
            return str(self.options.max_memory)
        mb = self._effective_memory_mb
        return f"{mb}M" if mb else None

    async def start(self, force_build: bool) -> None:
        state_dir = self.options.state_dir if self.options is not None else None
        self._client = await asyncio.to_thread(LocalClient, state_dir)
        image = await asyncio.to_thread(self._image, force_build)
        policy: dict[str, Any] = {**self._net(), "env": dict(self._persistent_env) or None,
                                  "max_memory": self._max_memory()}
        from . import Sandbox

        body = Sandbox(None, **{k: v for k, v in policy.items() if v is not None})._create_body()
        client = self._client
        self._box = await asyncio.to_thread(
            lambda: client.create(**body, image=image, labels={"harbor-session": self.session_id}))
        try:
            if workdir := self.task_env_config.workdir:
                await self.exec(f"mkdir -p '{workdir}'", cwd="/")
            await self.ensure_dirs(self._mount_targets(writable_only=True))
            await self._upload_environment_dir_after_start()
        except BaseException:
            await self.stop(delete=True)
            raise

    async def stop(self, delete: bool) -> None:
        box, self._box = self._box, None
        if box is None:
            return
        try:
            await asyncio.to_thread(box.delete)
        except ServerError as e:
            if e.code != "SANDBOX_NOT_FOUND":
                raise

    def _require(self) -> RemoteSandbox:
        if self._box is None:
            raise RuntimeError("the lockbox environment is not started (call start() first)")
        return self._box

    # -- exec -----------------------------------------------------------------------------

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        box = self._require()
        user = self._resolve_user(user)
        if user is not None and str(user) not in ("root", "0"):
            self.logger.debug(f"lockbox runs every command as the sandbox's one user; ignoring user={user!r}")
        env = self._merge_env(env)
        proc: Process = await asyncio.to_thread(
            box.start_process, ["bash", "-c", command], cwd=cwd or self.task_env_config.workdir,
            env=env or None)
        out: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
        done = threading.Event()

        def collect() -> None:
            for ev in proc.follow():
                if ev.event in out:
                    out[ev.event].append(ev.bytes)
                elif ev.event == "pty":
                    out["stdout"].append(ev.bytes)
            done.set()

        try:
            await asyncio.wait_for(asyncio.to_thread(collect), timeout=timeout_sec or None)
        except (TimeoutError, asyncio.CancelledError) as e:
            # The command's whole tree goes, whether Harbor's timeout or ours ended the call.
            await asyncio.shield(asyncio.to_thread(self._kill, proc))
            if isinstance(e, TimeoutError):
                raise RuntimeError(f"Command timed out after {timeout_sec} seconds") from None
            raise
        info = await asyncio.to_thread(proc.info)
        code = info.get("exit_code")
        if code is None and info.get("signal") is not None:
            code = 128 + int(info["signal"])
        return ExecResult(
            stdout=b"".join(out["stdout"]).decode("utf-8", "replace"),
            stderr=b"".join(out["stderr"]).decode("utf-8", "replace"),
            return_code=int(code) if code is not None else -1,
        )

    @staticmethod
    def _kill(proc: Process) -> None:
        try:
            proc.kill(grace=1.0)
        except ServerError:
            pass  # it ended on its own meanwhile

    # -- files ----------------------------------------------------------------------------

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        box = self._require()
        source = Path(source_path)
        data = await asyncio.to_thread(source.read_bytes)
        mode = stat.S_IMODE(source.stat().st_mode)
        await asyncio.to_thread(box.files.write, target_path, data, mode=mode)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        box = self._require()
        source = Path(source_dir)

        def upload() -> None:
            self._mkdirs(box, target_dir)
            for root, dirs, files in os.walk(source):
                base = PurePosixPath(target_dir) / Path(root).relative_to(source).as_posix()
                for d in dirs:
                    self._mkdirs(box, str(base / d))
                for f in files:
                    host = Path(root) / f
                    if not host.is_file():
                        continue  # a dangling symlink, a socket: nothing to copy
                    box.files.write(str(base / f), host.read_bytes(), mode=stat.S_IMODE(host.stat().st_mode))

        await asyncio.to_thread(upload)

    @classmethod
    def _mkdirs(cls, box: RemoteSandbox, path: str) -> None:
        if not cls._exists(box, path):
            box.files.mkdir(path, parents=True)

    @staticmethod
    def _exists(box: RemoteSandbox, path: str) -> bool:
        try:
            box.files.stat(path)
        except ServerError as e:
            if e.status == 404:
                return False
            raise
        return True

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        box = self._require()
        data = await asyncio.to_thread(box.files.read, source_path)
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        """Copies the sandbox's directory tree: files (with their modes) and directories;
        symlinks and special files are left out."""
        box = self._require()
        target = Path(target_dir)

        def download() -> None:
            root = PurePosixPath(box.files.stat(source_dir)["path"])
            target.mkdir(parents=True, exist_ok=True)
            for entry in box.files.list(str(root), recursive=True, hidden=True):
                rel = PurePosixPath(entry["path"]).relative_to(root)
                dest = target / rel.as_posix()
                if entry["kind"] == "dir":
                    dest.mkdir(parents=True, exist_ok=True)
                elif entry["kind"] == "file":
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_bytes(box.files.read(entry["path"]))
                    dest.chmod(int(entry["mode"], 8) & 0o777)

        await asyncio.to_thread(download)

"""The daemon in dra mode: the prepared claims, the health hub, the two sockets and their watch.

Start order: the checkpoint is read, the CDI specs on disk are made to match it, then the DRA socket
is served and last the registration socket, which the kubelet's plugin watcher finds. Nothing before
the sockets waits for the API server: publishing the ResourceSlice and asking the API server which
prepared claims are gone happen after, in the background, and are retried until the API server
answers (an API server that is away would otherwise keep the sockets closed for a request timeout per
prepared claim, and the kubelet could prepare nothing, not even the claims already prepared).

If either socket disappears (someone cleaned the kubelet's directories), it is served again; a new
registration socket makes the kubelet register the plugin again. A kubelet restart leaves the sockets
in place and asks GetInfo again by itself."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
from typing import Any, Awaitable, Callable, Optional

from gpu_device_plugin import hostdriver, registration
from gpu_device_plugin.config import Config
from gpu_device_plugin.dra import cdi, plugin
from gpu_device_plugin.dra.checkpoint import Checkpoint
from gpu_device_plugin.dra.claims import ClaimPreparer
from gpu_device_plugin.dra.devicehealth import DeviceHealthHub
from gpu_device_plugin.dra.devices import ClaimReader, DraDevice, SlicePublisher, by_name, dra_devices
from gpu_device_plugin.dra.names import DeviceNumbers
from gpu_device_plugin.dra.timeslice import TimeSlicer
from gpu_device_plugin.state import DeviceState
from gpu_device_plugin.unix_server import ServeError, UnixServer

log = logging.getLogger(__name__)

# How often the node's ResourceSlices are compared with the server's and written again where they
# differ: the kubelet deletes a driver's slices when it starts or the plugin goes, and a publish that
# failed (API server away) is retried by the same call.
SLICE_RECONCILE_SECONDS = 10.0
# The first wait before asking the API server again about the prepared claims (doubled up to 30 s).
CLAIM_RECONCILE_RETRY_SECONDS = 1.0
CLAIM_RECONCILE_RETRY_MAX_SECONDS = 30.0

# What the daemon is given to reach the API server: (claim reader, slice publisher) for a configuration.
ApiSide = Callable[[Config], "tuple[ClaimReader, SlicePublisher]"]


def default_api_side(config: Config) -> tuple[ClaimReader, SlicePublisher]:
    """The API server client (a kubeconfig, or in-cluster credentials when none is set) and the
    ResourceSlice publisher of this node. The client library is imported here, so device-plugin mode
    never loads it."""
    kubeapi: Any = importlib.import_module("gpu_device_plugin.dra.kubeapi")
    slices: Any = importlib.import_module("gpu_device_plugin.dra.slices")
    client = kubeapi.KubeApi(config.kubeconfig or None)
    return client, slices.ResourceSlices(client, config.node_name, config.driver_name)


class DraNode:
    def __init__(self, config: Config, state: DeviceState, api_side: ApiSide) -> None:
        self.config = config
        self.state = state
        self.api_side = api_side
        self.reader: Optional[ClaimReader] = None
        self.publisher: Optional[SlicePublisher] = None
        needs_host = "mounts" in config.device_list_strategy
        self.writer = cdi.SpecWriter(
            config.cdi_dir,
            config.mounts,
            config.device_list_strategy,
            hostdriver.find(config.mounts) if needs_host else None,
        )
        self.numbers = DeviceNumbers(config.dra_plugin_dir)
        self.preparer = ClaimPreparer(
            config.driver_name,
            config.node_name,
            Checkpoint(config.dra_plugin_dir),
            self.writer,
            self._devices,
            TimeSlicer(config.nvidia_smi, config.mounts),
        )
        self.hub: Optional[DeviceHealthHub] = None
        self.registrar = plugin.RegistrationServicer(config.driver_name, config.dra_socket)
        self.dra_server: Optional[UnixServer] = None
        self.reg_server: Optional[UnixServer] = None
        self._health: list[plugin.HealthServicer] = []
        self._watchers: list[registration.KubeletWatcher] = []
        self._kick = asyncio.Event()
        self._task: Optional[asyncio.Task[None]] = None
        self._reconcile_task: Optional[asyncio.Task[None]] = None
        self._claims_task: Optional[asyncio.Task[None]] = None
        self.claims_reconciled = False

    def _device_list(self) -> list[DraDevice]:
        inventory = self.state.inventory
        return dra_devices(inventory, self.numbers.numbers(inventory))

    def _devices(self) -> dict[str, DraDevice]:
        return by_name(self._device_list())

    async def start(self) -> bool:
        """False when the node cannot serve (the reason is logged)."""
        loop = asyncio.get_running_loop()
        try:
            os.makedirs(self.config.dra_plugin_dir, exist_ok=True)
        except OSError as exc:
            log.error("cannot create the DRA plugin directory %s: %s", self.config.dra_plugin_dir, exc.strerror or exc)
            return False
        try:
            self.reader, self.publisher = self.api_side(self.config)
        except ImportError as exc:
            log.error("dra mode needs the API server client, which cannot be loaded: %s", exc)
            return False
        except (OSError, ValueError) as exc:
            log.error("dra mode cannot reach the API server: %s", exc)
            return False
        # Before any device is named: the claims' devices bind the numbers in their names.
        self.preparer.load(by_name(dra_devices(self.state.inventory)))
        self.numbers.load(self.preparer.held())
        self.preparer.restore_specs()
        self.hub = DeviceHealthHub(self.state, self.config.node_name, self.publisher, self._device_list)
        self.hub.start()  # its publisher task publishes the slice, and retries while the API server is away
        self._health = plugin.health_servicers(self.hub)
        service = plugin.ClaimService(self.preparer, lambda: self.reader)
        self.dra_server = plugin.dra_server(self.config.dra_socket, service, self._health)
        self.reg_server = plugin.registration_server(self.config.registration_socket, self.registrar)
        try:
            for directory in (self.config.dra_plugin_dir, self.config.plugin_registry_dir):
                watcher = registration.KubeletWatcher(directory, self._on_dir_event)
                watcher.start(loop)
                self._watchers.append(watcher)
            await self.dra_server.start()
            await self.reg_server.start()
        except (ServeError, OSError) as exc:
            log.error(str(exc))
            await self.stop()
            return False
        self._task = asyncio.ensure_future(self._keep_serving())
        self._reconcile_task = asyncio.ensure_future(self._reconcile_slices())
        self._claims_task = asyncio.ensure_future(self._reconcile_claims(service))
        return True

    async def _reconcile_claims(self, service: plugin.ClaimService) -> None:
        """Unprepare the prepared claims the API server no longer has; ask again later about those it
        could not be asked about. The reads run beside the kubelet's calls; only the unprepare of a gone
        claim takes the servicer's lock."""
        loop = asyncio.get_running_loop()
        pending = sorted(self.preparer.claims)
        delay = CLAIM_RECONCILE_RETRY_SECONDS
        while pending:
            reader = self.reader
            assert reader is not None
            try:
                gone, pending = await loop.run_in_executor(None, self.preparer.gone_from_api_server, reader, pending)
                if gone:
                    async with service.lock:
                        await loop.run_in_executor(None, self.preparer.drop, gone)
            except Exception:  # a bug must not end the reconcile for good, nor the daemon
                log.exception("reconciling the prepared claims with the API server failed; retrying")
            if pending:
                await asyncio.sleep(delay)
                delay = min(2 * delay, CLAIM_RECONCILE_RETRY_MAX_SECONDS)
        self.claims_reconciled = True
        log.info("prepared claims reconciled with the API server", extra={"claims": len(self.preparer.claims)})

    async def _reconcile_slices(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(SLICE_RECONCILE_SECONDS)
            publisher = self.publisher
            if publisher is None:
                continue
            try:
                if await loop.run_in_executor(None, publisher.reconcile):
                    log.info("wrote the node's ResourceSlices again (they differed from what the server had)")
            except OSError as exc:
                log.warning("cannot reconcile the node's ResourceSlices: %s", exc)

    def _on_dir_event(self, name: str, created: bool) -> None:
        ours = {os.path.basename(self.config.dra_socket), os.path.basename(self.config.registration_socket)}
        if name == "" or (not created and name in ours):
            self._kick.set()

    async def _keep_serving(self) -> None:
        while True:
            await self._kick.wait()
            self._kick.clear()
            # The DRA socket first: a new registration socket makes the kubelet dial it at once.
            for server in (self.dra_server, self.reg_server):
                if server is None or server.socket_is_ours():
                    continue
                log.info("our socket was removed; serving it again", extra={"socket": server.socket_path})
                try:
                    await server.restart()
                except ServeError as exc:
                    log.error("%s; retrying in 1 s", exc)
                    asyncio.get_running_loop().call_later(1.0, self._kick.set)

    def serving(self) -> bool:
        return all(s is not None and s.socket_is_ours() for s in (self.dra_server, self.reg_server))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._reconcile_task is not None:
            self._reconcile_task.cancel()
        if self._claims_task is not None:
            self._claims_task.cancel()
        for watcher in self._watchers:
            watcher.stop()
        self._watchers.clear()
        # The registration socket first: the kubelet deregisters the plugin before the endpoint goes.
        for server in (self.reg_server, self.dra_server):
            if server is not None:
                await server.stop(remove_socket=True)
        if self.hub is not None:
            self.hub.stop()  # after the DRA server, which ended the health streams it serves

    # -- what the daemon asks of its allocation mode -------------------------------------------------
    def refuses(self, config: Config) -> Optional[str]:
        same = (config.allocation_mode, config.driver_name, config.node_name) == (
            self.config.allocation_mode,
            self.config.driver_name,
            self.config.node_name,
        )
        return None if same else "the allocation mode, driver name and node name change only with a restart"

    async def reload(
        self,
        config: Config,
        policy: Any,
        builder: Any,
        adopt_config: Callable[[Config], Awaitable[bool]],
    ) -> None:
        # The sockets, CDI directory and checkpoint stay; the health policy follows the file.
        self.state.tracker.policy = policy
        self.state.publish()
        log.info("SIGHUP: configuration reloaded (health policy)")

    def status(self) -> dict[str, Any]:
        hub = self.hub
        return {
            "allocation_mode": "dra",
            "registered": self.registrar.registered,
            "slice_published": hub is not None and hub.published,
            "prepared_claims": len(self.preparer.claims),
            "claims_reconciled": self.claims_reconciled,
        }

    def not_ready(self, status: dict[str, Any]) -> list[str]:
        reasons = []
        if status["registered"] is not True:
            reasons.append("the kubelet has not accepted the DRA plugin's registration yet")
        if not status["slice_published"]:
            reasons.append("the ResourceSlice has not been published yet")
        return reasons

# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""setup() configuration: defaults, MOONCAKE_* variables, config files, protocol names."""

from __future__ import annotations

import json
import logging
import operator
import os
import socket
import threading
import warnings
from collections.abc import Mapping

import larder

_log = logging.getLogger("larder.compat.mooncake")


_warned_protocols: set[str] = set()
_warn_lock = threading.Lock()

# Mooncake protocol names that name only the network between hosts. Larder keeps the processes of
# one host on shm whatever the network is, as it was built to (no hairpin through the NIC).
_MOONCAKE_NETWORK = {"tcp": "local,shm,tcp"}


def _once(key: str, message: str, warn: bool) -> None:
    with _warn_lock:
        first = key not in _warned_protocols
        _warned_protocols.add(key)
    if not first:
        return
    if warn:
        warnings.warn(message, RuntimeWarning, stacklevel=4)
        _log.warning(message)
    else:
        _log.info(message)


def map_protocol(protocol: str | None, role: str = "store") -> str:
    """The Larder protocol for a Mooncake protocol name, for a store (``role="store"``) or a
    transfer engine (``"engine"``).

    Larder's own setting wins: with LARDER_STORE_PROTOCOL (store only) or LARDER_PROTOCOL set, the
    result is "" and the engine applies that variable. Otherwise "" stays "" (the engine's "auto");
    Mooncake's "tcp", which names the network only, becomes "local,shm,tcp": the processes of one
    host still reach each other over shm; other names Larder knows ("shm", "auto", "ucx", comma
    lists) pass through; any other name ("rdma", "nvlink", ...) becomes "auto", with a warning.
    What was done is logged once per name per process.
    """
    name = (protocol or "").strip().lower()
    if not name:
        return ""
    variables = ["LARDER_STORE_PROTOCOL", "LARDER_PROTOCOL"] if role == "store" else [
        "LARDER_PROTOCOL"]
    for variable in variables:
        forced = os.environ.get(variable, "").strip()
        if forced:
            _once(f"{role}:{name}:{variable}={forced}",
                  f"Mooncake protocol '{name}': {variable}={forced} applies (Larder's own setting "
                  "wins over a Mooncake config)", warn=False)
            return ""
    if name in _MOONCAKE_NETWORK:
        mapped = _MOONCAKE_NETWORK[name]
        _once(f"{role}:{name}",
              f"Mooncake protocol '{name}' names the network between hosts: Larder uses {name} "
              "there and keeps processes of one host on shm (routes " + mapped + "); set "
              f"LARDER_PROTOCOL={name} to force {name} everywhere", warn=False)
        return mapped
    try:
        larder.parse_protocol(name)
        return name
    except larder.InvalidArgumentError:
        pass
    _once(name, f"Larder has no '{name}' transport; using 'auto' (local memcpy, shm between "
          "processes of one host, tcp between hosts)", warn=True)
    return "auto"


_DEFAULTS = {
    "local_hostname": "127.0.0.1",
    "metadata_server": "P2PHANDSHAKE",
    "global_segment_size": 16 * 1024 * 1024,
    "local_buffer_size": 1024 * 1024 * 1024,
    "protocol": "tcp",
    "rdma_devices": "",
    "master_server_addr": "127.0.0.1:50051",
    "tenant_id": "default",
    "enable_client_http_server": False,
    "client_http_port": 9300,
    "enable_ssd_offload": False,
    "ssd_offload_path": "",
    # The disk tier's size (bytes or "N%"); empty: LARDER_DISK_CAPACITY, else half the disk.
    "ssd_offload_capacity": "",
    # Mooncake's master keeps an object in a KV lease this long (ms) after each put and read;
    # batch_replica_clear skips objects in theirs.
    "default_kv_lease_ttl": 5000,
}

# Spellings found in Mooncake, SGLang and LMCache configuration files, mapped to setup()'s names.
_CONFIG_KEYS = {
    "local_hostname": "local_hostname",
    "metadata_server": "metadata_server",
    "global_segment_size": "global_segment_size",
    "local_buffer_size": "local_buffer_size",
    "protocol": "protocol",
    "rdma_devices": "rdma_devices",
    "device_name": "rdma_devices",
    "master_server_addr": "master_server_addr",
    "master_server_address": "master_server_addr",
    "tenant_id": "tenant_id",
    "enable_client_http_server": "enable_client_http_server",
    "client_http_port": "client_http_port",
    "enable_ssd_offload": "enable_ssd_offload",
    "ssd_offload_path": "ssd_offload_path",
    "ssd_offload_capacity": "ssd_offload_capacity",
    "default_kv_lease_ttl": "default_kv_lease_ttl",
}

_ENV_KEYS = {
    "MOONCAKE_LOCAL_HOSTNAME": "local_hostname",
    "MOONCAKE_TE_META_DATA_SERVER": "metadata_server",
    "MOONCAKE_GLOBAL_SEGMENT_SIZE": "global_segment_size",
    "MOONCAKE_LOCAL_BUFFER_SIZE": "local_buffer_size",
    "MOONCAKE_PROTOCOL": "protocol",
    "MOONCAKE_DEVICE": "rdma_devices",
    "MOONCAKE_MASTER": "master_server_addr",
    "MOONCAKE_TENANT_ID": "tenant_id",
    "MOONCAKE_DEFAULT_KV_LEASE_TTL": "default_kv_lease_ttl",
    # Mooncake's offload settings: the disk tier's switch, directory and size.
    "MOONCAKE_ENABLE_OFFLOAD": "enable_ssd_offload",
    "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": "ssd_offload_path",
    "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES": "ssd_offload_capacity",
}


def _normalize(config: Mapping) -> dict:
    out = {}
    for key, value in config.items():
        name = _CONFIG_KEYS.get(key)
        if name is None:
            _log.debug("ignoring Mooncake config key %r", key)
        elif value is not None:
            out[name] = value
    return out


def load_config(overrides: Mapping | None = None) -> dict:
    """Resolves setup()'s arguments: ``overrides`` (non-None values), then the MOONCAKE_*
    environment variables, then the JSON file named by MOONCAKE_CONFIG_PATH, then Mooncake's
    defaults. Sizes come back as ints. Raises ValueError for an unreadable file or a bad size."""
    config = dict(_DEFAULTS)
    path = os.environ.get("MOONCAKE_CONFIG_PATH")
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                config.update(_normalize(json.load(f)))
        except (OSError, ValueError) as e:
            raise ValueError(f"MOONCAKE_CONFIG_PATH={path}: {e}") from e
    for variable, name in _ENV_KEYS.items():
        value = os.environ.get(variable)
        if value:
            config[name] = value
    if overrides:
        config.update(_normalize(overrides))
    for name in ("global_segment_size", "local_buffer_size"):
        try:
            config[name] = larder.parse_size(_trimmed(config[name]))
        except larder.LarderError as e:
            raise ValueError(f"{name}: {e}") from e
    for name in ("enable_client_http_server", "enable_ssd_offload"):
        config[name] = _flag(name, config[name])
    try:
        config["client_http_port"] = int(_trimmed(config["client_http_port"]))
    except (TypeError, ValueError) as e:
        raise ValueError(f"client_http_port: {e}") from e
    if not 0 <= config["client_http_port"] <= 65535:
        raise ValueError(f"client_http_port {config['client_http_port']} is not a port")
    try:
        config["default_kv_lease_ttl"] = int(_trimmed(config["default_kv_lease_ttl"]))
    except (TypeError, ValueError) as e:
        raise ValueError(f"default_kv_lease_ttl: {e}") from e
    if not 0 <= config["default_kv_lease_ttl"] <= 86_400_000:
        raise ValueError(f"default_kv_lease_ttl {config['default_kv_lease_ttl']} ms is outside "
                         "0..86400000")
    return config


def _trimmed(value):
    """Strings of the dict form are trimmed (" 9300 "), as Mooncake's setup(config) does."""
    return value.strip() if isinstance(value, str) else value


def _flag(name: str, value) -> bool:
    """A bool, or its text in the dict form ("true", " 1 ", "off")."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("", "0", "false", "no", "off", "none"):
        return False
    raise ValueError(f"{name}: '{value}' is not a boolean")


def _host_and_port(local_hostname: str) -> tuple[str, int]:
    """("host", port) from "host" or "host:port", the host as written (port 0 when absent).
    Raises ValueError for a port that is not a number in [0, 65535]."""
    host, port = local_hostname, 0
    if local_hostname.count(":") == 1:
        host, _, port_text = local_hostname.partition(":")
        port = int(port_text)
        if not 0 <= port <= 65535:
            raise ValueError(f"port {port} of '{local_hostname}' is not in [0, 65535]")
    return host, port


def _split_host(local_hostname: str) -> tuple[str, int]:
    """("ip", port) from "host", "host:port"; host names resolve to IPv4 addresses."""
    host, port = _host_and_port(local_hostname)
    return socket.gethostbyname(host), port


def _positive_int(value) -> bool:
    """True for an int (or an integer scalar such as numpy.uint64) above 0."""
    if isinstance(value, bool):
        return False
    try:
        return operator.index(value) > 0
    except TypeError:
        return False


_is_address = _positive_int
_is_size = _positive_int


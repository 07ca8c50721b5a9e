"""Reaching a cluster's Ray dashboard, where the Jobs API is: its address, whether anything listens there,
whether its nodes see this machine's files, and its refusals (no token, a wrong one) as one-line errors.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
from pathlib import Path
from urllib.parse import urlparse

from ..common import log
from ..common.compat import RAY_UPLOAD_LOGGERS
from ..common.environment import environment
from ..common.errors import UserError

logger = log.get("submit")
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
PACKAGING, WORKING_DIR = RAY_UPLOAD_LOGGERS
UPLOAD_CHATTER = {"ray.dashboard.modules.dashboard_sdk": logging.WARNING,
                  "ray.dashboard.modules.job.sdk": logging.WARNING,
                  PACKAGING: logging.WARNING,
                  WORKING_DIR: logging.ERROR}  # ".venv is now ignored by default"
TOKEN_HELP = ("set RAY_AUTH_MODE=token and put the cluster's token in RAY_AUTH_TOKEN, in a file named by "
              "RAY_AUTH_TOKEN_PATH, or in ~/.ray/auth_token (`ray get-auth-token` on the head node prints it)")


def cluster_address(address: str | None) -> str:
    """The dashboard URL: --address, else RAY_API_SERVER_ADDRESS or RAY_ADDRESS (as `ray job submit` reads them)."""
    address = address or os.environ.get("RAY_API_SERVER_ADDRESS") or os.environ.get("RAY_ADDRESS")
    if not address:
        raise UserError("no cluster address: pass --address http://HEAD:8265 (the Ray dashboard) or set RAY_ADDRESS")
    return address if "://" in address else f"http://{address}"


def cluster_is_remote(address: str) -> bool | None:
    """Whether the cluster's nodes run where this machine's files are not: none of their Ray sessions is here.

    Every node reports its raylet's socket, a file in its session directory; if this machine sees
    that socket, it shares the node's filesystem (the same machine, or a shared mount). None when the
    dashboard does not say (an older Ray, a proxy that hides the endpoint).
    """
    try:
        response = client(address)._do_request("GET", "/nodes?view=summary", timeout=30)  # with the client's auth
        nodes = response.json()["data"]["summary"]
        sockets = [n["raylet"]["rayletSocketName"] for n in nodes if n.get("raylet", {}).get("state") == "ALIVE"]
    except (AttributeError, KeyError, TypeError, ValueError, OSError) as err:
        logger.debug(f"cannot ask {address} for its nodes: {err}")
        return None
    if not sockets:
        return None
    return not all(_is_socket(path) for path in sockets)


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def client(address: str):
    """A Jobs API client for the dashboard at address (Ray's upload notices quiet unless -v)."""
    from ray.job_submission import JobSubmissionClient

    if not log.verbose():  # Ray's upload notices (package names, skipped .gitignore files, "WebSocket closed")
        for name, level in UPLOAD_CHATTER.items():
            logging.getLogger(name).setLevel(level)  # after the import: Ray's modules set INFO when imported

    # Ray lets RAY_API_SERVER_ADDRESS / RAY_ADDRESS override an explicit address; here --address wins.
    with environment(RAY_API_SERVER_ADDRESS=address):
        return JobSubmissionClient(address)


def check_listening(address: str, timeout_s: float = 10.0) -> None:
    """Fail in seconds, not minutes, when nothing listens at the address."""
    url = urlparse(address)
    if url.scheme not in ("http", "https") or not url.hostname:
        return  # ray:// and other schemes are Ray's to resolve
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout_s).close()
    except OSError as err:
        raise UserError(f"nothing answers at {address} ({err.strerror or err}): start the cluster, or fix the "
                        f"address: it is the Ray dashboard's, usually http://HEAD:8265 (KubeRay: kubectl "
                        f"port-forward svc/CLUSTER-head-svc 8265:8265)") from None


@contextlib.contextmanager
def cluster_errors(address: str):
    """The cluster's refusals as one-line UserErrors: no token, a wrong token, no Jobs API."""
    from ray.exceptions import AuthenticationError

    try:
        yield
    except AuthenticationError as err:
        raise UserError(_auth_message(address, str(err))) from None
    except ConnectionError as err:
        raise UserError(f"cannot reach the Ray Jobs API at {address} ({str(err).splitlines()[0]}); "
                        f"is it the dashboard address (usually port 8265)?") from None
    except RuntimeError as err:
        raise UserError(f"the cluster at {address} refused the job: {str(err).splitlines()[0][:300]}") from None


def _auth_message(address: str, error: str) -> str:
    """Which token is missing or wrong, and where Ray's clients look for one."""
    source = _token_source()
    mode = os.environ.get("RAY_AUTH_MODE", "")
    if error.startswith("Authentication failed"):  # 403: a token was sent and refused
        return (f"the cluster at {address} refused the auth token from {source}: it is not this cluster's token; "
                f"{TOKEN_HELP}")
    if mode.lower() != "token" and source:
        return (f"the cluster at {address} requires a Ray auth token and none was sent: there is one in {source}, "
                f"but Ray's clients send it only with RAY_AUTH_MODE=token; set RAY_AUTH_MODE=token")
    return f"the cluster at {address} requires a Ray auth token and none was found: {TOKEN_HELP}"


def _token_source() -> str:
    """Where Ray's token loader finds a token, in its order of precedence, or ""."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if path:
        return f"RAY_AUTH_TOKEN_PATH={path}" if Path(path).is_file() else ""
    default = Path.home() / ".ray" / "auth_token"
    return str(default) if default.is_file() else ""

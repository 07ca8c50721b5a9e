"""`nmt serve`: the service deployed on a local (or RAY_ADDRESS) Ray instance until Ctrl-C or SIGTERM."""

import os
import time

from ray import serve

from ..common import log
from ..common.errors import UserError
from ..config import Config
from ..track.registry import champion_uri
from ..track.target import connect
from .app import bind, resolve_model

APP_NAME = "nmt"
logger = log.get("serve")


def _check_port_free(host: str, port: int) -> None:
    """Fail before starting Ray when the port is taken: Serve's proxy would only log the failure and retry."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        try:
            sock.bind((host, port))
        except OSError as err:
            raise UserError(f"cannot listen on {host}:{port} ({err.strerror}); choose another with --port, "
                            f"or --host") from None


def run(cfg: Config, address: str | None = None) -> int:
    """`nmt serve`: deploy on Ray, print the URL, block until Ctrl-C or SIGTERM, then shut Serve down."""
    import signal

    from ..common.cluster import ensure_ray

    s = cfg.serve
    target = connect(cfg.tracking.tracking_uri)
    asked = s.model_uri or champion_uri(cfg.tracking.registered_model)
    model_uri, version = resolve_model(target.uri, asked)  # fails fast, before Ray starts, when it is missing
    app = bind(s, target, model_uri, version)
    if address == "local" or not (address or os.environ.get("RAY_ADDRESS")):  # Serve's proxy will run here
        _check_port_free(s.host, s.port)
    ensure_ray(address)

    def _stop(signum, frame):
        raise KeyboardInterrupt

    # Both signals stop the service, whatever this process inherited: a shell's background job
    # starts with SIGINT ignored, and Python then never raises KeyboardInterrupt on Ctrl-C.
    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        # Serve's own end-to-end timeout is the backstop for requests still queued at the proxy.
        serve.start(http_options={"host": s.host, "port": s.port, "request_timeout_s": s.request_timeout_s + 5})
        try:
            serve.run(app, name=APP_NAME, route_prefix="/")
        except RuntimeError as err:
            raise UserError(f"the translation service did not start: {str(err).splitlines()[0][:300]}") from None
        host = f"[{s.host}]" if ":" in s.host else s.host
        print(f"serving {asked} (version {version}) at http://{host}:{s.port}  "
              f"(POST /translate, GET /healthz); Ctrl-C stops", flush=True)
        if s.host not in ("127.0.0.1", "localhost", "::1"):
            logger.warning(f"listening on {s.host}: anyone who can reach this port can use the service")
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        logger.info("shutting down")
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        serve.shutdown()
        import ray

        ray.shutdown()

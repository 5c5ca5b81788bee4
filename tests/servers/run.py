"""Serve ``tests.servers.apps:<app>`` with a server that has no command of its own.

``python -m tests.servers.run werkzeug|wsgiref <app> <port>``
"""

from __future__ import annotations

import sys

from tests.servers import apps


def main(server: str, app_name: str, port: int) -> None:
    app = getattr(apps, app_name)
    if server == "werkzeug":
        from werkzeug.serving import run_simple

        run_simple("127.0.0.1", port, app, threaded=True)
    elif server == "wsgiref":
        from wsgiref.simple_server import WSGIRequestHandler, make_server

        class Quiet(WSGIRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

        make_server("127.0.0.1", port, app, handler_class=Quiet).serve_forever()
    else:
        raise SystemExit(f"unknown server {server!r}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))

"""moto's server, one request at a time.

moto's backends are not safe for concurrent requests: a DynamoDB transaction copies the tables and
restores the copy when a condition fails, undoing writes that other threads made meanwhile (seen
here: max_total 10 ended with 13 reservations). Real DynamoDB and LocalStack serialize per item;
this wrapper gives the emulator the same atomicity by holding one lock around each request.

usage: python moto_serial.py HOST PORT
"""

import os
import sys
import threading

from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from moto.server import MotoRequestHandler


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    os.environ.setdefault("MOTO_PORT", str(port))
    app = DomainDispatcherApplication(create_backend_app)
    lock = threading.Lock()

    def serialized(environ, start_response):
        with lock:
            # Drain the response inside the lock: moto builds it lazily.
            return list(app(environ, start_response))

    run_simple(host, port, serialized, threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()

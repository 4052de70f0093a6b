"""moto's server, one request at a time.

moto's backends are not safe for concurrent requests: a DynamoDB transaction copies the tables and
restores the copy when a condition fails, undoing writes that other threads made meanwhile (seen
here: max_total 10 ended with 13 reservations). Real DynamoDB and LocalStack serialize per item;
this wrapper gives the emulator the same atomicity by holding one lock around each request.

It also honours DynamoDB's ClientRequestToken on TransactWriteItems, which moto ignores: DynamoDB
answers a repeated token (within 10 minutes, with the same parameters) with the first call's
success and changes nothing. The AWS SDK retries a transaction whose answer was lost (a reset
connection) with the same token, so without this the retry of a transaction that was applied
fails its own conditions, and the emulator reports a conflict that DynamoDB would not (found by
the fault runs: a release answered "already released", a launched task given up).

usage: python moto_serial.py HOST PORT
"""

import io
import json
import os
import sys
import threading
import time

from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from moto.server import MotoRequestHandler


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    os.environ.setdefault("MOTO_PORT", str(port))
    app = DomainDispatcherApplication(create_backend_app)
    lock = threading.Lock()
    done = {}  # ClientRequestToken -> (when, request body, status, headers, body) of a success
    window = 600.0

    def serialized(environ, start_response):
        with lock:
            token, body = None, None
            if environ.get("HTTP_X_AMZ_TARGET", "").endswith(".TransactWriteItems"):
                length = int(environ.get("CONTENT_LENGTH") or 0)
                body = environ["wsgi.input"].read(length)
                environ["wsgi.input"] = io.BytesIO(body)
                try:
                    token = json.loads(body).get("ClientRequestToken")
                except ValueError:
                    token = None
            now = time.monotonic()
            for k in [k for k, v in done.items() if now - v[0] > window]:
                del done[k]
            hit = done.get(token) if token else None
            if hit and hit[1] == body:
                start_response(hit[2], hit[3])
                return [hit[4]]
            captured = {}

            def capture(status, headers, exc_info=None):
                captured["status"], captured["headers"] = status, headers
                return start_response(status, headers, exc_info)

            # Drain the response inside the lock: moto builds it lazily.
            out = list(app(environ, capture))
            if token and captured.get("status", "").startswith("200"):
                done[token] = (now, body, captured["status"], captured["headers"], b"".join(out))
            return out

    run_simple(host, port, serialized, threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()

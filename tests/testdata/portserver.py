"""A program behind a sandbox port for tests/ports_test.go (python3 stdlib).

GET /hello: a fixed text; POST /echo: the body back; GET /events: an SSE
stream whose second event waits until the file named by ?gate= exists;
anything else: the server's own 404. Listens on 127.0.0.1:$PORT.
"""
import http.server
import os
import sys
import time
import urllib.parse


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _send(self, status, body, ctype="text/plain"):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        u = urllib.parse.urlparse(self.path)
        if u.path == "/hello":
            self._send(200, b"hello from the sandbox, auth=" + self.headers.get("Authorization", "").encode())
        elif u.path == "/events":
            gate = urllib.parse.parse_qs(u.query)["gate"][0]
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def chunk(b):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(b), b))
                self.wfile.flush()

            chunk(b"data: first\n\n")
            deadline = time.time() + 60
            while not os.path.exists(gate) and time.time() < deadline:
                time.sleep(0.02)
            chunk(b"data: second\n\n")
            self.wfile.write(b"0\r\n\r\n")
        else:
            self._send(404, b"no such page: " + u.path.encode())

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(n)
        self._send(201, b"echo:" + body, self.headers.get("Content-Type", "text/plain"))


if __name__ == "__main__":
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler)
    print("listening", flush=True)
    sys.stdout.flush()
    srv.serve_forever()

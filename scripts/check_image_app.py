"""The app behind the containerized gate in scripts/check-image.sh.

Listens on 127.0.0.1 (a free port, written to PORT_FILE once listening),
answers every request 200 with a small JSON body, and appends one JSON line
per request to LOG_FILE: method, path, the Hookgate-* headers it got and the
body's hex. Stops after 120 s in any case.

Usage: python3 scripts/check_image_app.py PORT_FILE LOG_FILE
"""

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Recorder(BaseHTTPRequestHandler):
    def _serve(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        record = {
            "method": self.command,
            "path": self.path,
            "hookgate": {k.lower(): v for k, v in self.headers.items() if k.lower().startswith("hookgate-")},
            "body": body.hex(),
        }
        with open(self.server.log_file, "a", encoding="utf-8") as log:
            log.write(json.dumps(record) + "\n")
        answer = b'{"received":true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    do_POST = _serve
    do_GET = _serve

    def log_message(self, *args):
        pass


def main():
    port_file, log_file = sys.argv[1], sys.argv[2]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.log_file = log_file
    open(log_file, "w", encoding="utf-8").close()
    timer = threading.Timer(120, server.shutdown)
    timer.daemon = True
    timer.start()
    with open(port_file + ".tmp", "w", encoding="utf-8") as f:
        f.write(str(server.server_address[1]))
    os.replace(port_file + ".tmp", port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()

"""Just enough of a Kubernetes API server for `kubectl create --dry-run=client`
(run by tests/it_device_plugin.sh): kubectl maps a manifest's kind to a resource through the
server's discovery documents even for a client-side dry run, and sends nothing else. This
serves the discovery of the core group (v1) and apps/v1 (daemonsets) on 127.0.0.1, prints
the port on stdout, and answers 404 to anything else. It never accepts an object.

    fake_apiserver.py      # prints PORT, serves until killed
"""
import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

DOCS = {
    "/api": {"kind": "APIVersions", "versions": ["v1"],
             "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                             "serverAddress": "127.0.0.1"}]},
    "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
        {"name": "apps", "versions": [{"groupVersion": "apps/v1", "version": "v1"}],
         "preferredVersion": {"groupVersion": "apps/v1", "version": "v1"}}]},
    "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
        {"name": "namespaces", "singularName": "namespace", "namespaced": False,
         "kind": "Namespace", "verbs": ["create", "get", "list"]}]},
    "/apis/apps/v1": {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "apps/v1",
                      "resources": [{"name": "daemonsets", "singularName": "daemonset",
                                     "namespaced": True, "kind": "DaemonSet",
                                     "verbs": ["create", "get", "list"],
                                     "shortNames": ["ds"]}]},
}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        doc = DOCS.get(self.path.split("?")[0])
        body = json.dumps(doc if doc else {"kind": "Status", "status": "Failure",
                                           "code": 404}).encode()
        self.send_response(200 if doc else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


server = HTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
sys.stdout.close()
server.serve_forever()

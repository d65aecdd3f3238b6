"""A fake kubelet for rk device-plugin's tests (Debian's python3-grpcio).

It does what the kubelet's device manager does with a device plugin, over the real gRPC API:
serves Registration on DIR/kubelet.sock, and during a Register connects back to the plugin's
endpoint and asks GetDevicePluginOptions before it answers (as the kubelet does), then consumes
ListAndWatch (every update kept with the monotonic time it arrived), and calls GetPreferredAllocation and Allocate on request. The
Python stubs are generated at test time by grpc_tools.protoc from the same vendored api.proto
that the plugin's C messages come from (third_party/deviceplugin/v1beta1/api.proto).

    pb, pbg = load_stubs(proto_path, tmpdir)
    k = FakeKubelet(pb, pbg, plugin_dir); k.start()
    reg = k.wait_registration(1, timeout=10)
    t, health = k.wait_health(lambda h: h.get("1") == "Unhealthy", timeout=5)
    k.stop()
"""
import os
import subprocess
import sys
import threading
import time
from concurrent import futures

import grpc


def load_stubs(proto_path, out_dir):
    """Generate api_pb2 and api_pb2_grpc from proto_path into out_dir and import them."""
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", os.path.dirname(proto_path),
                    "--python_out", out_dir, "--grpc_python_out", out_dir,
                    os.path.basename(proto_path)], check=True)
    sys.path.insert(0, out_dir)
    import api_pb2  # noqa: E402  (generated just now)
    import api_pb2_grpc  # noqa: E402
    return api_pb2, api_pb2_grpc


FAILS = [0]  # checks failed so far, for the checkers' exit status (check, failed)


def check(cond, msg):
    """One TAP-like line, "ok - MSG" or "FAIL - MSG" (it_count counts them); cond back."""
    print(("ok - " if cond else "FAIL - ") + msg, flush=True)
    if not cond:
        FAILS[0] += 1
    return cond


def failed():
    return FAILS[0]


class FakeKubelet:
    def __init__(self, pb, pbg, plugin_dir):
        self.pb, self.pbg, self.dir = pb, pbg, plugin_dir
        self.registrations = []  # (monotonic time, RegisterRequest)
        self.updates = []  # (monotonic time, {id: health}, [Device])
        self.options = None
        self.errors = []
        self.watch_ended = None  # the monotonic time the ListAndWatch stream ended, None open
        self.cond = threading.Condition()
        self.server = None
        self.channel = None
        self.stub = None

    # ---- Registration (the kubelet's side) ----
    def start(self):
        kubelet = self

        class Registration(self.pbg.RegistrationServicer):
            def Register(self, request, context):
                with kubelet.cond:
                    kubelet.registrations.append((time.monotonic(), request))
                    kubelet.cond.notify_all()
                # as the kubelet's device manager does: connect back and ask the plugin's
                # options before answering (a plugin that blocks on its Register call never
                # answers), then consume ListAndWatch in the background
                try:
                    kubelet._connect(request.endpoint)
                except grpc.RpcError as e:
                    context.abort(grpc.StatusCode.UNAVAILABLE,
                                  "cannot reach the plugin: %s" % e.code())
                threading.Thread(target=kubelet._watch, daemon=True).start()
                return kubelet.pb.Empty()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.pbg.add_RegistrationServicer_to_server(Registration(), self.server)
        self.server.add_insecure_port("unix:" + os.path.join(self.dir, "kubelet.sock"))
        self.server.start()

    def stop(self):
        if self.channel:
            self.channel.close()
            self.channel = None
        if self.server:
            self.server.stop(0).wait()
            self.server = None

    # ---- the plugin (the device manager's client side) ----
    def _connect(self, endpoint):
        self.channel = grpc.insecure_channel("unix:" + os.path.join(self.dir, endpoint))
        self.stub = self.pbg.DevicePluginStub(self.channel)
        self.options = self.stub.GetDevicePluginOptions(self.pb.Empty(), timeout=5)

    def _watch(self):
        try:
            for resp in self.stub.ListAndWatch(self.pb.Empty()):
                with self.cond:
                    self.updates.append((time.monotonic(),
                                         {d.ID: d.health for d in resp.devices},
                                         list(resp.devices)))
                    self.cond.notify_all()
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                with self.cond:
                    self.errors.append("ListAndWatch: %s %s" % (e.code(), e.details()))
                    self.cond.notify_all()
        except Exception as e:  # a checker must see it, not a silent thread
            with self.cond:
                self.errors.append("ListAndWatch: %r" % e)
                self.cond.notify_all()
        finally:
            with self.cond:
                self.watch_ended = time.monotonic()
                self.cond.notify_all()

    def wait_registration(self, n, timeout):
        """The n-th RegisterRequest (1-based) as (time, request), or None after timeout s."""
        end = time.monotonic() + timeout
        with self.cond:
            while len(self.registrations) < n:
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)
            return self.registrations[n - 1]

    def wait_health(self, pred, timeout, since=0):
        """The first ListAndWatch update from index `since` on whose {id: health} satisfies
        pred, as (time, health, index); None after timeout s."""
        end = time.monotonic() + timeout
        with self.cond:
            i = since
            while True:
                while i < len(self.updates):
                    t, h, _ = self.updates[i]
                    if pred(h):
                        return t, h, i
                    i += 1
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)

    def allocate(self, *containers):
        req = self.pb.AllocateRequest(container_requests=[
            self.pb.ContainerAllocateRequest(devices_ids=list(c)) for c in containers])
        return self.stub.Allocate(req, timeout=5)

    def preferred(self, available, must, size):
        req = self.pb.PreferredAllocationRequest(container_requests=[
            self.pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=list(available), must_include_deviceIDs=list(must),
                allocation_size=size)])
        return list(self.stub.GetPreferredAllocation(req, timeout=5)
                    .container_responses[0].deviceIDs)

    def raw(self, method, payload):
        """Call a DevicePlugin method with raw bytes (a malformed request)."""
        call = self.channel.unary_unary("/v1beta1.DevicePlugin/" + method,
                                        request_serializer=None, response_deserializer=None)
        return call(payload, timeout=5)

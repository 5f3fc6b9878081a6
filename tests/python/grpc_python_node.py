"""A device plugin and a pod-resources client written with grpc-python (C-core), as the
Python gRPC e2e in tests/tests/kubelet_devices.rs runs them against the agent.

usage: grpc_python_node.py STUBS PLUGIN_DIR POD_RESOURCES_SOCKET RESOURCE

STUBS holds the modules grpc_tools.protoc generated from cri-proto/proto (deviceplugin/v1beta1,
podresources/v1, podresources/v1alpha1). The plugin serves two healthy devices on
PLUGIN_DIR/py.sock and registers on PLUGIN_DIR/kubelet.sock; the agent then dials it (its
client against a server that is not Go). Each client call runs twice: with the authority the
installed grpcio chooses for a unix socket (the percent-encoded path since grpcio 1.57) and
with the socket path itself (what grpc-java and grpc-dotnet send). Prints one line per step;
exits non-zero on the first failure.
"""

import os
import sys
import time
from concurrent import futures

stubs, plugin_dir, pod_resources_sock, resource = sys.argv[1:5]
sys.path.insert(0, stubs)

import grpc  # noqa: E402
from deviceplugin.v1beta1 import api_pb2 as dp, api_pb2_grpc as dp_grpc  # noqa: E402
from podresources.v1 import api_pb2 as pr, api_pb2_grpc as pr_grpc  # noqa: E402
from podresources.v1alpha1 import api_pb2 as pra, api_pb2_grpc as pra_grpc  # noqa: E402

DEVICES = ["py-1", "py-2"]


class Plugin(dp_grpc.DevicePluginServicer):
    def GetDevicePluginOptions(self, request, context):
        return dp.DevicePluginOptions()

    def ListAndWatch(self, request, context):
        yield dp.ListAndWatchResponse(
            devices=[dp.Device(ID=d, health="Healthy") for d in DEVICES]
        )
        while context.is_active():
            time.sleep(0.2)

    def Allocate(self, request, context):
        return dp.AllocateResponse(
            container_responses=[dp.ContainerAllocateResponse() for _ in request.container_requests]
        )


def channel(sock, authority):
    options = [] if authority is None else [("grpc.default_authority", authority)]
    return grpc.insecure_channel("unix:" + sock, options=options)


def main():
    plugin = Plugin()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    dp_grpc.add_DevicePluginServicer_to_server(plugin, server)
    server.add_insecure_port("unix:" + os.path.join(plugin_dir, "py.sock"))
    server.start()
    kubelet_sock = os.path.join(plugin_dir, "kubelet.sock")
    print("grpcio", grpc.__version__, flush=True)

    for authority in (None, kubelet_sock):
        with channel(kubelet_sock, authority) as ch:
            dp_grpc.RegistrationStub(ch).Register(
                dp.RegisterRequest(version="v1beta1", endpoint="py.sock", resource_name=resource),
                timeout=10,
            )
        print("registered, authority", authority or "grpcio's default", flush=True)

    for authority in (None, pod_resources_sock):
        with channel(pod_resources_sock, authority) as ch:
            stub = pr_grpc.PodResourcesListerStub(ch)
            deadline = time.monotonic() + 30
            while True:
                got = stub.GetAllocatableResources(pr.AllocatableResourcesRequest(), timeout=5)
                ids = sorted(i for d in got.devices if d.resource_name == resource for i in d.device_ids)
                if ids == DEVICES or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            print("allocatable", resource, ids, flush=True)
            if ids != DEVICES:
                sys.exit("the agent never listed the plugin's devices")
            listed = stub.List(pr.ListPodResourcesRequest(), timeout=5)
            print("v1 List: pods", len(listed.pod_resources), flush=True)
            old = pra_grpc.PodResourcesListerStub(ch).List(pra.ListPodResourcesRequest(), timeout=5)
            print("v1alpha1 List: pods", len(old.pod_resources), flush=True)

    server.stop(0)
    print("ok", flush=True)


if __name__ == "__main__":
    main()

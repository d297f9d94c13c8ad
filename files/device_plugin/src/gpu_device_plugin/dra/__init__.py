"""The daemon as a DRA (Dynamic Resource Allocation) kubelet plugin, `resource.k8s.io/v1`.

The parts:
- `devices`: which DRA devices a node has (a GPU, or each MIG device of a GPU in MIG mode), their names,
  and the two interfaces the kubelet side and the API side meet at (`ClaimReader`, `SlicePublisher`);
- the kubelet side: plugin-watcher registration, the `DRAPlugin` service (NodePrepareResources,
  NodeUnprepareResources), per-claim CDI specs, the checkpoint of prepared claims, the health stream;
- the API side: the API server client (claims, ResourceSlices, the served version) and the
  ResourceSlice publisher.
"""

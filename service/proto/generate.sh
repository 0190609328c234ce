#!/bin/sh
# Regenerates grpc_predict_v2_pb2.py from grpc_predict_v2.proto (needs grpcio-tools: the dev extra), run from
# the repository's root. The messages go into a descriptor pool of their own (POOL), not protobuf's default
# one: tritonclient.grpc and kserve register other files of the same package (`inference`) in the default
# pool, and sharing it with either would make the service and that client refuse to load in one process.
set -eu
cd "$(dirname "$0")"
python -m grpc_tools.protoc -I. --python_out=. grpc_predict_v2.proto
sed -i 's/^DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile(/POOL = _descriptor_pool.DescriptorPool()\nDESCRIPTOR = POOL.AddSerializedFile(/' grpc_predict_v2_pb2.py
grep -q '^POOL = ' grpc_predict_v2_pb2.py

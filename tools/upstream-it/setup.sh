#!/bin/bash
# Prepares a directory to run Tair KVCache Manager's own Python integration
# tests against `kvtier meta` (see README.md).
# Usage: tools/upstream-it/setup.sh WORK_DIR UPSTREAM
#   UPSTREAM: a git checkout (or bare clone) of alibaba/tair-kvcache.
set -euo pipefail
WORK=${1:?usage: setup.sh WORK_DIR UPSTREAM}
UPSTREAM=${2:?usage: setup.sh WORK_DIR UPSTREAM}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
echo "extracting the tests and protos of $(git -C "$UPSTREAM" rev-parse --short HEAD) into $WORK" >&2
git -C "$UPSTREAM" archive HEAD integration_test kv_cache_manager/protocol | tar -x -C "$WORK"
touch "$WORK/kv_cache_manager/__init__.py" "$WORK/kv_cache_manager/protocol/__init__.py"
echo "creating the Python environment" >&2
python3 -m venv "$WORK/venv"
# protobuf below 5: the tests call MessageToDict(including_default_value_fields=...),
# which protobuf 5 removed.
"$WORK/venv/bin/pip" install -q 'protobuf<5' 'grpcio-tools<1.63' grpcio requests
echo "generating the gRPC stubs" >&2
(cd "$WORK" && "$WORK/venv/bin/python" -m grpc_tools.protoc -I . --python_out=. --grpc_python_out=. \
  kv_cache_manager/protocol/protobuf/*.proto)
# worker.py puts integration_test/install_root/usr/local/bin on PATH and
# starts kv_cache_manager_bin from there: the shim runs kvtier instead.
install -D -m 755 "$HERE/kv_cache_manager_bin" "$WORK/integration_test/install_root/usr/local/bin/kv_cache_manager_bin"
cp "$HERE/runner.py" "$WORK/runner.py"
echo "ready: tools/upstream-it/run.sh $WORK /path/to/kvtier" >&2

#!/usr/bin/env bash
# Regenerates the control plane's Python code from dipsjax/transport/proto/syncer.proto:
# syncer_pb2.py, syncer_pb2.pyi and syncer_pb2_grpc.py next to it. Uses the protoc bundled
# with grpcio-tools in .venv (a dev dependency), so the generated code matches the
# installed protobuf/grpcio runtimes. Run from anywhere; commit the generated files.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-.venv/bin/python}
OUT=dipsjax/transport/proto
PROTO=$OUT/syncer.proto

# -I . : the file registers as "dipsjax/transport/proto/syncer.proto" in protobuf's global
# descriptor pool (no clash with any other "syncer.proto"), and syncer_pb2_grpc.py imports
# its messages by their full package path.
"$PY" -m grpc_tools.protoc -I . \
  --python_out=. --pyi_out=. --grpc_python_out=. "$PROTO"

# Older grpc_tools (or a different -I) write a top-level `import syncer_pb2 as ...`;
# make any such import package-relative so the module works inside the package.
sed -i -E 's/^import (syncer_pb2) as /from . import \1 as /' "$OUT/syncer_pb2_grpc.py"

# Check the generated code imports with the installed runtime.
"$PY" -c "import dipsjax.transport.proto.syncer_pb2, dipsjax.transport.proto.syncer_pb2_grpc"
echo "gen_proto: regenerated $OUT/syncer_pb2.py, syncer_pb2.pyi, syncer_pb2_grpc.py"

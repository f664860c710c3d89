"""Generated protobuf/gRPC code of the control plane (``syncer.proto``, package
``dipsjax.syncer.v1``). Do not edit the ``syncer_pb2*`` files: change ``syncer.proto`` and
run ``scripts/gen_proto.sh``. Use :mod:`dipsjax.transport.control_codec` to convert to and
from :mod:`dipsjax.syncer.messages`.
"""

"""Transport: how the runtime's processes talk (DESIGN.md sec. 2 and 7).

* :mod:`dipsjax.transport.dataplane` -- the data plane: tensors framed (header + payload +
  checksum) over TCP, serialization overlapped with sending, for learners' pushes and pulls.
* :mod:`dipsjax.transport.control_codec` -- the control plane's protobuf messages
  (``proto/syncer.proto``), mapped one to one onto :mod:`dipsjax.syncer.messages`.

Import the submodules directly; this package imports nothing heavy.
"""

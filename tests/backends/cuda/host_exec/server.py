"""Child process that owns a host-execution library (loaded under ASan) and runs its slots on request.

Started by HostExecDevice (device.py) as ``python server.py LIBRARY PREFIX`` with the ASan runtime
preloaded. Requests and replies are pickled tuples, each framed by an 8-byte length, on stdin / stdout.
A request is (slot, args): args are ints, floats or None, lists of ints (passed as int64 arrays: the host
arrays of rearrange) or an OUT marker (an output pointer whose value is returned). Two helper requests
move bytes: ("upload", data) -> device pointer, ("download", ptr, nbytes) -> (status, data, error);
("string", slot) calls a slot that returns a string (build_info).
The reply to a slot call is (status, last_error, outputs).
"""

import ctypes
import pickle
import struct
import sys
from ctypes import c_char_p, c_float, c_int, c_int64, c_size_t, c_void_p

from llaisys import abi


def _untyped(argtypes) -> list:
    """The slot's argument types with every pointer as void* (requests carry addresses as plain ints)."""
    return [c_void_p if issubclass(t, (ctypes._Pointer, c_void_p, c_char_p)) else t for t in argtypes]


# slot -> argument types, from llaisys.abi (checked against backend.h); runtime slots take their pointers as
# plain ints here, ops as llaisys.abi types them (rearrange's shape / strides: int64 arrays)
SIGNATURES = {name: _untyped(args) for name, (_, _, args) in abi.RUNTIME_SLOTS.items()
              if name not in ("api_version", "last_error", "build_info")}
SIGNATURES.update({op: [*abi.OP_LEADING_ARGS, *args] for op, args in abi.OP_SLOTS.items()})
OUT_TYPES = {"ptr": c_void_p, "int": c_int, "int64": c_int64, "size": c_size_t, "float": c_float}


def read_message(stream):
    header = stream.read(8)
    if len(header) < 8:
        return None
    return pickle.loads(stream.read(struct.unpack("<Q", header)[0]))


def write_message(stream, obj):
    data = pickle.dumps(obj)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def main(library: str, prefix: str):
    lib = ctypes.CDLL(library)
    last_error = getattr(lib, f"{prefix}_last_error")
    last_error.restype = c_char_p
    slots = {}
    for name, argtypes in SIGNATURES.items():
        fn = getattr(lib, f"{prefix}_{name}", None)
        if fn is None and name in abi.OP_SLOTS:
            continue  # an op this backend does not implement (calling it is an error on the client's side)
        if fn is None:
            raise AttributeError(f"{library} does not export {prefix}_{name}")
        fn.restype, fn.argtypes = c_int, argtypes
        slots[name] = fn
    keep = []  # buffers referenced by queued work (host copies) stay alive until the next request

    def call(name, args):
        converted, outs = [], []
        for a in args:
            if isinstance(a, tuple) and a and a[0] == "OUT":
                if a[1] == "bytes":
                    buf = ctypes.create_string_buffer(a[2])
                    outs.append(buf)
                    converted.append(ctypes.cast(buf, c_void_p))
                else:
                    value = OUT_TYPES[a[1]]()
                    outs.append(value)
                    converted.append(ctypes.byref(value))
            elif isinstance(a, list):
                array = (c_int64 * len(a))(*a)
                keep.append(array)
                converted.append(array)
            else:
                converted.append(a)
        status = slots[name](*converted)
        error = (last_error() or b"").decode()
        values = [o.raw if isinstance(o, ctypes.Array) else o.value for o in outs]
        return status, error, values

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while (request := read_message(stdin)) is not None:
        keep.clear()
        kind = request[0]
        if kind == "upload":
            data = request[1]
            status, error, (ptr,) = call("malloc", [0, max(len(data), 1), ("OUT", "ptr")])
            if status == 0 and data:
                buf = ctypes.create_string_buffer(data, len(data))
                status, error, _ = call("memcpy", [0, ptr, ctypes.addressof(buf), len(data), 1])
            write_message(stdout, (status, error, ptr))
        elif kind == "string":  # a slot that returns a string (build_info)
            fn = getattr(lib, f"{prefix}_{request[1]}")
            fn.restype, fn.argtypes = c_char_p, []
            write_message(stdout, (0, "", fn().decode()))
        elif kind == "download":
            _, ptr, nbytes = request
            buf = ctypes.create_string_buffer(max(nbytes, 1))
            status, error, _ = call("memcpy", [0, ctypes.addressof(buf), ptr, nbytes, 2])
            write_message(stdout, (status, error, buf.raw[:nbytes]))
        else:
            write_message(stdout, call(kind, request[1]))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

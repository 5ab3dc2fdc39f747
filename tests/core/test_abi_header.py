"""The C header ``llaisys/backend.h`` is the single definition of the ABI: core's Python tables must match it.

The header is parsed here (its own regular style: one ``typedef enum`` per enum, one
``LLAISYS_REQUIRED|OPTIONAL|OP <type> LLAISYS_FN(name)(args);`` per slot), and every name,
value, slot kind and argument type is compared with ``llaisys.abi``. Any drift fails. This is the one
parser of the header: everything else in Python (core's binding, the ABI probes of tests/backends, the CUDA
host-execution server) takes the ABI from ``llaisys.abi``.
"""

from __future__ import annotations

import ctypes
import re
from ctypes import POINTER, c_char, c_char_p, c_double, c_float, c_int, c_int64, c_size_t, c_uint64, c_void_p
from pathlib import Path

from native_build import compile_shared

import llaisys
from llaisys import abi

HEADER = Path(llaisys.get_include()) / "llaisys" / "backend.h"
C_TYPES = {"int": c_int, "int64_t": c_int64, "uint64_t": c_uint64, "size_t": c_size_t, "double": c_double,
           "float": c_float, "char": c_char}


def header_text() -> str:
    return re.sub(r"/\*.*?\*/", " ", HEADER.read_text(), flags=re.S)  # without comments


def parse_enums(text: str) -> dict[str, dict[str, int]]:
    enums = {}
    for name, body, alias in re.findall(r"typedef enum (\w+) \{(.*?)\} (\w+);", text, flags=re.S):
        assert alias == name + "_t", f"enum {name} is typedef'd as {alias}"
        entries = [e.strip() for e in body.split(",") if e.strip()]
        enums[name] = {}
        for entry in entries:
            constant, value = (part.strip() for part in entry.split("="))
            enums[name][constant] = int(value, 0)
    return enums


def to_ctype(declaration: str, returned: bool = False):
    """The ctypes type of a C type (see llaisys.abi's docstring for the mapping)."""
    words = declaration.replace("*", " * ").split()
    stars = words.count("*")
    base = [w for w in words if w not in ("const", "*")]
    assert len(base) == 1, f"cannot read the C type {declaration!r}"
    base = base[0]
    if base == "void":
        return {1: c_void_p, 2: POINTER(c_void_p)}[stars]
    if stars == 0:
        return C_TYPES[base]
    assert stars == 1, f"unexpected type {declaration!r}"
    if base == "char" and returned:
        return c_char_p
    return POINTER(C_TYPES[base])


def parse_slots(text: str) -> dict[str, tuple[str, object, list]]:
    """{slot: (kind, return ctype, [argument ctypes])} of every LLAISYS_FN declaration."""
    declarations = text[text.index("#ifdef LLAISYS_PREFIX"):]
    found = re.findall(r"LLAISYS_(REQUIRED|OPTIONAL|OP)\s+([\w\s\*]+?)\s*LLAISYS_FN\((\w+)\)\s*\((.*?)\)\s*;",
                       declarations, flags=re.S)
    assert len(found) == declarations.count("LLAISYS_FN("), "a slot declaration is not in the header's usual form"
    slots = {}
    for kind, ret, name, args in found:
        assert name not in slots, f"slot {name} is declared twice"
        args = " ".join(args.split())
        # each argument is "<type> <name>": the type is what precedes the name
        argtypes = [] if args == "void" else [to_ctype(re.fullmatch(r"(.*?)\w+", a.strip()).group(1))
                                              for a in args.split(",")]
        slots[name] = (kind.lower(), to_ctype(ret, returned=True), argtypes)
    return slots


def python_slots() -> dict[str, tuple[str, object, list]]:
    slots = {name: (kind.value, ret, list(args)) for name, (kind, ret, args) in abi.RUNTIME_SLOTS.items()}
    for op, args in abi.OP_SLOTS.items():
        slots[op] = (abi.OP.value, c_int, [*abi.OP_LEADING_ARGS, *args])
    return slots


def test_api_version_matches():
    text = HEADER.read_text()
    major = int(re.search(r"#define LLAISYS_API_VERSION_MAJOR (\d+)", text).group(1))
    minor = int(re.search(r"#define LLAISYS_API_VERSION_MINOR (\d+)", text).group(1))
    assert "#define LLAISYS_API_VERSION (LLAISYS_API_VERSION_MAJOR * 1000 + LLAISYS_API_VERSION_MINOR)" in text
    assert (major, minor) == (abi.API_MAJOR, abi.API_MINOR) and minor < 1000
    assert abi.API_VERSION == llaisys.API_VERSION == major * 1000 + minor
    assert abi.split_version(abi.API_VERSION) == (major, minor) and abi.version_text(abi.API_VERSION) == f"{major}.{minor}"
    assert abi.split_version(6) == (6, 0), "a library from before minors returns its plain major"


def parse_slot_since(text: str) -> dict[str, int]:
    """The header's list of slots added in a minor version ("  <major>.<minor>: slot, slot" lines)."""
    block = text[text.index("Slots added in a minor version"):]
    block = block[:block.index("*/")]
    since = {}
    for major, minor, names in re.findall(r"^\s*\*\s+(\d+)\.(\d+): ([\w, ]+)$", block, flags=re.M):
        assert int(major) == abi.API_MAJOR, f"the list holds slots of another major ({major}.{minor})"
        since.update({name.strip(): int(minor) for name in names.split(",")})
    return since


def test_slot_since_matches():
    """Which minor added each slot is recorded in the header and in llaisys.abi alike; only optional and op
    slots can be added in a minor version (a new required slot breaks older libraries: a major bump)."""
    listed = f"Slots added in a minor version:\n *   {abi.API_MAJOR}.1: foo, bar\n *   {abi.API_MAJOR}.2: baz\n */"
    assert parse_slot_since(listed) == {"foo": 1, "bar": 1, "baz": 2}  # (the parser reads such lines)
    since = parse_slot_since(HEADER.read_text())
    assert since == abi.SLOT_SINCE
    kinds = python_slots()
    for name, minor in since.items():
        assert name in kinds and kinds[name][0] in ("optional", "op"), f"{name} cannot be added in a minor version"
        assert 0 < minor <= abi.API_MINOR, f"{name}: since {abi.API_MAJOR}.{minor}, beyond the header's minor"


def test_fallback_copies_back_exactly_the_buffers_the_header_lets_an_op_write():
    """An op's ``void*`` buffers (not ``const void*``) are those llaisys.buffers says it writes, and it gives
    the bytes of every pointer argument."""
    from llaisys import buffers

    declarations = header_text()[header_text().index("#ifdef LLAISYS_PREFIX"):]
    for op in abi.OP_SLOTS:
        args = re.search(rf"LLAISYS_FN\({op}\)\s*\((.*?)\)\s*;", declarations, flags=re.S).group(1)
        pointers = [a for a in (" ".join(a.split()) for a in args.split(",")[2:]) if re.match(r"(const )?void\* ", a)]
        assert len(pointers) == len(buffers.POINTERS[op]), op
        writes = {i for i, a in enumerate(pointers) if not a.startswith("const ")}
        assert writes == buffers.WRITES[op], f"{op}: the header writes {sorted(writes)}"
        arity = buffers._EXTENTS[op].__code__.co_argcount
        assert arity == len(abi.OP_SLOTS[op]), f"{op}: its extents take {arity} arguments"


def test_unique_id_size_matches():
    size = int(re.search(r"#define LLAISYS_UNIQUE_ID_BYTES (\d+)", HEADER.read_text()).group(1))
    assert size == abi.UNIQUE_ID_BYTES


def test_enums_match():
    enums = parse_enums(header_text())
    assert set(enums) == {c_name for c_name, _, _ in abi.ENUMS}, "every enum of the header is mirrored in llaisys.abi"
    for c_name, py_enum, prefix in abi.ENUMS:
        header = {constant.removeprefix(prefix): value for constant, value in enums[c_name].items()}
        assert all(c.startswith(prefix) for c in enums[c_name]), c_name
        assert header == {m.name: m.value for m in py_enum}, c_name


def test_dtype_codes_are_the_header_codes():
    codes = parse_enums(header_text())["llaisys_dtype"]
    assert sorted(d.code for d in llaisys.DType) == sorted(codes.values()), "one DType per header dtype"
    for d in llaisys.DType:
        assert d.value[0] in abi.DTypeCode and d.code == int(d.value[0])


def test_every_slot_matches():
    header, python = parse_slots(header_text()), python_slots()
    assert sorted(header) == sorted(python), (f"only in the header: {sorted(set(header) - set(python))}; "
                                              f"only in llaisys.abi: {sorted(set(python) - set(header))}")
    for name in header:
        assert header[name] == python[name], f"{name}: header {header[name]} != llaisys.abi {python[name]}"


def test_capabilities_cover_the_optional_slots():
    optional = {name for name, (kind, _, _) in abi.RUNTIME_SLOTS.items() if kind is abi.OPTIONAL}
    grouped = [slot for slots in abi.CAPABILITIES.values() for slot in slots]
    assert sorted(grouped) == sorted(optional), "each optional slot belongs to exactly one capability"


def test_the_parser_reads_what_it_should():
    """Guards the guard: the parser sees the slot kinds and pointer types the header spells out."""
    slots = parse_slots(header_text())
    assert slots["last_error"] == ("required", c_char_p, [])
    assert slots["malloc"] == ("required", c_int, [c_int, c_size_t, POINTER(c_void_p)])
    assert slots["device_name"] == ("optional", c_int, [c_int, POINTER(c_char), c_size_t])
    assert slots["rearrange"][2][4] == POINTER(c_int64)
    assert slots["sample"][2][-1] == c_uint64
    assert len([s for s in slots.values() if s[0] == "op"]) == len(abi.OP_SLOTS)


def test_cpu_library_speaks_the_header_version():
    assert llaisys.plugins.registry().backend("cpu").lib.api_version == abi.API_VERSION


def test_header_compiles_as_c_and_cpp(c_compiler, tmp_path):
    source = tmp_path / "probe.c"
    source.write_text("#define LLAISYS_PREFIX probe\n#include <llaisys/backend.h>\n"
                      "int LLAISYS_FN(api_version)(void) { return LLAISYS_API_VERSION; }\n")
    for flags in (["-x", "c", "-std=c99"], ["-x", "c++", "-std=c++17"]):
        compile_shared(c_compiler, source, tmp_path / "probe.so", flags + ["-Wall", "-Wextra", "-Werror", "-pedantic"])
        assert ctypes.CDLL(str(tmp_path / "probe.so")).probe_api_version() == abi.API_VERSION

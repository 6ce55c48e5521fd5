#!/usr/bin/env python3
"""Turns the Rust side of the IB extensions (src/abi/src/ib_ext.rs) into
compile-time checks against our <dat2/dat_ib_extensions.h>, for
abi_compare.c (which also checks that header against Debian's).

Usage: gen_ib_ext_rust.py src/abi/src/ib_ext.rs out.h

For every item of ib_ext.rs (found by scanning it, so nothing is listed by
hand):
  pub const N: <integer type> = EXPR;  ->  IBR_CONST(N, EXPR)
  pub const N: &str = "s";             ->  IBR_STR(N, "s")
  #[repr(C)] pub struct S { f: T, .. } ->  a C mirror `struct ibr_S` with the
      same fields in the same order (repr(C) lays it out as C does), then
      IBR_SIZE and one IBR_OFFSET per field against the header's struct
  pub type N = T;                      ->  a mirror typedef ibr_N, IBR_SIZE
Constant expressions are Rust's text evaluated by the C compiler; they may
only use literals, names our headers define and + - | << ( ).
"""
import re
import sys

# Rust primitive types and the C types of the same size and signedness.
PRIMITIVES = {
    "u8": "uint8_t", "u16": "uint16_t", "u32": "uint32_t", "u64": "uint64_t",
    "i8": "int8_t", "i16": "int16_t", "i32": "int32_t", "i64": "int64_t",
    "usize": "size_t", "isize": "ssize_t", "c_int": "int", "c_uint": "unsigned int",
    "c_char": "char", "c_void": "void",
}

# Rust fields whose C designator is not the field's own name.
C_FIELD = {
    ("dat_ib_extension_event_data", "type_"): "type",
    ("dat_ib_extension_event_data", "immed_data"): "val.immed.data",
}


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def c_expr(expr):
    expr = " ".join(expr.split())
    # numeric literals: drop digit separators and type suffixes
    expr = re.sub(r"\b(0x[0-9a-fA-F_]+|\d[\d_]*)(u8|u16|u32|u64|usize|i32|i64)?\b",
                  lambda m: m.group(1).replace("_", ""), expr)
    if not re.fullmatch(r"[\w\s+\-|<()]*", expr) or re.search(r"\bas\b", expr):
        raise SystemExit(f"gen_ib_ext_rust: cannot translate constant expression: {expr}")
    return f"({expr})"


def c_type(ty, structs, aliases):
    ty = " ".join(ty.split())
    m = re.fullmatch(r"\*(?:mut|const) (.+)", ty)
    if m:
        return c_type(m.group(1), structs, aliases) + " *"
    ty = ty.split("::")[-1]
    if ty in PRIMITIVES:
        return PRIMITIVES[ty]
    if ty in structs:
        return f"struct ibr_{ty}"
    if ty in aliases:
        return f"ibr_{ty}"
    if re.fullmatch(r"[A-Z][A-Z0-9_]*", ty):
        return ty  # a type of dat_types.h, compared with Debian's there
    raise SystemExit(f"gen_ib_ext_rust: cannot translate type: {ty}")


def main(src, out):
    text = strip_comments(open(src).read())
    lines = []
    n_const = 0
    for m in re.finditer(r"\bpub const (\w+)\s*:\s*([^=]+?)\s*=\s*(.*?);", text, re.S):
        name, ty, expr = m.groups()
        if ty.strip() == "&str":
            lines.append(f"IBR_STR({name}, {expr.strip()})")
        else:
            lines.append(f"IBR_CONST({name}, {c_expr(expr)})")
        n_const += 1

    structs = {}
    for m in re.finditer(r"#\[repr\(C\)\][^{;]*?pub struct (\w+) \{(.*?)\}", text, re.S):
        fields = re.findall(r"pub (\w+)\s*:\s*(\[[^\]]*\]|[^,]+),", m.group(2))
        structs[m.group(1)] = fields
    aliases = dict(re.findall(r"\bpub type (\w+)\s*=\s*([^;]+);", text))

    # Mirrors, in dependency order: aliases of primitives, then structs (which
    # may use those and each other, as Rust declares them), then the rest.
    decls = []
    done = set()

    def emit_alias(name):
        if name not in done:
            done.add(name)
            target = aliases[name].strip()
            if target in structs:
                emit_struct(target)
            elif target in aliases:
                emit_alias(target)
            decls.append(f"typedef {c_type(target, structs, aliases)} ibr_{name};")

    def emit_struct(name):
        if name in done:
            return
        done.add(name)
        body = []
        for fname, fty in structs[name]:
            base = re.sub(r"^\[\s*(.+?)\s*;.*\]$", r"\1", fty.strip()).split("::")[-1]
            if base in structs:
                emit_struct(base)
            elif base in aliases:
                emit_alias(base)
            arr = re.fullmatch(r"\[\s*(.+?)\s*;\s*(\w+)\s*\]", fty.strip())
            if arr:  # [T; N]
                body.append(f"\t{c_type(arr.group(1), structs, aliases)} {fname}[{arr.group(2)}];")
            else:
                body.append(f"\t{c_type(fty, structs, aliases)} {fname};")
        decls.append(f"struct ibr_{name} {{\n" + "\n".join(body) + "\n};")

    for name in structs:
        emit_struct(name)
    for name in aliases:
        emit_alias(name)

    checks = []
    for name, fields in structs.items():
        checks.append(f"IBR_SIZE(struct ibr_{name}, struct {name})")
        for fname, _ in fields:
            cfield = C_FIELD.get((name, fname), fname.rstrip("_"))
            checks.append(f"IBR_OFFSET(struct ibr_{name}, {fname}, struct {name}, {cfield})")
    for name in aliases:
        checks.append(f"IBR_SIZE(ibr_{name}, {name})")

    with open(out, "w") as f:
        f.write("/* Generated by tests-c/scripts/gen_ib_ext_rust.py from src/abi/src/ib_ext.rs */\n")
        f.write("#ifdef IBR_DECLARE\n" + "\n".join(decls) + "\n#else\n")
        f.write("\n".join(lines + checks) + "\n#endif\n")
    print(f"gen_ib_ext_rust: {n_const} constants, {len(structs)} structs, {len(aliases)} types")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

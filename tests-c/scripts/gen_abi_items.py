#!/usr/bin/env python3
"""Lists every type, field and constant of our generated DAT 2.0 header as
X-macros (ABI_SIZE, ABI_OFFSET, ABI_CONST, ABI_STR) for the ABI comparison.

The list comes from include/dat2/dat_types.h, so anything the Rust ABI
defines is compared with Debian's headers without a list kept by hand.
Names that exist only on our side are listed in OURS_ONLY below, with why.

Usage: gen_abi_items.py dat_types.h [dat_ib_extensions.h] out.h
With the hand-written IB extension header as well, its enumerators, types,
struct fields (those of nested and anonymous unions too) and #define
constants and strings are listed the same way.
"""
import re
import sys

# Items our header has and OFED's does not, each with a reason.
OURS_ONLY = {
    # OFED declares the DAT_CNO_PARAM proxy union anonymously; ours is named
    # so that Rust can describe it. Its layout is checked through the
    # fields of struct dat_cno_param.
    "union dat_cno_proxy",
}


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def split_top(body, sep):
    """Splits body at `sep` outside braces."""
    parts, depth, cur = [], 0, ""
    for ch in body:
        depth += ch == "{"
        depth -= ch == "}"
        if ch == sep and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def member_paths(body, prefix=""):
    """Field designators of a struct/union body: `a`, `u.b` for a member of
    a named union `u`, `c` for a member of an anonymous one."""
    paths = []
    for decl in split_top(body, ";"):
        m = re.match(r"(?:struct|union)\s*\w*\s*\{(.*)\}\s*(\w*)$", decl, re.S)
        if m:
            inner, name = m.group(1), m.group(2)
            if name:
                paths.append(prefix + name)
                paths += member_paths(inner, prefix + name + ".")
            else:
                paths += member_paths(inner, prefix)
            continue
        paths.append(prefix + re.search(r"(\w+)\s*(\[[^\]]*\])*$", decl).group(1))
    return paths


def ib_ext_items(header):
    """The items of our hand-written <dat2/dat_ib_extensions.h>."""
    text = strip_comments(open(header).read())
    # Inline function bodies are not items.
    text = re.sub(r"static __inline__.*?^\}", "", text, flags=re.S | re.M)
    items = []
    for m in re.finditer(r"typedef enum (\w+) \{(.*?)\} (\w+);", text, re.S):
        items.append(f"ABI_SIZE({m.group(3)}, {m.group(3)})")
        for e in split_top(m.group(2), ","):
            name = re.match(r"\w+", e).group(0)
            items.append(f"ABI_CONST({name})")
    for m in re.finditer(r"typedef (struct|union) (\w+) \{(.*?)^\} (\w+);", text, re.S | re.M):
        tag = f"{m.group(1)} {m.group(2)}"
        key = f"{m.group(1)}_{m.group(2)}"
        items.append(f"ABI_SIZE({key}, {tag})")
        items.append(f"ABI_SIZE({m.group(4)}, {m.group(4)})")
        for path in member_paths(m.group(3)):
            items.append(f"ABI_OFFSET({key}__{path.replace('.', '__')}, {tag}, {path})")
    for m in re.finditer(r"^typedef [^{}();]*?(\w+);$", text, re.M):
        items.append(f"ABI_SIZE({m.group(1)}, {m.group(1)})")
    strings = set()
    for m in re.finditer(r"^#define ([A-Z]\w+) (.+)$", text, re.M):
        name, value = m.group(1), m.group(2).strip()
        if name.startswith("_DAT"):
            continue
        if value.startswith('"') or value in strings:
            strings.add(name)
            items.append(f"ABI_STR({name})")
        else:
            items.append(f"ABI_CONST({name})")
    return items


def main(header, ib_header, out):
    text = strip_comments(open(header).read())
    items = []
    for m in re.finditer(r"^(struct|union) (\w+) \{(.*?)^\};", text, re.S | re.M):
        tag = f"{m.group(1)} {m.group(2)}"
        if tag in OURS_ONLY:
            continue
        key = f"{m.group(1)}_{m.group(2)}"
        items.append(f"ABI_SIZE({key}, {tag})")
        for line in m.group(3).split(";"):
            line = line.strip()
            if not line:
                continue
            field = re.search(r"(\w+)\s*(\[[^\]]*\])*$", line).group(1)
            items.append(f"ABI_OFFSET({key}__{field}, {tag}, {field})")
    for m in re.finditer(r"^typedef .*?(\w+)\)?(\(.*\))?;$", text, re.M):
        line = m.group(0)
        fp = re.match(r"typedef .*\(\*(\w+)\)\(", line)
        name = fp.group(1) if fp else m.group(1)
        if line.startswith("typedef struct") or line.startswith("typedef union"):
            pass
        items.append(f"ABI_SIZE({name}, {name})")
    for m in re.finditer(r"^#define (DAT_\w+) (.+)$", text, re.M):
        name = m.group(1)
        if name.startswith("_DAT2_") or name in OURS_ONLY:
            continue
        items.append(f"ABI_CONST({name})")
    if ib_header:
        items += ib_ext_items(ib_header)
    seen = set()
    with open(out, "w") as f:
        f.write("/* Generated by tests-c/scripts/gen_abi_items.py from include/dat2/dat_types.h"
                + (" and dat_ib_extensions.h" if ib_header else "") + " */\n")
        for it in items:
            if it not in seen:
                seen.add(it)
                f.write(it + "\n")
    print(f"gen_abi_items: {len(seen)} items")


if __name__ == "__main__":
    if len(sys.argv) == 4:
        main(sys.argv[1], sys.argv[2], sys.argv[3])
    else:
        main(sys.argv[1], None, sys.argv[2])

#!/usr/bin/env python3
"""What abi_compare cannot see in <dat2/dat_ib_extensions.h>: the function-
like macros and the names the header defines, against Debian's header.

1. Every name Debian's header defines (#define, enumerator, typedef) is
   defined by ours.
2. Every dat_ib_* / dat_* macro of ours expands, with the same argument
   tokens, to the same dat_extension_op call as Debian's: same operation,
   same casts, same argument order (what a provider reads its va_list by).
   Both are run through the C preprocessor; whitespace and parentheses are
   ignored. The macros where Debian's own expansion is broken are listed in
   KNOWN with what differs and why.

Prints "ib-ext-macros: N passed, N failed".
"""
import os
import re
import subprocess
import sys
import tempfile

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OURS = os.path.join(TOP, "include/dat2/dat_ib_extensions.h")
DEBIAN = "/usr/include/dat2/dat_ib_extensions.h"

# Macros whose expansion differs from Debian's on purpose.
KNOWN = {
    "dat_ib_start_counter": "Debian casts to DAT_COUNTER_TYPE, a type no header defines "
                            "(its macro cannot compile); ours casts to DAT_IA_COUNTER_TYPE (int-sized too)",
    "dat_ib_stop_counter": "as dat_ib_start_counter",
    "dat_ib_collective_set_clock": "Debian passes DAT_IB_COLLECTIVE_READ_CLOCK_OP and an undefined "
                                   "name `user_contex`; ours SET_CLOCK_OP and its argument",
    "dat_ib_collective_gatherv": "Debian passes a variable named `recvbuf` instead of its argument `recvbufs`",
}

passed = failed = 0


def ok():
    global passed
    passed += 1


def bad(msg):
    global failed
    failed += 1
    print(f"ib-ext-macros: FAIL: {msg}")


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def defined_names(path):
    text = strip_comments(open(path, encoding="latin-1").read())
    names = set(re.findall(r"^\s*#\s*define\s+(\w+)", text, re.M))
    for body in re.findall(r"\benum\s+\w*\s*\{(.*?)\}", text, re.S):
        names |= {m for m in re.findall(r"(?:^|,)\s*(\w+)", body)}
    names |= set(re.findall(r"\}\s*(\w+)\s*;", text))
    names |= set(re.findall(r"^typedef\s+[^;{]*?(\w+)\s*;", text, re.M))
    return names


def expand(calls, include_dir):
    src = "#include <dat2/udat.h>\n#include <dat2/dat_ib_extensions.h>\n"
    for name, call in calls:
        src += f"\nIB_MACRO_BEGIN_{name}\n{call}\n"
    with tempfile.NamedTemporaryFile("w", suffix=".c", delete=False) as f:
        f.write(src)
        path = f.name
    try:
        cmd = ["cc", "-E", "-P", "-D_GNU_SOURCE"] + (["-I", include_dir] if include_dir else []) + [path]
        out = subprocess.run(cmd, capture_output=True, text=True)
    finally:
        os.unlink(path)
    if out.returncode != 0:
        raise SystemExit(f"ib-ext-macros: preprocessing failed:\n{out.stderr}")
    result = {}
    parts = re.split(r"IB_MACRO_BEGIN_(\w+)", out.stdout)
    for i in range(1, len(parts), 2):
        # tokens, parentheses dropped
        result[parts[i]] = " ".join(re.findall(r"\w+|[^\s\w()]", parts[i + 1]))
    return result


def main():
    if not os.path.exists(DEBIAN):
        bad(f"{DEBIAN} missing (libdapl-dev)")
        print(f"ib-ext-macros: {passed} passed, {failed} failed")
        return 1

    ours_names = defined_names(OURS)
    missing = sorted(defined_names(DEBIAN) - ours_names - {"_DAT_IB_EXTENSIONS_H_"})
    for n in missing:
        bad(f"{n} is defined by Debian's header, not by ours")
    if not missing:
        ok()

    text = strip_comments(open(OURS).read())
    calls = []
    for name, params in re.findall(r"^#define (dat_\w+)\(([^)]*)\)", text, re.M):
        args = [p.strip() for p in params.split(",") if p.strip()]
        calls.append((name, f"{name}({', '.join(args)})"))
    for name in re.findall(r"^#define (dat_\w+) \w+$", text, re.M):
        calls.append((name, name))
    ours = expand(calls, os.path.join(TOP, "include"))
    debian = expand(calls, None)
    for name, _ in calls:
        if ours.get(name) == debian.get(name):
            if name in KNOWN:
                bad(f"{name} is listed as differing but expands as Debian's")
            else:
                ok()
        elif name in KNOWN:
            print(f"ib-ext-macros: {name} differs as documented: {KNOWN[name]}")
            ok()
        else:
            bad(f"{name}: ours expands to\n  {ours.get(name)}\nDebian's to\n  {debian.get(name)}")
    print(f"ib-ext-macros: {passed} passed, {failed} failed "
          f"({len(calls)} macros compared, {len(ours_names)} names cover Debian's)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

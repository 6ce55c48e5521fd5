#!/usr/bin/env python3
"""Generates the section 3 man pages of udapl-rs (man/man3/*.3) from
man/calls.in and the declarations the libraries are built from.

What comes from where:

- SYNOPSIS: the prototypes of include/dat2/dat_api.h (DAT 2.0) and
  include/dat/dat_api.h (DAT 1.2), which gen-header writes from the Rust
  list every dispatched export is expanded from (src/registry/src/exports.rs,
  `dat_calls!`), plus dat_extension_op from include/dat2/dat.h. A call both
  headers declare alike gets one prototype; one they declare differently
  (dat_rmr_bind, dat_lmr_create, dat_cr_reject, dat_ia_openv) one per API.
- DAT_INVALID_ARGn and DAT_INVALID_HANDLEn: calls.in names the parameter
  (ARG(name), HANDLE(name)); its position is taken from the prototype. The
  provider places its refusals by its own argument lists
  (src/provider-ffi/src/calls.rs, src/provider-ffi/src/v12/calls.rs) and
  the registry by src/registry/src/args.rs: this script checks that those
  lists are the headers' prototypes, name for name, so the positions printed
  are the ones the libraries return.
- The DAT_INVALID_HANDLE code of a dispatched call's first argument (the
  registry's check) comes from its line in `dat_calls!`: `ia`, `any` or
  `object(SUBTYPE)`.
- Everything else (what the call does, each parameter, each other code,
  the notes) is written in calls.in.

Usage: gen-pages.py            write man/man3/*.3
       gen-pages.py --check    exit 1 if man/man3 differs from what would be
                               written (a page missing, stale or left over)
"""

import os
import re
import sys

MAN = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(MAN)
OUT = os.path.join(MAN, "man3")
DATE = "2026-11-30"
SOURCE = "udapl-rs"
MANUAL = "DAT Library Functions"

API20 = "2.0"
API12 = "1.2"
INCLUDE = {API20: "<dat2/udat.h>", API12: "<dat/udat.h>"}
LIB = {API20: "\\-ldat2", API12: "\\-ldat"}
LIBNAME = {API20: "libdat2.so.2", API12: "libdat.so.1"}


class Error(Exception):
    pass


def read(rel):
    with open(os.path.join(TOP, rel), encoding="utf-8") as f:
        return f.read()


def strip_c_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


# ---------------------------------------------------------------- headers


def parse_param(decl):
    """'const DAT_LMR_TRIPLET *local_iov' -> ('const DAT_LMR_TRIPLET *', 'local_iov')."""
    decl = " ".join(decl.split())
    if decl == "...":
        return ("", "...")
    m = re.match(r"^(.*?)(\w+)$", decl)
    if not m:
        raise Error("cannot read parameter '%s'" % decl)
    ty = m.group(1)
    if not ty.endswith("*"):
        ty = ty.rstrip() + " "
    return (ty, m.group(2))


def prototypes(rel, pattern=r"DAT_RETURN\s+(\w+)\s*\(([^;]*?)\)\s*;"):
    text = strip_c_comments(read(rel))
    out = {}
    for m in re.finditer(pattern, text, flags=re.S):
        args = [a for a in m.group(2).split(",") if a.strip() and a.strip() != "void"]
        out[m.group(1)] = [parse_param(a) for a in args]
    return out


def load_headers():
    h20 = prototypes("include/dat2/dat_api.h")
    h20.update(
        prototypes(
            "include/dat2/dat.h",
            r"extern\s+DAT_RETURN\s+(\w+)\s*\(([^;]*?)\)\s*;",
        )
    )
    h12 = prototypes("include/dat/dat_api.h")
    return {API20: h20, API12: h12}


# ------------------------------------------------- the libraries' own lists


def c_names_of_params():
    """Param variant -> C name, from src/core/src/error.rs (`params!`)."""
    text = read("src/core/src/error.rs")
    block = text[text.index("params! {") :]
    block = block[: block.index("\n}\n")]
    return dict(re.findall(r"(\w+)\s*=\s*\"(\w+)\"", block))


def calls_lists(rel, names):
    """name -> [C parameter names] of a `calls!` block (provider-ffi)."""
    text = read(rel)
    block = text[text.index("calls! {") :]
    block = block[: block.index("\n}\n")]
    out = {}
    for m in re.finditer(r"\w+\s*=\s*(\w+)\(([^;]*?)\);", block, flags=re.S):
        params = [p.strip() for p in m.group(2).split(",") if p.strip()]
        try:
            out[m.group(1)] = [names[p] for p in params]
        except KeyError as e:
            raise Error("%s: unknown Param %s" % (rel, e))
    return out


def registry_lists():
    text = read("src/registry/src/args.rs")
    block = text[text.index("registry_calls! {") :]
    block = block[: block.index("\n}\n")]
    out = {}
    for m in re.finditer(r"\w+\s*=\s*(\w+)\(([^;]*?)\);", block, flags=re.S):
        out[m.group(1)] = [p.strip() for p in m.group(2).split(",") if p.strip()]
    return out


def dispatch_kinds():
    """name -> {api: (kind, subtype, handle parameter)} from `dat_calls!`."""
    text = read("src/registry/src/exports.rs")
    block = text[text.index("macro_rules! dat_calls") :]
    block = block[: block.index("macro_rules! __dat_calls_each")]
    out = {}
    for m in re.finditer(
        r"\[(both|v20|v12)\]\s*fn\s+(\w+)\(\s*(ia|any|object\((\w+)\))\s+(\w+):",
        block,
    ):
        tag, name, kind, sub, param = m.groups()
        kind = "object" if kind.startswith("object") else kind
        apis = {"both": [API20, API12], "v20": [API20], "v12": [API12]}[tag]
        for api in apis:
            out.setdefault(name, {})[api] = (kind, sub, param)
    return out


def check_lists(headers):
    """The provider's and registry's argument lists are the headers'."""
    names = c_names_of_params()
    problems = []

    def compare(what, lists, protos, skip=()):
        for call, params in lists.items():
            if call in skip:
                continue
            if call not in protos:
                continue  # an IB extension macro or an internal slot
            theirs = [p[1] for p in protos[call]]
            if params != theirs:
                problems.append("%s: %s %s, header %s" % (what, call, params, theirs))

    v20 = calls_lists("src/provider-ffi/src/calls.rs", names)
    v12 = calls_lists("src/provider-ffi/src/v12/calls.rs", names)
    # dat_extension_op is variadic (declared in dat.h): the provider names
    # its second argument `op`, the header `ext_op`, at the same position.
    compare("provider-ffi/src/calls.rs", v20, headers[API20], skip=("dat_extension_op",))
    compare("provider-ffi/src/v12/calls.rs", v12, headers[API12])
    # dat_ia_open's slot takes dat_ia_openv's first four arguments.
    for api, lists in ((API20, v20), (API12, v12)):
        openv = [p[1] for p in headers[api]["dat_ia_openv"]][:4]
        if lists.get("dat_ia_open") != openv:
            problems.append("dat_ia_open slot (%s) %s, dat_ia_openv %s" % (api, lists.get("dat_ia_open"), openv))
    reg = registry_lists()
    compare("registry/src/args.rs", reg, headers[API20])
    if problems:
        raise Error("argument lists differ from the headers:\n  " + "\n  ".join(problems))


# ---------------------------------------------------------------- calls.in


class Page:
    def __init__(self, name, line):
        self.name = name
        self.line = line
        self.aliases = []
        self.brief = None
        self.params = []  # (names, text)
        self.desc = ""
        self.rets = []  # (code, [subs], text)
        self.notes = ""
        self.see = []
        self.synopsis = ""
        self.no_auto = set()


def is_comment(line):
    """'# ...' or a lone '#' (so that '#include' in a synopsis is text)."""
    return line == "#" or line.startswith("# ")


def expand(lines):
    """@define NAME ... @end blocks, inserted where @use NAME stands."""
    defs = {}
    body = []
    name = None
    for n, line in enumerate(lines, 1):
        if line.startswith("@define "):
            name = line.split()[1]
            defs[name] = []
        elif line == "@end":
            if name is None:
                raise Error("calls.in:%d: @end without @define" % n)
            name = None
        elif name is not None:
            if not is_comment(line):
                defs[name].append(line)
        else:
            body.append(line)
    def insert(lines, depth=0):
        out = []
        for line in lines:
            if line.startswith("@use "):
                key = line.split()[1]
                if key not in defs:
                    raise Error("calls.in: @use %s: not defined" % key)
                if depth > 8:
                    raise Error("calls.in: @use %s: nested too deep" % key)
                out += insert(defs[key], depth + 1)
            else:
                out.append(line)
        return out

    return insert(body)


def parse_calls(path):
    pages = []
    page = None
    target = None  # (kind, payload) being filled with text
    lines = expand(open(path, encoding="utf-8").read().split("\n"))

    def flush():
        nonlocal target
        if target is None:
            return
        kind, obj, buf = target
        text = "\n".join(buf).strip("\n")
        if kind == "param":
            page.params.append((obj, text))
        elif kind == "ret":
            page.rets.append((obj[0], obj[1], text))
        elif kind == "desc":
            page.desc = text
        elif kind == "notes":
            page.notes = text
        elif kind == "synopsis":
            page.synopsis = text
        target = None

    for n, line in enumerate(lines, 1):
        if is_comment(line):
            continue
        if line.startswith("@"):
            flush()
            word, _, rest = line[1:].partition(" ")
            rest = rest.strip()
            if word == "page":
                page = Page(rest, n)
                pages.append(page)
                continue
            if page is None:
                raise Error("calls.in:%d: @%s before any @page" % (n, word))
            if word == "alias":
                page.aliases += rest.split()
            elif word == "brief":
                page.brief = rest
            elif word == "see":
                page.see += rest.split()
            elif word == "noauto":
                page.no_auto |= set(rest.split())
            elif word == "param":
                target = ("param", rest.split(), [])
            elif word == "ret":
                words = rest.split()
                target = ("ret", (words[0], words[1:]), [])
            elif word in ("desc", "notes", "synopsis"):
                target = (word, None, [])
            else:
                raise Error("calls.in:%d: unknown @%s" % (n, word))
            continue
        if target is None:
            if line.strip():
                raise Error("calls.in:%d: text outside a section" % n)
            continue
        target[2].append(line)
    flush()
    return pages


# ------------------------------------------------------------------ roff


def esc(text):
    """Plain text as roff: backslashes doubled, a minus sign where a word
    starts with '-' (options, negative numbers)."""
    text = text.replace("\\", "\\e")
    return re.sub(r"(?<![\w.\-])-(?=[\w\-])", r"\\-", text)


BOLD = re.compile(r"\b(DAT_[A-Z0-9_]+|DAPLRS_[A-Z0-9_]+|dats?_[a-z0-9_]+\(\)|[a-z][a-z0-9_.]*\([1-8]\))")


def inline(text):
    """Inline markup: {param} italic, **x** bold, `x` bold; DAT_ constants
    and name(N) references bold by themselves."""
    out = []
    pos = 0
    for m in re.finditer(r"\{([^{}]+)\}|\*\*(.+?)\*\*|`([^`]+)`", text):
        out.append(auto_bold(text[pos : m.start()]))
        if m.group(1) is not None:
            out.append("\\fI" + esc(m.group(1)) + "\\fP")
        else:
            out.append("\\fB" + esc(m.group(2) or m.group(3)) + "\\fP")
        pos = m.end()
    out.append(auto_bold(text[pos:]))
    return "".join(out)


def auto_bold(text):
    out = []
    pos = 0
    for m in BOLD.finditer(text):
        out.append(esc(text[pos : m.start()]))
        word = m.group(1)
        ref = re.match(r"^(.*)\((\d)\)$", word)
        if word.endswith("()"):
            out.append("\\fB" + esc(word[:-2]) + "\\fP()")
        elif ref:
            out.append("\\fB" + esc(ref.group(1)) + "\\fP(" + ref.group(2) + ")")
        else:
            out.append("\\fB" + esc(word) + "\\fP")
        pos = m.end()
    out.append(esc(text[pos:]))
    return "".join(out)


def safe_line(line):
    if line.startswith(".") or line.startswith("'"):
        return "\\&" + line
    return line


def blocks(text):
    """Text as roff: paragraphs (blank line between), '- ' bullet items,
    lines indented by four spaces as literal blocks."""
    out = []
    paras = re.split(r"\n\s*\n", text.strip("\n"))
    first = True
    for para in paras:
        lines = para.split("\n")
        if all(l.startswith("    ") or not l.strip() for l in lines):
            out.append(".PP")
            out.append(".RS 4")
            out.append(".nf")
            for l in lines:
                out.append(safe_line(esc(l[4:])) if l.strip() else "")
            out.append(".fi")
            out.append(".RE")
        elif lines[0].startswith("- "):
            items = []
            for l in lines:
                if l.startswith("- "):
                    items.append([l[2:]])
                else:
                    items[-1].append(l.strip())
            for item in items:
                out.append(".IP \\(bu 2")
                out.append(safe_line(inline(" ".join(item))))
        else:
            if not first:
                out.append(".PP")
            out.append(safe_line(inline(" ".join(l.strip() for l in lines))))
        first = False
    return out


# ------------------------------------------------------------------ pages


def arg_code(page, apis, headers, param, kind):
    """DAT_INVALID_ARGn (kind 'ARG') or DAT_INVALID_HANDLEn ('HANDLE') of
    `param` (or of the parameter it names under the other API's name), per
    API where they differ."""
    stem = "DAT_INVALID_ARG" if kind == "ARG" else "DAT_INVALID_HANDLE"
    group = [param]
    for names_, _ in page.params:
        if param in names_:
            group = names_
    where = {}
    for api in apis:
        names = [p[1] for p in headers[api][page.name]]
        for n in group:
            if n in names:
                where[api] = names.index(n) + 1
    if not where:
        raise Error("%s: %s(%s): no such parameter" % (page.name, kind, param))
    if len(set(where.values())) == 1 and len(where) == len(apis):
        return ["%s%d" % (stem, list(where.values())[0])]
    return ["%s%d (DAT %s)" % (stem, n, api) for api, n in where.items()]


def code_heading(code, subs):
    parts = ["\\fB" + esc(code) + "\\fP"]
    for s in subs:
        m = re.match(r"^(\S+)( \(DAT [0-9.]+\))?$", s)
        parts.append("\\fB" + esc(m.group(1)) + "\\fP" + (esc(m.group(2)) if m.group(2) else ""))
    return " / ".join(parts) if len(parts) < 3 else parts[0] + " / " + ", ".join(parts[1:])


def proto_lines(name, params):
    lines = []
    head = "DAT_RETURN %s(" % name
    if not params:
        return ['.B "%s);"' % head]
    for i, (ty, pname) in enumerate(params):
        last = i == len(params) - 1
        lead = head if i == 0 else "    "
        end = ");" if last else ","
        if pname == "...":
            lines.append('.B "%s...%s"' % (lead, end))
        else:
            lines.append('.BI "%s%s" %s %s' % (lead, ty, pname, end))
    return lines


def render(page, headers, kinds):
    apis = [a for a in (API20, API12) if page.name in headers[a]]
    if not apis:
        raise Error("%s: declared by neither header" % page.name)
    protos = {a: headers[a][page.name] for a in apis}
    same = len(apis) == 2 and protos[API20] == protos[API12]
    out = []
    title = page.name.upper()
    out.append('.\\" Generated by man/gen-pages.py from man/calls.in and the DAT headers: do not edit.')
    out.append('.TH %s 3 %s "%s" "%s"' % (title, DATE, SOURCE, MANUAL))
    # Identifiers are long: no hyphenation, ragged right.
    out.append(".nh")
    out.append(".ad l")
    out.append(".SH NAME")
    names = ", ".join(esc(n) for n in [page.name] + page.aliases)
    out.append("%s \\- %s" % (names, esc(page.brief)))
    out.append(".SH SYNOPSIS")
    if len(apis) == 1:
        api = apis[0]
        out.append(".nf")
        out.append('.B "#include %s"' % INCLUDE[api])
        out.append(".PP")
        out += proto_lines(page.name, protos[api])
        out.append(".fi")
        out.append(".PP")
        out.append("Link with \\fI%s\\fP (DAT %s, \\fB%s\\fP only)." % (LIB[api], api, LIBNAME[api]))
    elif same:
        out.append(".nf")
        out.append('.BR "#include %s" "    /* DAT 2.0: link with %s */"' % (INCLUDE[API20], LIB[API20]))
        out.append('.BR "#include %s" "     /* DAT 1.2: link with %s */"' % (INCLUDE[API12], LIB[API12]))
        out.append(".PP")
        out += proto_lines(page.name, protos[API20])
        out.append(".fi")
    else:
        if page.synopsis:
            out.append(".nf")
            for l in page.synopsis.split("\n"):
                out.append(safe_line(esc(l)))
            out.append(".fi")
        for api in apis:
            out.append(".SS DAT %s" % api)
            out.append(".nf")
            out.append('.BR "#include %s" "    /* link with %s */"' % (INCLUDE[api], LIB[api]))
            out.append(".PP")
            out += proto_lines(page.name, protos[api])
            out.append(".fi")
    if page.synopsis and (len(apis) == 1 or same):
        out.append(".PP")
        out.append(".nf")
        for l in page.synopsis.split("\n"):
            out.append(safe_line(esc(l)))
        out.append(".fi")

    # PARAMETERS: every parameter of every prototype, once.
    declared = []
    for api in apis:
        for _, p in protos[api]:
            if p not in declared:
                declared.append(p)
    described = {}
    for names_, text in page.params:
        for n in names_:
            if n in described:
                raise Error("%s: @param %s twice" % (page.name, n))
            described[n] = (names_, text)
    missing = [p for p in declared if p not in described]
    extra = [p for p in described if p not in declared]
    if missing or extra:
        raise Error("%s: parameters not described %s, described but not declared %s" % (page.name, missing, extra))
    out.append(".SH PARAMETERS")
    done = set()
    for p in declared:
        names_, text = described[p]
        if names_[0] in done:
            continue
        done.add(names_[0])
        has = {n: [a for a in apis if n in [q[1] for q in protos[a]]] for n in names_}
        if len(names_) > 1:
            # One parameter under two names: the first API's name, then the other's.
            head = "\\fI%s\\fP" % esc(names_[0]) + "".join(
                " (DAT %s: \\fI%s\\fP)" % (has[n][0], esc(n)) for n in names_[1:]
            )
        else:
            only = has[p]
            tag = "" if len(only) == len(apis) else " (DAT %s only)" % only[0]
            head = "\\fI" + esc(p) + "\\fP" + tag
        out.append(".TP")
        out.append(head)
        out += blocks(text)
    out.append(".SH DESCRIPTION")
    out += blocks(page.desc)

    # RETURN VALUES
    out.append(".SH RETURN VALUES")
    intro = "A DAT_RETURN: DAT_SUCCESS, or an error class code whose type and subtype dat_strerror(3) names."
    if len(apis) == 2:
        intro += (
            " The codes below are named as both APIs name them; libdat.so.1 returns the DAT 1.2 value"
            " of each name (DAT 1.2 numbers the subtypes from DAT_INVALID_HANDLE1 on one lower,"
            " from DAT_PRIVILEGES_READ on two lower, and DAT_NOT_IMPLEMENTED is 0x0FFF0000)."
        )
    out.append(inline(intro))
    rets = []
    for code, subs, text in page.rets:
        resolved = []
        for s in subs:
            m = re.match(r"^(ARG|HANDLE)\((\w+)\)$", s)
            resolved += arg_code(page, apis, headers, m.group(2), m.group(1)) if m else [s]
        rets.append((code, resolved, text))
    kind = kinds.get(page.name)
    auto_handle = None
    if kind and "handle" not in page.no_auto:
        k = {kind[a] for a in apis}
        if len(k) != 1:
            raise Error("%s: the registry checks its handle differently per API" % page.name)
        kk, sub, hp = k.pop()
        if kk == "ia":
            auto_handle = (
                "DAT_INVALID_HANDLE",
                ["DAT_INVALID_HANDLE_IA"],
                "{%s} is not the handle of an open IA (the registry checks this before it calls the provider;"
                " the handle of a closed IA stays invalid)." % hp,
            )
        elif kk == "any":
            auto_handle = (
                "DAT_INVALID_HANDLE",
                ["DAT_INVALID_HANDLE1"],
                "{%s} is neither the handle of an open IA nor a live object of a registered provider." % hp,
            )
        else:
            auto_handle = (
                "DAT_INVALID_HANDLE",
                [sub],
                "{%s} is NULL or not an object of a registered provider (the registry's check), or the provider"
                " finds it freed or of another type." % hp,
            )
    for code, subs, _ in rets:
        if auto_handle and (code, subs) == (auto_handle[0], auto_handle[1]):
            raise Error("%s: @ret %s %s is the registry's handle check, written by the generator" % (page.name, code, subs))
    if not rets or rets[0][0] != "DAT_SUCCESS":
        raise Error("%s: the first @ret must be DAT_SUCCESS" % page.name)
    seen_codes = set()
    for code, subs, _ in rets:
        key = (code, tuple(subs))
        if key in seen_codes:
            raise Error("%s: @ret %s %s twice" % (page.name, code, subs))
        seen_codes.add(key)
    ordered = rets[:1] + ([auto_handle] if auto_handle else []) + rets[1:]

    def add_generic(code, text, also):
        # A code the page names already (with no subtype) gets the generic
        # cause as one more sentence.
        for i, (c, s_, t) in enumerate(ordered):
            if c == code and not s_:
                ordered[i] = (c, s_, t + " " + also)
                return
        ordered.append((code, [], text))

    if kind and "notimpl" not in page.no_auto:
        add_generic(
            "DAT_NOT_IMPLEMENTED",
            "The provider that serves the handle left this call out of its table"
            " (the providers of udapl-rs implement every call).",
            "Also when the provider that serves the handle left the call out of its table.",
        )
    if "internal" not in page.no_auto:
        add_generic(
            "DAT_INTERNAL_ERROR",
            "An internal failure (a Rust panic inside the library is caught at its boundary and returned as"
            " this code instead of unwinding into the program).",
            "Also for an internal failure, such as a Rust panic caught at the library's boundary.",
        )
    for code, subs, text in ordered:
        out.append(".TP")
        out.append(code_heading(code, subs))
        out += blocks(text)
    if page.notes:
        out.append(".SH NOTES")
        out += blocks(page.notes)
    see = []
    for s in page.see + ["daplrs(7)"]:
        if "(" not in s:
            s += "(3)"
        if s not in see:
            see.append(s)
    out.append(".SH SEE ALSO")
    out.append(",\n".join(".BR %s (%s)" % (esc(s[: s.index("(")]), s[s.index("(") + 1 : -1]) for s in see))
    return "\n".join(out) + "\n"


def alias_page(target):
    return ".so man3/%s.3\n" % target


def generate():
    headers = load_headers()
    check_lists(headers)
    kinds = dispatch_kinds()
    pages = parse_calls(os.path.join(MAN, "calls.in"))
    files = {}
    seen = set()
    for page in pages:
        for n in [page.name] + page.aliases:
            if n in seen:
                raise Error("%s: a page for it twice" % n)
            seen.add(n)
        if page.brief is None:
            raise Error("%s: no @brief" % page.name)
        files[page.name + ".3"] = render(page, headers, kinds)
        for a in page.aliases:
            files[a + ".3"] = alias_page(page.name)
    undocumented = sorted(n for n in set(headers[API20]) | set(headers[API12]) if n not in seen)
    if undocumented:
        raise Error("declared but without a page in calls.in: " + " ".join(undocumented))
    for s in [s for p in pages for s in p.see]:
        base = s.split("(")[0]
        if "(" not in s and base not in seen:
            raise Error("@see %s: no such page" % s)
    return files


def main():
    check = "--check" in sys.argv[1:]
    try:
        files = generate()
    except Error as e:
        print("gen-pages: %s" % e, file=sys.stderr)
        return 1
    present = {f for f in os.listdir(OUT) if f.endswith(".3")} if os.path.isdir(OUT) else set()
    if check:
        bad = []
        for f, text in sorted(files.items()):
            path = os.path.join(OUT, f)
            if f not in present:
                bad.append("missing %s" % f)
            elif open(path, encoding="utf-8").read() != text:
                bad.append("stale %s" % f)
        for f in sorted(present - set(files)):
            bad.append("left over %s (not generated from calls.in)" % f)
        if bad:
            print("gen-pages: man/man3 is not what man/gen-pages.py writes: " + ", ".join(bad), file=sys.stderr)
            print("gen-pages: run python3 man/gen-pages.py", file=sys.stderr)
            return 1
        return 0
    os.makedirs(OUT, exist_ok=True)
    for f in sorted(present - set(files)):
        os.remove(os.path.join(OUT, f))
    for f, text in files.items():
        path = os.path.join(OUT, f)
        old = open(path, encoding="utf-8").read() if os.path.exists(path) else None
        if old != text:
            with open(path, "w", encoding="utf-8") as out:
                out.write(text)
    print("gen-pages: %d files in man/man3" % len(files))
    return 0


if __name__ == "__main__":
    sys.exit(main())

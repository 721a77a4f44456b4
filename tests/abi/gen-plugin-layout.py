#!/usr/bin/env python3
"""Writes tests/abi/plugin-layout.h: the size of every struct te-plugin.h
and the headers it includes define and the offset of each member, as this
compiler lays them out.

usage: gen-plugin-layout.py SOURCE_ROOT [CC]

Run by tools/abi-update.sh after a deliberate change to the plugin ABI; the
test plugin-layout then holds the header to the table."""
import os
import re
import subprocess
import sys
import tempfile

root = sys.argv[1]
cc = sys.argv[2] if len(sys.argv) > 2 else os.environ.get("CC", "cc")
headers = ["te-plugin.h", "te-host.h", "te-transport.h", "te-metadata.h", "te-device.h",
           "te-exporter.h"]
text = "\n".join(open(os.path.join(root, "include", "te", h)).read() for h in headers)
text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
text = re.sub(r"//[^\n]*", " ", text)
text = re.sub(r"^\s*#[^\n]*(\\\n[^\n]*)*", " ", text, flags=re.M)

structs = []  # (type name as code uses it, [members])
for m in re.finditer(r"(typedef\s+)?struct\s+(\w+)\s*\{(.*?)\}\s*(\w*)\s*;", text, flags=re.S):
    typedef, tag, body, alias = m.groups()
    name = alias if (typedef and alias) else "struct " + tag
    members = []
    for decl in body.split(";"):
        decl = " ".join(decl.split())
        if not decl:
            continue
        fn = re.search(r"\(\s*\*\s*(\w+)\s*\)", decl)
        if fn:
            members.append(fn.group(1))
            continue
        decl = re.sub(r"\[[^\]]*\]", "", decl)
        members.append(re.findall(r"\w+", decl)[-1])
    structs.append((name, members))

prog = ['#include <stddef.h>', '#include <stdio.h>', '#include <te/te-plugin.h>', 'int main(void)', '{']
for name, members in structs:
    # A table that starts with its own size grows at the end by design
    # (TE_HAS_OP); any other struct keeps its size.
    kind = "GROWS" if members and members[0] == "size" else "SIZE"
    prog.append(f'\tprintf("{kind}(%s, %zu)\\n", "{name}", sizeof({name}));')
    for mem in members:
        prog.append(f'\tprintf("MEMBER(%s, {mem}, %zu)\\n", "{name}", offsetof({name}, {mem}));')
prog += ['\treturn 0;', '}']

with tempfile.TemporaryDirectory() as tmp:
    src = os.path.join(tmp, "gen.c")
    exe = os.path.join(tmp, "gen")
    open(src, "w").write("\n".join(prog) + "\n")
    subprocess.run([cc, "-std=c11", "-D_GNU_SOURCE", "-I", os.path.join(root, "include"),
                    "-o", exe, src], check=True)
    rows = subprocess.run([exe], check=True, capture_output=True, text=True).stdout

out = os.path.join(root, "tests", "abi", "plugin-layout.h")
with open(out, "w") as f:
    f.write("/* The layout of te-plugin.h's structs on x86_64 (LP64) as released:\n"
            " * written by tools/abi-update.sh (tests/abi/gen-plugin-layout.py), read\n"
            " * by plugin-layout.c. Plugins built against an older header must find\n"
            " * every member where they left it. SIZE: the size is fixed; GROWS: a\n"
            " * table led by its size, which may only grow (members added at the end). */\n")
    f.write(rows)
print(f"wrote {out}: {len(structs)} structs")

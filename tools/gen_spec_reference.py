#!/usr/bin/env python3
"""Generates docs/spec_reference.md from proto/muon/v1/coordinator.proto.

The job spec reference (JobSpec and every message it uses: Mesh, MeshDim,
ParamSpec, OptimizerOptions, ExecutionOptions) is written from the proto's
own comments, so it changes when the proto does:

    python3 tools/gen_spec_reference.py > docs/spec_reference.md
    python3 tools/gen_spec_reference.py --out docs/spec_reference.md

Per field: its name (and its lowerCamelCase JSON name, which the spec
reader accepts too), its type and label, and its comment: the `//` lines
right before the field and a trailing `//` comment on the same line. A
field without a comment of its own that directly follows (no blank line)
a commented field shares that field's comment block, and says so. The
JSON example is the one in common/spec.h's header comment.

Python 3.11, standard library only. tests/python/test_spec_reference.py
checks that the committed docs/spec_reference.md equals this output.
"""
import argparse
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROTO = "proto/muon/v1/coordinator.proto"
SPEC_H = "common/spec.h"
ROOT_MESSAGE = "JobSpec"

SCALARS = {
    "double", "float", "int32", "int64", "uint32", "uint64", "sint32",
    "sint64", "fixed32", "fixed64", "sfixed32", "sfixed64", "bool",
    "string", "bytes",
}

# What each scalar looks like in the JSON spec file (protobuf's JSON
# mapping: 64-bit integers may also be written as strings).
JSON_KIND = {
    "double": "number", "float": "number", "int32": "integer",
    "uint32": "integer", "sint32": "integer", "fixed32": "integer",
    "sfixed32": "integer", "int64": "integer", "uint64": "integer",
    "sint64": "integer", "fixed64": "integer", "sfixed64": "integer",
    "bool": "true/false", "string": "string", "bytes": "base64 string",
}

FIELD_RE = re.compile(
    r"^(?:(?P<label>optional|repeated)\s+)?"
    r"(?P<type>map\s*<\s*\w+\s*,\s*[\w.]+\s*>|[\w.]+)\s+"
    r"(?P<name>\w+)\s*=\s*(?P<number>\d+)\s*(?:\[[^\]]*\])?\s*;"
    r"\s*(?://\s?(?P<trailing>.*))?$")
MESSAGE_RE = re.compile(r"^message\s+(\w+)\s*\{\s*(\})?\s*$")


class Field:
    def __init__(self, name, number, label, type_, comment, trailing,
                 shared_from):
        self.name = name
        self.number = number
        self.label = label
        self.type = type_
        self.comment = comment      # list of lines
        self.trailing = trailing    # str or None
        self.shared_from = shared_from  # name of the field whose block it shares


class Message:
    def __init__(self, name, comment):
        self.name = name
        self.comment = comment
        self.fields = []


def _comment_text(line):
    text = line.strip()[2:]
    return text[1:] if text.startswith(" ") else text


def parse_proto(text):
    """Returns {name: Message} for the top-level messages of a proto file."""
    messages = {}
    pending = []          # `//` lines seen since the last blank/code line
    current = None
    depth = 0
    last_field = None     # previous field in the current message
    last_block_owner = None  # field that owns the comment block in effect
    blank_since_field = True
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            pending = []
            blank_since_field = True
            continue
        if line.startswith("//"):
            pending.append(_comment_text(line))
            continue
        if current is None:
            m = MESSAGE_RE.match(line)
            if m:
                current = Message(m.group(1), pending)
                messages[current.name] = current
                depth = 1
                last_field = None
                last_block_owner = None
                blank_since_field = True
                if m.group(2):
                    current = None
                    depth = 0
            pending = []
            continue
        # Inside a message.
        if depth == 1:
            m = FIELD_RE.match(line)
            if m:
                label = m.group("label") or ""
                type_ = re.sub(r"\s+", "", m.group("type"))
                if type_.startswith("map<"):
                    label = "map"
                    type_ = type_.replace(",", ", ")
                shared = None
                if pending:
                    last_block_owner = m.group("name")
                elif (not blank_since_field and last_field is not None
                      and last_block_owner is not None
                      and not m.group("trailing")):
                    shared = last_block_owner
                else:
                    last_block_owner = None
                field = Field(m.group("name"), int(m.group("number")),
                              label, type_, pending, m.group("trailing"),
                              shared)
                current.fields.append(field)
                last_field = field
                blank_since_field = False
                pending = []
                continue
        depth += line.count("{") - line.count("}")
        pending = []
        if depth <= 0:
            current = None
            depth = 0
    return messages


def referenced_messages(messages, root):
    """Root first, then the message types it uses, depth first in field order."""
    order = []

    def visit(name):
        if name in order or name not in messages:
            return
        order.append(name)
        for f in messages[name].fields:
            t = f.type
            if t.startswith("map<"):
                t = t[4:-1].split(",")[1].strip()
            visit(t.split(".")[-1])

    visit(root)
    return order


def spec_h_example(text):
    """The example part of common/spec.h's header comment, as text lines."""
    header = []
    for line in text.splitlines():
        if not line.startswith("//"):
            break
        header.append(_comment_text(line))
    start = next(i for i, l in enumerate(header) if l.startswith("Example"))
    end = len(header)
    for i in range(start + 1, len(header)):
        if header[i].startswith("Thread-safety"):
            end = i
            break
    body = header[start + 1:end]
    while body and not body[-1].strip():
        body.pop()
    intro = []
    for i in range(0, start):
        intro.append(header[i])
    return intro, body


def camel(name):
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def type_cell(field, messages):
    t = field.type
    if field.label == "map":
        k, v = t[4:-1].split(", ")
        vk = (f"[{v}](#{v.lower()})" if v in messages
              else f"`{v}` ({JSON_KIND.get(v, v)})")
        return f"map `{k}` → {vk} (JSON object)"
    base = (f"[{t}](#{t.lower()})" if t in messages
            else f"`{t}` ({JSON_KIND.get(t, t)})")
    if field.label == "repeated":
        return f"repeated {base} (JSON array)"
    if field.label == "optional":
        return f"optional {base}"
    return base


def escape_cell(text):
    return text.replace("|", "\\|")


def render(proto_text, spec_h_text):
    messages = parse_proto(proto_text)
    order = referenced_messages(messages, ROOT_MESSAGE)
    out = []
    w = out.append
    w("<!-- Generated by tools/gen_spec_reference.py from "
      f"{PROTO} and {SPEC_H}; do not edit by hand. -->")
    w("<!-- Regenerate: python3 tools/gen_spec_reference.py --out "
      "docs/spec_reference.md -->")
    w("")
    w("# Job spec reference")
    w("")
    w("A job spec is one JSON file in protobuf's JSON mapping of "
      f"`muon.v1.{ROOT_MESSAGE}` ({PROTO}). `muonctl plan`, `muonctl "
      "validate`, `muonctl schedule --spec` and `muonctl report` read it; "
      "`muonctl spec` and `muonrt.spec_from_module` / `muonrt.write_spec` "
      "build one. Field "
      "names may be written in snake_case or lowerCamelCase; an unknown "
      "field is an error. This page is generated from the proto's "
      "comments; the field tables list each field's proto type and "
      "its comment.")
    w("")
    w("Messages: " + ", ".join(f"[{n}](#{n.lower()})" for n in order) + ".")
    w("")
    w("## Example")
    w("")
    intro, example = spec_h_example(spec_h_text)
    w(f"From {SPEC_H}'s header comment:")
    w("")
    # Indented lines are JSON, unindented ones prose between the snippets.
    in_code = False
    for line in example:
        code = line.startswith("  ")
        if code and not in_code:
            w("```json")
            in_code = True
        elif not code and in_code:
            w("```")
            w("")
            in_code = False
        w(line[2:].rstrip() if code else line.rstrip())
        if not code:
            w("")
    if in_code:
        w("```")
    w("")
    for name in order:
        msg = messages[name]
        w(f"## {name}")
        w("")
        if msg.comment:
            w(" ".join(l.strip() for l in msg.comment if l.strip()))
            w("")
        w("| field | JSON name | type | description |")
        w("|---|---|---|---|")
        for f in msg.fields:
            parts = []
            if f.comment:
                parts.append(" ".join(l.strip() for l in f.comment
                                      if l.strip()))
            if f.trailing:
                parts.append(f.trailing.strip())
            if f.shared_from:
                parts.append(f"(Shares the comment of `{f.shared_from}` "
                             "above.)")
            desc = " ".join(parts) if parts else "(no comment in the proto)"
            json_name = camel(f.name)
            json_cell = (f"`{f.name}` / `{json_name}`"
                         if json_name != f.name else f"`{f.name}`")
            w(f"| `{f.name}` | {json_cell} | "
              f"{escape_cell(type_cell(f, messages))} | "
              f"{escape_cell(desc)} |")
        w("")
    return "\n".join(out)


def generate(repo=REPO):
    with open(os.path.join(repo, PROTO), encoding="utf-8") as f:
        proto_text = f.read()
    with open(os.path.join(repo, SPEC_H), encoding="utf-8") as f:
        spec_h_text = f.read()
    return render(proto_text, spec_h_text) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write here instead of stdout")
    parser.add_argument("--repo", default=REPO,
                        help="repository root (default: this file's)")
    args = parser.parse_args(argv)
    text = generate(args.repo)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Writes memsnap's man pages and its bash and zsh completion from the program's own --help.

    scripts/gen-man-completion.py MEMSNAP OUTDIR

OUTDIR receives man/man1/memsnap.1 and man/man1/memsnap-CMD.1 (one per command),
bash-completion/memsnap and zsh/_memsnap. Everything comes from `MEMSNAP --help` (the commands
and their summaries) and `MEMSNAP CMD --help` (usage, description, options): the text that the
commands print from the same option tables they parse, so the three cannot drift from --help
(tests/man/run.sh checks that they match it).
"""
import os
import re
import subprocess
import sys

OPTION_HEAD = re.compile(r"^ {1,4}(-[^ ].*?)(?: {2,}(.*))?$")


def run(memsnap, *args):
    return subprocess.run([memsnap, *args], check=True, capture_output=True, text=True).stdout


def commands(memsnap):
    text = run(memsnap, "--help")
    lines = text.split("\n")
    i = lines.index("commands:")
    out = []
    for line in lines[i + 1:]:
        m = re.match(r"^   (\S+)\s+(.*)$", line)
        if not m:
            break
        out.append((m.group(1), m.group(2)))
    return text, out


def option_names(head):
    """The option names in an option's head: '-o, --output OUT' -> ['-o', '--output']."""
    names = []
    for part in head.split(", "):
        tok = part.split(" ")[0].split("=")[0]
        if re.match(r"^--?[A-Za-z0-9][\w-]*$", tok):
            names.append(tok)
    return names


def parse_help(text):
    """(usage lines, description lines, [(head, [description lines])])."""
    lines = text.rstrip("\n").split("\n")
    usage, desc, opts = [], [], []
    i = 0
    while i < len(lines) and (lines[i].startswith("usage:") or lines[i].startswith("       ")
                              or (usage and lines[i].startswith(" ") and lines[i].strip().startswith("["))):
        usage.append(lines[i])
        i += 1
    while i < len(lines) and lines[i] != "options:":
        desc.append(lines[i])
        i += 1
    i += 1
    cur = None
    while i < len(lines):
        line = lines[i]
        m = OPTION_HEAD.match(line)
        if m and line.strip().startswith("-"):
            cur = (m.group(1).strip(), [m.group(2) or ""])
            opts.append(cur)
        elif cur is not None and line.strip():
            cur[1].append(line.strip())
        i += 1
    return usage, desc, opts


def roff(s):
    s = s.replace("\\", "\\e").replace("-", "\\-")
    if s.startswith(".") or s.startswith("'"):
        s = "\\&" + s
    return s


def man_page(name, summary, usage, desc, opts, see_also):
    out = [f'.TH {name.upper()} 1 "" "memsnap" "memsnap manual"', ".SH NAME",
           roff(f"{name} - {summary}"), ".SH SYNOPSIS", ".nf"]
    for u in usage:
        out.append(roff(re.sub(r"^usage: ", "", u).strip()))
    out += [".fi", ".SH DESCRIPTION"]
    para = []
    for line in desc + [""]:
        if line.strip():
            para.append(line.strip())
        elif para:
            out += [".PP", roff(" ".join(para))]
            para = []
    if opts:
        out.append(".SH OPTIONS")
        for head, text in opts:
            out += [".TP", roff(head), roff(" ".join(t for t in text if t))]
    out += [".SH SEE ALSO", roff(", ".join(see_also))]
    return "\n".join(out) + "\n"


def bash_completion(cmds, optmap):
    cases = []
    for c, _ in cmds:
        cases.append(f'    {c}) opts="{" ".join(optmap[c])}" ;;')
    names = " ".join(c for c, _ in cmds)
    return f"""# bash completion for memsnap, generated from its --help by scripts/gen-man-completion.py
_memsnap() {{
  local cur=${{COMP_WORDS[COMP_CWORD]}} opts=""
  if [ "$COMP_CWORD" -eq 1 ]; then
    COMPREPLY=($(compgen -W "{names} --help --version" -- "$cur"))
    return
  fi
  case ${{COMP_WORDS[1]}} in
{chr(10).join(cases)}
  esac
  if [[ $cur == -* ]]; then
    COMPREPLY=($(compgen -W "$opts" -- "$cur"))
  else
    COMPREPLY=($(compgen -f -- "$cur"))
  fi
}}
complete -o filenames -F _memsnap memsnap
"""


def zsh_completion(cmds, optmap):
    described = "\n".join("    '%s:%s'" % (c, s.replace("'", "'\\''").replace(":", "\\:"))
                          for c, s in cmds)
    cases = "\n".join(f"    {c}) opts=({' '.join(optmap[c])}) ;;" for c, _ in cmds)
    return f"""#compdef memsnap
# zsh completion for memsnap, generated from its --help by scripts/gen-man-completion.py
_memsnap() {{
  local -a cmds opts
  cmds=(
{described}
  )
  if (( CURRENT == 2 )); then
    _describe 'memsnap command' cmds
    return
  fi
  case $words[2] in
{cases}
  esac
  if [[ $PREFIX == -* ]]; then
    compadd -- $opts
  else
    _files
  fi
}}
_memsnap "$@"
"""


def main():
    memsnap, outdir = sys.argv[1], sys.argv[2]
    main_help, cmds = commands(memsnap)
    mandir = os.path.join(outdir, "man", "man1")
    os.makedirs(mandir, exist_ok=True)
    os.makedirs(os.path.join(outdir, "bash-completion"), exist_ok=True)
    os.makedirs(os.path.join(outdir, "zsh"), exist_ok=True)
    optmap = {}
    for c, summary in cmds:
        usage, desc, opts = parse_help(run(memsnap, c, "--help"))
        optmap[c] = [n for head, _ in opts for n in option_names(head)]
        with open(os.path.join(mandir, f"memsnap-{c}.1"), "w") as f:
            f.write(man_page(f"memsnap-{c}", summary, usage, desc, opts, ["memsnap(1)"]))
    usage, desc, _ = parse_help(main_help.split("commands:")[0])
    page = man_page("memsnap", "GPU memory snapshots: statistics, traces, flame graphs, a viewer",
                    usage, desc, [], [f"memsnap-{c}(1)" for c, _ in cmds])
    page = page.replace(".SH SEE ALSO", ".SH COMMANDS\n" + "\n".join(
        ".TP\n" + roff(f"memsnap {c}") + "\n" + roff(s) for c, s in cmds) + "\n.SH COMMON OPTIONS\n"
        ".TP\n\\-q, \\-\\-quiet\nno line on stderr saying what output file was written\n"
        ".TP\n\\-\\-force (also \\-f where a command has no \\-f of its own)\nwrite a default\\-named "
        "output over a file that memsnap did not write\n"
        ".TP\n\\-h, \\-\\-help\nthe command's help (also memsnap help COMMAND)\n"
        ".PP\nA long option may be shortened to any unambiguous prefix (\\-\\-out for \\-\\-output), "
        "and \\-d is \\-\\-device in every command that has one.\n"
        ".SH ENVIRONMENT\n"
        ".TP\nNO_COLOR\nmemsnap writes no colour today; if it ever does, it writes none when "
        "NO_COLOR is set to a non\\-empty value or the output is not a terminal, and \\-\\-color="
        "always|never|auto overrides (docs/cli.md).\n.SH SEE ALSO")
    with open(os.path.join(mandir, "memsnap.1"), "w") as f:
        f.write(page)
    with open(os.path.join(outdir, "bash-completion", "memsnap"), "w") as f:
        f.write(bash_completion(cmds, optmap))
    with open(os.path.join(outdir, "zsh", "_memsnap"), "w") as f:
        f.write(zsh_completion(cmds, optmap))
    return 0


if __name__ == "__main__":
    sys.exit(main())

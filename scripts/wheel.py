#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Builds memsnap's wheel from a build tree, with the standard library and patchelf only.

    scripts/wheel.py BUILD_DIR OUT_DIR      -> OUT_DIR/memsnap-<version>-py3-none-linux_x86_64.whl

The wheel holds the Python package (python/memsnap), the program as memsnap/bin/memsnap (run by
the `memsnap` command that pip writes from entry_points.txt), and memsnap/lib/: the shared
libraries, libmemsnap_preload.so, and every library they need that is not on the allowed list
below, as auditwheel does: copied under a name with a hash of its content (libxml2-1a2b3c4d.so.2)
so that it cannot clash with another copy in the same process, its soname and the DT_NEEDED
entries naming it rewritten, and RUNPATH $ORIGIN on every library ($ORIGIN/../lib on the program).
Debug information is stripped from memsnap's own files. A release pipeline would instead build in
a manylinux container and let `auditwheel repair` do this step (docs/python.md).
"""
import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

# What a plain Linux machine has (the manylinux policy's libraries that memsnap can need).
ALLOWED = {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1", "libz.so.1",
           "libstdc++.so.6", "libgcc_s.so.1", "ld-linux-x86-64.so.2", "linux-vdso.so.1"}
OWN = ["libmemsnap_core.so.0", "libmemsnap_viz.so.0", "libmemsnap_preload.so"]
TAG = "py3-none-linux_x86_64"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sh(*args):
    return subprocess.run(args, check=True, stdout=subprocess.PIPE).stdout.decode()


def needed(path):
    return sh("patchelf", "--print-needed", path).split()


def resolve(path):
    """soname -> file, as the loader finds them for path (ldd)."""
    out = {}
    for line in sh("ldd", path).splitlines():
        m = re.match(r"\s*(\S+) => (/\S+)", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def bundled_name(soname, src):
    digest = hashlib.sha256(open(src, "rb").read()).hexdigest()[:8]
    stem, dot, rest = soname.partition(".so")
    return f"{stem}-{digest}.so{rest}"


def stage(build, pkg):
    """Copies the package, the program and the libraries into pkg; bundles and relinks."""
    shutil.copytree(os.path.join(ROOT, "python", "memsnap"), pkg,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    os.makedirs(os.path.join(pkg, "bin"))
    os.makedirs(os.path.join(pkg, "lib"))
    elves = [shutil.copy(os.path.join(build, "bin", "memsnap"), os.path.join(pkg, "bin"))]
    for name in OWN:
        elves.append(shutil.copy(os.path.realpath(os.path.join(build, "lib", name)),
                                 os.path.join(pkg, "lib", name)))
    for e in elves:
        subprocess.run(["strip", "--strip-debug", e], check=True)
    renames, queue = {}, list(elves)
    while queue:  # the closure of DT_NEEDED outside the allowed list, each library copied once
        e = queue.pop()
        where = resolve(e)
        for so in needed(e):
            if so in ALLOWED or so in OWN or so in renames:
                continue
            if so not in where:
                sys.exit(f"wheel: {os.path.basename(e)} needs {so}, which ldd cannot find")
            new = bundled_name(so, where[so])
            dst = shutil.copy(where[so], os.path.join(pkg, "lib", new))
            os.chmod(dst, 0o755)
            subprocess.run(["patchelf", "--set-soname", new, dst], check=True)
            renames[so] = new
            elves.append(dst)
            queue.append(dst)
    for e in elves:
        args = []
        for so in needed(e):
            if so in renames:
                args += ["--replace-needed", so, renames[so]]
        if args:
            subprocess.run(["patchelf", *args, e], check=True)
        rpath = "$ORIGIN/../lib" if e.endswith("/bin/memsnap") else "$ORIGIN"
        subprocess.run(["patchelf", "--set-rpath", rpath, e], check=True)
    return renames


def record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: scripts/wheel.py BUILD_DIR OUT_DIR")
    build, out = sys.argv[1], sys.argv[2]
    for tool in ("patchelf", "ldd", "strip"):
        if not shutil.which(tool):
            sys.exit(f"wheel: {tool} not found (scripts/deps.sh wheel installs what is missing)")
    version = sh(os.path.join(build, "bin", "memsnap"), "version").split()[-1]
    if not re.fullmatch(r"\d+(\.\d+)*", version):
        sys.exit(f"wheel: unexpected version '{version}' from memsnap version")
    readme = open(os.path.join(ROOT, "docs", "python.md"), encoding="utf-8").read()
    dist = f"memsnap-{version}.dist-info"
    meta = {
        f"{dist}/METADATA": (f"Metadata-Version: 2.1\nName: memsnap\nVersion: {version}\n"
                             "Summary: GPU memory snapshots of PyTorch and CUDA programs: "
                             "answers, exports and an offline viewer\n"
                             "License: MIT\nRequires-Python: >=3.8\n"
                             "Description-Content-Type: text/markdown\n\n" + readme),
        f"{dist}/WHEEL": (f"Wheel-Version: 1.0\nGenerator: memsnap scripts/wheel.py\n"
                          f"Root-Is-Purelib: false\nTag: {TAG}\n"),
        f"{dist}/entry_points.txt": "[console_scripts]\nmemsnap = memsnap.__main__:main\n",
        f"{dist}/top_level.txt": "memsnap\n",
    }
    with tempfile.TemporaryDirectory() as tmp:
        renames = stage(build, os.path.join(tmp, "memsnap"))
        os.makedirs(out, exist_ok=True)
        whl = os.path.join(out, f"memsnap-{version}-{TAG}.whl")
        part = whl + ".part"
        records = []
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
            for dp, dn, fn in os.walk(os.path.join(tmp, "memsnap")):
                dn.sort()
                for f in sorted(fn):
                    full = os.path.join(dp, f)
                    arc = os.path.relpath(full, tmp)
                    data = open(full, "rb").read()
                    info = zipfile.ZipInfo(arc, date_time=(2020, 1, 1, 0, 0, 0))
                    info.external_attr = (os.stat(full).st_mode & 0o777 | 0o100000) << 16
                    info.compress_type = zipfile.ZIP_DEFLATED
                    z.writestr(info, data)
                    records.append(record_line(arc, data))
            for arc, text in meta.items():
                data = text.encode()
                z.writestr(zipfile.ZipInfo(arc, date_time=(2020, 1, 1, 0, 0, 0)), data,
                           zipfile.ZIP_DEFLATED)
                records.append(record_line(arc, data))
            records.append(f"{dist}/RECORD,,")
            z.writestr(zipfile.ZipInfo(f"{dist}/RECORD", date_time=(2020, 1, 1, 0, 0, 0)),
                       "\n".join(records) + "\n", zipfile.ZIP_DEFLATED)
        os.replace(part, whl)
    print(f"wheel: {whl} ({os.path.getsize(whl) / 1e6:.1f} MB; bundled: "
          f"{', '.join(sorted(renames.values())) or 'nothing'})")


if __name__ == "__main__":
    main()

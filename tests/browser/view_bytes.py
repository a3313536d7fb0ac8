#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Writes an HTML element holding every byte value 0..255, then the byte sequences the HTML parser
# would change or that would end the element (CR LF, CR, NUL, "<!--<script>", "</script"), escaped
# as `memsnap view` escapes its binary data (docs/view.md, "The bytes of the page"; written here
# independently of viz/view/bin.c), narrow and (a second element) not, for tests/browser/view.sh:
# view_test.js checks that the text Chromium's parser made of it under the page's windows-1252
# declaration is one character per byte (narrow: each of the code of its byte), and that the
# page's decoder gives back exactly these bytes from both.
# usage: view_bytes.py OUT.html
import sys

DATA = bytes(range(256)) + b"\r\n\r\x00\x00<!--<script></script></SCRIPT ==\xff\x80\x9d"
# NUL, CR, '<', '=' (the escape byte), and 0x80-0x9F but the five bytes windows-1252 leaves
# undefined (which decode to U+0081 ... themselves)
WIDE = {0x00, 0x0D, 0x3C, 0x3D}
NARROW = WIDE | (set(range(0x80, 0xA0)) - {0x81, 0x8D, 0x8F, 0x90, 0x9D})
def escaped(esc):
    out = bytearray()
    for b in DATA:
        if b in esc:
            out += bytes([0x3D, (b + 64) & 255])
        else:
            out.append(b)
    return bytes(out)
with open(sys.argv[1], "wb") as f:
    f.write(b'<script type="application/octet-stream" id="ms-test-bytes">' + escaped(NARROW) + b"</script>\n")
    f.write(b'<script type="application/octet-stream" id="ms-test-bytes-wide">' + escaped(WIDE) + b"</script>\n")

/* SPDX-License-Identifier: MIT
 * memsnap viz: a minimal XML writer for the SVG pages, over libxml2's xmlTextWriter.
 *
 * This is the only file of memsnap that includes libxml2 (docs/contributing.md). The writer
 * escapes every attribute value and every text node itself, so no caller ever escapes by hand.
 * Output goes through an xmlOutputBuffer whose write callback forwards to an ms_sink_t; the first
 * error (the sink's own ms_err, or a libxml2 failure) is kept and returned by every later call
 * and by ms__svg_close(), so callers can check each call and clean up once.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libxml/xmlIO.h>
#include <libxml/xmlwriter.h>

#include "flamegraph/internal.h"

struct ms__svg {
  xmlTextWriterPtr writer;
  /* libxml2 reports I/O failures through its (thread-local) error handlers, which print to
   * stderr by default; the library never prints, so they are silenced while we write and the
   * caller's handlers are restored by ms__svg_close(). Our errors are returned instead. */
  xmlGenericErrorFunc old_generic;
  void *old_generic_ctx;
  xmlStructuredErrorFunc old_structured;
  void *old_structured_ctx;
  ms_sink_t *sink;
  int err;  /* first error seen, MS_OK while none */
  char *fmt; /* scratch for ms__svg_attrf */
  size_t fmt_cap;
};

static int svg_write_cb(void *ctx, const char *buf, int len) {
  ms__svg_t *w = ctx;
  if (w->err) return -1;
  if (len <= 0) return 0;
  int err = w->sink->write(w->sink->ctx, buf, (size_t)len);
  if (err != MS_OK) {
    w->err = err < 0 ? err : MS_EIO;
    return -1;
  }
  return len;
}

static void svg_silent_generic(void *ctx, const char *msg, ...) {
  (void)ctx;
  (void)msg;
}

static void svg_silent_structured(void *ctx, xmlErrorPtr err) {
  (void)ctx;
  (void)err;
}

static void svg_restore_handlers(ms__svg_t *w) {
  xmlSetGenericErrorFunc(w->old_generic_ctx, w->old_generic);
  xmlSetStructuredErrorFunc(w->old_structured_ctx, w->old_structured);
}

static int svg_close_cb(void *ctx) {
  (void)ctx;
  return 0;
}

/* Maps a libxml2 return value: negative means failure. */
static int svg_check(ms__svg_t *w, int rc) {
  if (w->err) return w->err;
  if (rc < 0) w->err = MS_EIO;
  return w->err;
}

int ms__svg_open(ms_sink_t *sink, ms__svg_t **out) {
  ms__svg_t *w = calloc(1, sizeof *w);
  if (!w) return MS_ENOMEM;
  w->sink = sink;
  w->old_generic = xmlGenericError;
  w->old_generic_ctx = xmlGenericErrorContext;
  w->old_structured = xmlStructuredError;
  w->old_structured_ctx = xmlStructuredErrorContext;
  xmlSetGenericErrorFunc(NULL, svg_silent_generic);
  xmlSetStructuredErrorFunc(NULL, svg_silent_structured);
  xmlOutputBufferPtr ob = xmlOutputBufferCreateIO(svg_write_cb, svg_close_cb, w, NULL);
  if (!ob) {
    svg_restore_handlers(w);
    free(w);
    return MS_ENOMEM;
  }
  w->writer = xmlNewTextWriter(ob); /* owns ob from here, also on failure paths below */
  if (!w->writer) {
    xmlOutputBufferClose(ob);
    svg_restore_handlers(w);
    free(w);
    return MS_ENOMEM;
  }
  int err = svg_check(w, xmlTextWriterSetIndent(w->writer, 0));
  if (!err) err = svg_check(w, xmlTextWriterStartDocument(w->writer, "1.0", "UTF-8", "no"));
  if (err) {
    xmlFreeTextWriter(w->writer);
    svg_restore_handlers(w);
    free(w);
    return err;
  }
  *out = w;
  return MS_OK;
}

int ms__svg_close(ms__svg_t *w) {
  if (!w) return MS_OK;
  if (!w->err) svg_check(w, xmlTextWriterEndDocument(w->writer));
  if (!w->err) svg_check(w, xmlTextWriterFlush(w->writer));
  xmlFreeTextWriter(w->writer); /* also closes the output buffer */
  svg_restore_handlers(w);
  int err = w->err;
  free(w->fmt);
  free(w);
  return err;
}

int ms__svg_doctype(ms__svg_t *w, const char *name, const char *pubid, const char *sysid) {
  if (w->err) return w->err;
  return svg_check(w, xmlTextWriterWriteDTD(w->writer, BAD_CAST name, BAD_CAST pubid,
                                            BAD_CAST sysid, NULL));
}

int ms__svg_start(ms__svg_t *w, const char *elem) {
  if (w->err) return w->err;
  return svg_check(w, xmlTextWriterStartElement(w->writer, BAD_CAST elem));
}

int ms__svg_end(ms__svg_t *w) {
  if (w->err) return w->err;
  return svg_check(w, xmlTextWriterEndElement(w->writer));
}

int ms__svg_attr(ms__svg_t *w, const char *name, const char *value) {
  if (w->err) return w->err;
  return svg_check(w, xmlTextWriterWriteAttribute(w->writer, BAD_CAST name, BAD_CAST value));
}

int ms__svg_attrf(ms__svg_t *w, const char *name, const char *fmt, ...) {
  if (w->err) return w->err;
  char small[64];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) return w->err = MS_EINVAL;
  if ((size_t)n < sizeof small) return ms__svg_attr(w, name, small);
  if ((size_t)n + 1 > w->fmt_cap) {
    char *b = realloc(w->fmt, (size_t)n + 1);
    if (!b) return w->err = MS_ENOMEM;
    w->fmt = b;
    w->fmt_cap = (size_t)n + 1;
  }
  va_start(ap, fmt);
  vsnprintf(w->fmt, w->fmt_cap, fmt, ap);
  va_end(ap);
  return ms__svg_attr(w, name, w->fmt);
}

int ms__svg_text(ms__svg_t *w, const char *s, size_t len) {
  if (w->err) return w->err;
  if (len == 0) return MS_OK;
  if (len > INT32_MAX) return w->err = MS_ELIMIT;
  /* xmlTextWriterWriteString needs a NUL-terminated string; s is a slice. */
  if (len + 1 > w->fmt_cap) {
    char *b = realloc(w->fmt, len + 1);
    if (!b) return w->err = MS_ENOMEM;
    w->fmt = b;
    w->fmt_cap = len + 1;
  }
  memcpy(w->fmt, s, len);
  w->fmt[len] = 0;
  return svg_check(w, xmlTextWriterWriteString(w->writer, BAD_CAST w->fmt));
}

int ms__svg_cdata(ms__svg_t *w, const char *s) {
  if (w->err) return w->err;
  return svg_check(w, xmlTextWriterWriteCDATA(w->writer, BAD_CAST s));
}

int ms__svg_comment(ms__svg_t *w, const char *s) {
  if (w->err) return w->err;
  return svg_check(w, xmlTextWriterWriteComment(w->writer, BAD_CAST s));
}

int ms__svg_raw(ms__svg_t *w, const char *s) {
  if (w->err) return w->err;
  return svg_check(w, xmlTextWriterWriteRaw(w->writer, BAD_CAST s));
}

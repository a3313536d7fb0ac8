/* SPDX-License-Identifier: MIT
 * Tests for the backend table and the simulated device: selection by name, table validation,
 * cudaMalloc-like capacity, deterministic addresses and their reuse, forced addresses, fault
 * injection, streams and events completed by the test, counters, the call log, host memory. */
#include <criterion/criterion.h>
#include <string.h>

#include "memsnap/backend.h"

static ms_backend_t *sim_new(size_t capacity, int ndev, size_t log) {
  ms_sim_config_t c = {.ndevices = ndev, .capacity = capacity, .log_capacity = log};
  ms_backend_t *b = NULL;
  cr_assert_eq(ms_backend_sim_create(&c, &b), MS_OK);
  return b;
}

#define OPS(b) ms_backend_ops(b)
#define MiB ((size_t)1 << 20)

Test(backend, open_by_name) {
  ms_backend_t *b = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(ms_backend_open("sim", &b, &eb), MS_OK);
  cr_assert_str_eq(ms_backend_name(b), "sim");
  cr_assert(ms_backend_is_sim(b));
  int n = 0;
  cr_assert_eq(OPS(b)->device_count(OPS(b)->ctx, &n), MS_OK);
  cr_assert_eq(n, 1);
  size_t fr, tot;
  cr_assert_eq(OPS(b)->mem_info(OPS(b)->ctx, 0, &fr, &tot), MS_OK);
  cr_assert_eq(tot, (size_t)80 << 30);
  cr_assert_eq(fr, tot);
  ms_backend_destroy(b);

  ms_backend_t *keep = (ms_backend_t *)0x1;
  cr_assert_eq(ms_backend_open("nope", &keep, &eb), MS_ENOTFOUND);
  cr_assert_eq(keep, (ms_backend_t *)0x1, "out-param untouched on failure");
  cr_assert_str_eq(eb.msg, "unknown backend 'nope' (known: sim, cuda)");
  ms_backend_destroy(NULL);
}

#ifndef MS_HAVE_CUDA
Test(backend, cuda_without_toolkit_is_a_clear_error) {
  ms_backend_t *b = NULL;
  ms_errbuf_t eb;
  int r = ms_backend_open("cuda", &b, &eb);
  if (r == MS_OK) {
    ms_backend_destroy(b);
    cr_skip_test("SKIP: this build has the cuda backend");
  }
  cr_assert(r == MS_EUNSUPPORTED || r == MS_ENODEVICE || r == MS_EBACKEND);
  cr_assert(strstr(eb.msg, "cuda") != NULL, "message: %s", eb.msg);
}
#endif

static int op_dc(void *c, int *n) {
  (void)c;
  *n = 1;
  return MS_OK;
}

Test(backend, create_validates_the_table) {
  ms_backend_ops_t ops;
  memset(&ops, 0, sizeof ops);
  ops.name = "x";
  ops.device_count = op_dc;
  ms_backend_t *b = NULL;
  cr_assert_eq(ms_backend_create(&ops, &b), MS_EINVAL);
  cr_assert_null(b);
  cr_assert_eq(ms_backend_create(NULL, &b), MS_EINVAL);
  /* a complete table copied from sim, but with only some of the va ops: refused */
  ms_backend_t *s = sim_new(0, 1, 0);
  ops = *OPS(s);
  ops.destroy = NULL; /* the copy must not free sim's ctx */
  ops.mem_unmap = NULL;
  cr_assert_eq(ms_backend_create(&ops, &b), MS_EINVAL);
  ops.va_reserve = NULL;
  ops.va_release = NULL;
  ops.mem_map = NULL;
  cr_assert_eq(ms_backend_create(&ops, &b), MS_OK);
  cr_assert_str_eq(ms_backend_name(b), "sim");
  ms_backend_destroy(b);
  ms_backend_destroy(s);
}

Test(backend, sim_malloc_is_cudamalloc_like) {
  ms_backend_t *b = sim_new(100 * MiB, 1, 0);
  const ms_backend_ops_t *o = OPS(b);
  ms_devptr_t p1 = 0, p2 = 0, p3 = 0, keep = 77;
  cr_assert_eq(o->malloc(o->ctx, 0, 60 * MiB, 0, &p1), MS_OK);
  cr_assert_eq(p1, MS_SIM_BASE_ADDRESS, "first segment at the window's base");
  cr_assert_eq(o->malloc(o->ctx, 0, 50 * MiB, 0, &keep), MS_EOOM, "does not fit in free");
  cr_assert_eq(keep, 77);
  cr_assert_eq(o->malloc(o->ctx, 0, 40 * MiB, 0, &p2), MS_OK, "exactly the rest fits");
  cr_assert_eq(p2, MS_SIM_BASE_ADDRESS + 60 * MiB);
  size_t fr, tot;
  cr_assert_eq(o->mem_info(o->ctx, 0, &fr, &tot), MS_OK);
  cr_assert_eq(fr, 0);
  cr_assert_eq(o->free(o->ctx, 0, p1), MS_OK);
  cr_assert_eq(o->free(o->ctx, 0, p1), MS_EINVAL, "double free is an error");
  /* no address-space fragmentation: 60 MiB free in one hole; 50 fits there (lowest gap) */
  cr_assert_eq(o->malloc(o->ctx, 0, 50 * MiB, 0, &p3), MS_OK);
  cr_assert_eq(p3, MS_SIM_BASE_ADDRESS, "freed range reused, lowest address first");
  cr_assert_eq(o->malloc(o->ctx, 0, 0, 0, &keep), MS_EINVAL);
  cr_assert_eq(o->malloc(o->ctx, 1, MiB, 0, &keep), MS_ENODEVICE);
  ms_sim_counters_t c;
  cr_assert_eq(ms_sim_get_counters(b, 0, &c), MS_OK);
  cr_assert_eq(c.mallocs, 5);
  cr_assert_eq(c.malloc_ooms, 1);
  cr_assert_eq(c.frees, 2);
  cr_assert_eq(c.mem_infos, 1);
  cr_assert_eq(c.used_bytes, 90 * MiB);
  cr_assert_eq(c.peak_used_bytes, 100 * MiB);
  cr_assert_eq(c.live_allocations, 2);
  ms_backend_destroy(b);
}

Test(backend, sim_devices_have_separate_windows_and_capacity) {
  ms_backend_t *b = sim_new(10 * MiB, 3, 0);
  const ms_backend_ops_t *o = OPS(b);
  ms_devptr_t p;
  for (int d = 0; d < 3; d++) {
    cr_assert_eq(o->malloc(o->ctx, d, 10 * MiB, 0, &p), MS_OK);
    cr_assert_eq(p, MS_SIM_BASE_ADDRESS + (ms_devptr_t)d * MS_SIM_DEVICE_STRIDE);
    cr_assert_eq(o->malloc(o->ctx, d, 512, 0, &p), MS_EOOM);
  }
  cr_assert_eq(ms_sim_set_capacity(b, 1, 20 * MiB), MS_OK);
  cr_assert_eq(o->malloc(o->ctx, 1, 512, 0, &p), MS_OK);
  cr_assert_eq(p, MS_SIM_BASE_ADDRESS + MS_SIM_DEVICE_STRIDE + MS_SIM_ALIGNMENT * 5,
               "aligned after the 10 MiB range");
  ms_backend_destroy(b);
}

Test(backend, sim_fault_injection_and_forced_address) {
  ms_backend_t *b = sim_new(0, 1, 0);
  const ms_backend_ops_t *o = OPS(b);
  ms_devptr_t p;
  cr_assert_eq(ms_sim_fail_nth_malloc(b, 0, 2), MS_OK);
  cr_assert_eq(o->malloc(o->ctx, 0, MiB, 0, &p), MS_OK);
  cr_assert_eq(o->malloc(o->ctx, 0, MiB, 0, &p), MS_EOOM, "the 2nd allocation fails");
  cr_assert_eq(o->malloc(o->ctx, 0, MiB, 0, &p), MS_OK, "one-shot");
  ms_devptr_t want = MS_SIM_BASE_ADDRESS + 64 * MiB;
  cr_assert_eq(ms_sim_set_next_address(b, 0, want), MS_OK);
  cr_assert_eq(o->malloc(o->ctx, 0, 4 * MiB, 0, &p), MS_OK);
  cr_assert_eq(p, want);
  cr_assert_eq(ms_sim_set_next_address(b, 0, want + 2 * MiB), MS_OK);
  cr_assert_eq(o->malloc(o->ctx, 0, 2 * MiB, 0, &p), MS_EBACKEND, "overlaps a live range");
  cr_assert_eq(o->malloc(o->ctx, 0, 2 * MiB, 0, &p), MS_OK, "the override was consumed");
  cr_assert_eq(p, MS_SIM_BASE_ADDRESS + 4 * MiB);
  ms_backend_destroy(b);
}

Test(backend, sim_events_complete_when_the_test_says) {
  ms_backend_t *b = sim_new(0, 1, 0);
  const ms_backend_ops_t *o = OPS(b);
  ms_stream_t s1, s2;
  cr_assert_eq(o->stream_create(o->ctx, 0, &s1), MS_OK);
  cr_assert_eq(o->stream_create(o->ctx, 0, &s2), MS_OK);
  cr_assert_eq(s1, 1);
  cr_assert_eq(s2, 2);
  ms_event_t e1, e2, e3;
  cr_assert_eq(o->event_create(o->ctx, 0, &e1), MS_OK);
  cr_assert_eq(o->event_create(o->ctx, 0, &e2), MS_OK);
  cr_assert_eq(o->event_create(o->ctx, 0, &e3), MS_OK);
  bool done = false;
  cr_assert_eq(o->event_query(o->ctx, 0, e1, &done), MS_OK);
  cr_assert(done, "an event never recorded is complete");
  cr_assert_eq(o->event_record(o->ctx, 0, e1, s1), MS_OK);
  cr_assert_eq(o->event_record(o->ctx, 0, e2, s1), MS_OK);
  cr_assert_eq(o->event_record(o->ctx, 0, e3, s2), MS_OK);
  cr_assert_eq(o->event_query(o->ctx, 0, e1, &done), MS_OK);
  cr_assert_not(done);
  cr_assert_eq(ms_sim_event_complete(b, 0, e2), MS_OK);
  cr_assert_eq(o->event_query(o->ctx, 0, e1, &done), MS_OK);
  cr_assert(done, "completing e2 completes e1 before it on the same stream");
  cr_assert_eq(o->event_query(o->ctx, 0, e3, &done), MS_OK);
  cr_assert_not(done, "other streams are independent");
  cr_assert_eq(o->event_synchronize(o->ctx, 0, e3), MS_OK);
  cr_assert_eq(ms_sim_event_is_complete(b, 0, e3, &done), MS_OK);
  cr_assert(done);
  cr_assert_eq(o->event_record(o->ctx, 0, e3, s2), MS_OK);
  cr_assert_eq(ms_sim_stream_complete(b, 0, s2), MS_OK);
  cr_assert_eq(ms_sim_event_is_complete(b, 0, e3, &done), MS_OK);
  cr_assert(done);
  cr_assert_eq(o->event_record(o->ctx, 0, e3, s2), MS_OK);
  cr_assert_eq(o->device_synchronize(o->ctx, 0), MS_OK);
  cr_assert_eq(ms_sim_event_is_complete(b, 0, e3, &done), MS_OK);
  cr_assert(done);
  cr_assert_eq(ms_sim_set_auto_complete(b, true), MS_OK);
  cr_assert_eq(o->event_record(o->ctx, 0, e1, s1), MS_OK);
  cr_assert_eq(o->event_query(o->ctx, 0, e1, &done), MS_OK);
  cr_assert(done, "auto-complete mode");
  cr_assert_eq(o->event_destroy(o->ctx, 0, e1), MS_OK);
  cr_assert_eq(o->event_query(o->ctx, 0, e1, &done), MS_EINVAL);
  ms_event_t e4;
  cr_assert_eq(o->event_create(o->ctx, 0, &e4), MS_OK);
  cr_assert_eq(e4, e1, "event handles are reused");
  cr_assert_eq(o->stream_destroy(o->ctx, 0, 0), MS_EINVAL, "the default stream stays");
  cr_assert_eq(o->stream_destroy(o->ctx, 0, s1), MS_OK);
  cr_assert_eq(o->event_record(o->ctx, 0, e4, s1), MS_EINVAL);
  ms_sim_counters_t c;
  cr_assert_eq(ms_sim_get_counters(b, 0, &c), MS_OK);
  cr_assert_eq(c.event_creates, 4);
  cr_assert_eq(c.event_records, 7);
  cr_assert_eq(c.event_queries, 6);
  cr_assert_eq(c.event_syncs, 1);
  cr_assert_eq(c.device_syncs, 1);
  cr_assert_eq(c.stream_creates, 2);
  cr_assert_eq(c.stream_destroys, 2);
  cr_assert_eq(ms_sim_reset_counters(b, 0), MS_OK);
  cr_assert_eq(ms_sim_get_counters(b, 0, &c), MS_OK);
  cr_assert_eq(c.event_records, 0);
  ms_backend_destroy(b);
}

Test(backend, sim_call_log_keeps_the_last_calls_in_order) {
  ms_backend_t *b = sim_new(4 * MiB, 1, 3);
  const ms_backend_ops_t *o = OPS(b);
  ms_devptr_t p, q;
  size_t fr, tot;
  cr_assert_eq(o->malloc(o->ctx, 0, MiB, 5, &p), MS_OK);
  cr_assert_eq(o->malloc(o->ctx, 0, 8 * MiB, 5, &q), MS_EOOM);
  cr_assert_eq(o->mem_info(o->ctx, 0, &fr, &tot), MS_OK);
  cr_assert_eq(o->free(o->ctx, 0, p), MS_OK);
  ms_sim_call_t log[8];
  size_t n = 0;
  cr_assert_eq(ms_sim_get_log(b, log, 8, &n), MS_OK);
  cr_assert_eq(n, 3, "capacity 3 keeps the last 3");
  cr_assert_eq(log[0].op, MS_SIM_OP_MALLOC);
  cr_assert_eq(log[0].result, MS_EOOM);
  cr_assert_eq(log[0].size, 8 * MiB);
  cr_assert_eq(log[0].handle, 5);
  cr_assert_eq(log[1].op, MS_SIM_OP_MEM_INFO);
  cr_assert_eq(log[2].op, MS_SIM_OP_FREE);
  cr_assert_eq(log[2].addr, p);
  cr_assert_str_eq(ms_sim_op_name(log[2].op), "free");
  cr_assert_str_eq(ms_sim_op_name(MS_SIM_OP_EVENT_SYNCHRONIZE), "event_synchronize");
  cr_assert_eq(ms_sim_clear_log(b), MS_OK);
  cr_assert_eq(ms_sim_get_log(b, log, 8, &n), MS_OK);
  cr_assert_eq(n, 0);
  ms_backend_destroy(b);
}

Test(backend, sim_host_memory_behind_allocations) {
  ms_sim_config_t c = {.host_memory = true, .capacity = 64 * MiB};
  ms_backend_t *b = NULL;
  cr_assert_eq(ms_backend_sim_create(&c, &b), MS_OK);
  const ms_backend_ops_t *o = OPS(b);
  ms_devptr_t p;
  cr_assert_eq(o->malloc(o->ctx, 0, MiB, 0, &p), MS_OK);
  void *h1 = NULL, *h2 = NULL;
  cr_assert_eq(ms_sim_host_ptr(b, 0, p, &h1), MS_OK);
  cr_assert_eq(ms_sim_host_ptr(b, 0, p + 1000, &h2), MS_OK);
  cr_assert_eq((char *)h2 - (char *)h1, 1000);
  memset(h1, 0xab, MiB); /* the program can touch what it allocated */
  cr_assert_eq(ms_sim_host_ptr(b, 0, p + MiB, &h2), MS_ENOTFOUND);
  cr_assert_eq(o->free(o->ctx, 0, p), MS_OK);
  cr_assert_eq(ms_sim_host_ptr(b, 0, p, &h2), MS_ENOTFOUND);
  ms_backend_destroy(b);
  ms_backend_t *nb = sim_new(0, 1, 0);
  cr_assert_eq(ms_sim_host_ptr(nb, 0, MS_SIM_BASE_ADDRESS, &h2), MS_EUNSUPPORTED);
  ms_backend_destroy(nb);
}

Test(backend, sim_virtual_memory_ops) {
  ms_backend_t *b = sim_new(10 * MiB, 1, 0);
  const ms_backend_ops_t *o = OPS(b);
  ms_devptr_t va;
  cr_assert_eq(o->va_reserve(o->ctx, 0, 64 * MiB, &va), MS_OK, "reservation is not capacity");
  cr_assert_eq(o->mem_map(o->ctx, 0, va, 4 * MiB), MS_OK);
  cr_assert_eq(o->mem_map(o->ctx, 0, va + 4 * MiB, 8 * MiB), MS_EOOM);
  cr_assert_eq(o->mem_map(o->ctx, 0, va + 3 * MiB, 2 * MiB), MS_EINVAL, "unaligned");
  cr_assert_eq(o->va_release(o->ctx, 0, va, 64 * MiB), MS_EINVAL, "still mapped");
  cr_assert_eq(o->mem_unmap(o->ctx, 0, va, 4 * MiB), MS_OK);
  cr_assert_eq(o->va_release(o->ctx, 0, va, 64 * MiB), MS_OK);
  ms_sim_counters_t c;
  cr_assert_eq(ms_sim_get_counters(b, 0, &c), MS_OK);
  cr_assert_eq(c.used_bytes, 0);
  cr_assert_eq(c.mem_maps, 3);
  ms_backend_destroy(b);
}

Test(backend, sim_controls_refuse_other_backends) {
  ms_backend_t *s = sim_new(0, 1, 0);
  ms_backend_ops_t ops = *OPS(s);
  ops.destroy = NULL;
  ops.device_count = op_dc; /* no longer recognised as sim */
  ms_backend_t *b = NULL;
  cr_assert_eq(ms_backend_create(&ops, &b), MS_OK);
  cr_assert_not(ms_backend_is_sim(b));
  cr_assert_eq(ms_sim_set_capacity(b, 0, 1), MS_EINVAL);
  ms_sim_counters_t c;
  cr_assert_eq(ms_sim_get_counters(b, 0, &c), MS_EINVAL);
  cr_assert_eq(ms_sim_get_counters(s, 5, &c), MS_ENODEVICE);
  ms_backend_destroy(b);
  ms_backend_destroy(s);
}

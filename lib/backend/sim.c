/* SPDX-License-Identifier: MIT
 * memsnap core: the simulated device ("sim"), a GPU made of bookkeeping.
 *
 * It lets every part of memsnap run and be tested without a GPU (style §8, RMM's
 * simulated_memory_resource). Each device has a capacity and an address window
 * [MS_SIM_BASE_ADDRESS + d * MS_SIM_DEVICE_STRIDE, + MS_SIM_DEVICE_STRIDE). malloc behaves like
 * cudaMalloc: it fails with MS_EOOM when the request exceeds capacity minus what is live, never
 * because of address-space fragmentation. Addresses are deterministic: the lowest
 * MS_SIM_ALIGNMENT-aligned gap of the window that fits (freed ranges are reused, as the CUDA
 * driver does), or the address forced by ms_sim_set_next_address (replay of recorded traces).
 *
 * Streams are FIFO queues of work that the program "runs": each stream counts the events recorded
 * on it (recorded) and how many of those have completed (completed). An event completes when
 * completed >= its sequence number: on ms_sim_stream_complete, ms_sim_event_complete,
 * event_synchronize, device_synchronize, or at once in auto-complete mode.
 *
 * Every call is counted per device and optionally logged (a ring of the last N calls), so tests
 * can check which device operations the allocator made, and in which order.
 *
 * Thread-safety: one mutex per backend guards everything; every entry point takes it.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_internal.h"
#include "common/internal.h"
#include "common/vec.h"

typedef struct sim_range_s {
  ms_devptr_t addr; /* start, MS_SIM_ALIGNMENT-aligned */
  size_t size;      /* bytes counted against capacity (malloc size; 0 for a VA reservation) */
  size_t span;      /* bytes of the window it occupies (aligned) */
  size_t mapped;    /* VA reservations: bytes currently mapped with mem_map */
  bool is_va;       /* a va_reserve range */
  void *host;       /* host memory (host_memory mode, malloc ranges only) */
} sim_range_t;

typedef struct sim_stream_s {
  uint64_t recorded;  /* events recorded on the stream so far */
  uint64_t completed; /* events completed so far (FIFO: the first `completed` ones) */
  bool live;
} sim_stream_t;

typedef struct sim_event_s {
  ms_stream_t stream; /* stream of the last record */
  uint64_t seq;       /* 1-based position among the stream's records; 0 = never recorded */
  bool live;
} sim_event_t;

typedef struct sim_device_s {
  size_t capacity;
  MS_VEC(sim_range_t) ranges; /* sorted by addr */
  MS_VEC(sim_stream_t) streams; /* handle = index; 0 = default stream */
  MS_VEC(sim_event_t) events;   /* handle = index + 1 */
  MS_VEC(uint64_t) free_events; /* destroyed event indices, reused LIFO */
  uint64_t fail_countdown;      /* the nth next device allocation fails; 0 = off */
  ms_devptr_t next_addr;        /* forced address of the next malloc; 0 = none */
  ms_sim_counters_t c;
} sim_device_t;

typedef struct sim_s {
  pthread_mutex_t mu;
  int ndevices;
  bool host_memory;
  bool auto_complete;
  sim_device_t dev[MS_SIM_MAX_DEVICES];
  ms_sim_call_t *log; /* ring */
  size_t log_cap, log_len, log_head;
} sim_t;

static void sim_log(sim_t *s, ms_sim_op op, int device, int result, uint64_t addr, uint64_t size,
                    uint64_t handle) {
  if (!s->log_cap) return;
  size_t i = (s->log_head + s->log_len) % s->log_cap;
  if (s->log_len == s->log_cap) {
    s->log_head = (s->log_head + 1) % s->log_cap;
  } else {
    s->log_len++;
  }
  s->log[i] = (ms_sim_call_t){op, device, result, addr, size, handle};
}

static ms_devptr_t sim_window(int device) {
  return MS_SIM_BASE_ADDRESS + (ms_devptr_t)device * MS_SIM_DEVICE_STRIDE;
}

static size_t sim_align(size_t n) {
  return (n + MS_SIM_ALIGNMENT - 1) & ~(MS_SIM_ALIGNMENT - 1);
}

static bool sim_valid_device(const sim_t *s, int device) {
  return device >= 0 && device < s->ndevices;
}

/* Finds where a range of `span` bytes goes: *addr and the insertion index. Uses the forced
 * address when one is set. @return MS_OK, MS_EBACKEND (forced address overlaps or is outside the
 * window), MS_EOOM (window full: cannot happen while capacity < stride). */
static int sim_place(sim_device_t *d, int device, size_t span, ms_devptr_t forced,
                     ms_devptr_t *addr, size_t *index) {
  ms_devptr_t lo = sim_window(device), hi = lo + MS_SIM_DEVICE_STRIDE;
  size_t n = d->ranges.len;
  if (forced) {
    if (forced < lo || forced > hi || span > hi - forced) return MS_EBACKEND;
    size_t i = 0;
    while (i < n && d->ranges.ptr[i].addr + d->ranges.ptr[i].span <= forced) i++;
    if (i < n && d->ranges.ptr[i].addr < forced + span) return MS_EBACKEND;
    *addr = forced;
    *index = i;
    return MS_OK;
  }
  ms_devptr_t cand = lo;
  for (size_t i = 0; i < n; i++) {
    const sim_range_t *r = &d->ranges.ptr[i];
    if (cand + span <= r->addr) {
      *addr = cand;
      *index = i;
      return MS_OK;
    }
    cand = r->addr + r->span;
  }
  if (span > hi - cand) return MS_EOOM;
  *addr = cand;
  *index = n;
  return MS_OK;
}

static int sim_insert_range(sim_device_t *d, size_t index, const sim_range_t *r) {
  if (MS_VEC_RESERVE(&d->ranges, 1) != 0) return MS_ENOMEM;
  memmove(&d->ranges.ptr[index + 1], &d->ranges.ptr[index],
          (d->ranges.len - index) * sizeof *r);
  d->ranges.ptr[index] = *r;
  d->ranges.len++;
  return MS_OK;
}

/* @return the index of the range starting exactly at addr, or SIZE_MAX. */
static size_t sim_find_range(const sim_device_t *d, ms_devptr_t addr) {
  size_t lo = 0, hi = d->ranges.len;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (d->ranges.ptr[mid].addr < addr) lo = mid + 1;
    else hi = mid;
  }
  return lo < d->ranges.len && d->ranges.ptr[lo].addr == addr ? lo : SIZE_MAX;
}

/* @return the index of the range containing addr, or SIZE_MAX. */
static size_t sim_find_containing(const sim_device_t *d, ms_devptr_t addr) {
  size_t lo = 0, hi = d->ranges.len;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (d->ranges.ptr[mid].addr <= addr) lo = mid + 1;
    else hi = mid;
  }
  if (lo == 0) return SIZE_MAX;
  const sim_range_t *r = &d->ranges.ptr[lo - 1];
  return addr < r->addr + r->span ? lo - 1 : SIZE_MAX;
}

/* Charges size bytes of a device allocation against capacity and the fault injector. */
static int sim_charge(sim_device_t *d, size_t size) {
  if (d->fail_countdown) {
    if (--d->fail_countdown == 0) return MS_EOOM;
  }
  if (size > d->capacity || d->c.used_bytes > d->capacity - size) return MS_EOOM;
  return MS_OK;
}

static void sim_account(sim_device_t *d, size_t size) {
  d->c.used_bytes += size;
  if (d->c.used_bytes > d->c.peak_used_bytes) d->c.peak_used_bytes = d->c.used_bytes;
}

/* ---- the ops table --------------------------------------------------------------------------- */

static int sim_device_count(void *ctx, int *count) {
  sim_t *s = ctx;
  *count = s->ndevices;
  return MS_OK;
}

static int sim_malloc_locked(sim_t *s, int device, size_t size, ms_devptr_t *out) {
  sim_device_t *d = &s->dev[device];
  ms_devptr_t forced = d->next_addr;
  d->next_addr = 0;
  MS_RETURN_IF(size == 0 || size > MS_SIM_DEVICE_STRIDE, size == 0 ? MS_EINVAL : MS_EOOM);
  MS_FORWARD_IF_ERROR(sim_charge(d, size));
  size_t span = sim_align(size), index;
  ms_devptr_t addr;
  MS_FORWARD_IF_ERROR(sim_place(d, device, span, forced, &addr, &index));
  sim_range_t r = {addr, size, span, 0, false, NULL};
  if (s->host_memory) {
    r.host = calloc(1, size);
    MS_RETURN_IF(!r.host, MS_ENOMEM);
  }
  int e = sim_insert_range(d, index, &r);
  if (e != MS_OK) {
    free(r.host);
    return e;
  }
  sim_account(d, size);
  d->c.live_allocations++;
  *out = addr;
  return MS_OK;
}

static int sim_malloc(void *ctx, int device, size_t size, ms_stream_t stream, ms_devptr_t *out) {
  sim_t *s = ctx;
  MS_RETURN_IF(!sim_valid_device(s, device), MS_ENODEVICE);
  pthread_mutex_lock(&s->mu);
  sim_device_t *d = &s->dev[device];
  ms_devptr_t addr = 0;
  int r = sim_malloc_locked(s, device, size, &addr);
  d->c.mallocs++;
  if (r == MS_EOOM) d->c.malloc_ooms++;
  sim_log(s, MS_SIM_OP_MALLOC, device, r, r == MS_OK ? addr : 0, size, stream);
  pthread_mutex_unlock(&s->mu);
  if (r == MS_OK) *out = addr;
  return r;
}

static int sim_free(void *ctx, int device, ms_devptr_t ptr) {
  sim_t *s = ctx;
  MS_RETURN_IF(!sim_valid_device(s, device), MS_ENODEVICE);
  pthread_mutex_lock(&s->mu);
  sim_device_t *d = &s->dev[device];
  d->c.frees++;
  size_t i = sim_find_range(d, ptr);
  int r = MS_OK;
  if (i == SIZE_MAX || d->ranges.ptr[i].is_va) {
    r = MS_EINVAL;
  } else {
    sim_range_t *rg = &d->ranges.ptr[i];
    d->c.used_bytes -= rg->size;
    d->c.live_allocations--;
    free(rg->host);
    memmove(rg, rg + 1, (d->ranges.len - i - 1) * sizeof *rg);
    d->ranges.len--;
  }
  sim_log(s, MS_SIM_OP_FREE, device, r, ptr, 0, 0);
  pthread_mutex_unlock(&s->mu);
  return r;
}

static int sim_mem_info(void *ctx, int device, size_t *free_bytes, size_t *total_bytes) {
  sim_t *s = ctx;
  MS_RETURN_IF(!sim_valid_device(s, device), MS_ENODEVICE);
  pthread_mutex_lock(&s->mu);
  sim_device_t *d = &s->dev[device];
  d->c.mem_infos++;
  size_t fr = d->c.used_bytes < d->capacity ? d->capacity - d->c.used_bytes : 0;
  size_t tot = d->capacity;
  sim_log(s, MS_SIM_OP_MEM_INFO, device, MS_OK, 0, fr, 0);
  pthread_mutex_unlock(&s->mu);
  *free_bytes = fr;
  *total_bytes = tot;
  return MS_OK;
}

static int sim_stream_create(void *ctx, int device, ms_stream_t *out) {
  sim_t *s = ctx;
  MS_RETURN_IF(!sim_valid_device(s, device), MS_ENODEVICE);
  pthread_mutex_lock(&s->mu);
  sim_device_t *d = &s->dev[device];
  d->c.stream_creates++;
  sim_stream_t st = {0, 0, true};
  int r = MS_VEC_PUSH(&d->streams, st) == 0 ? MS_OK : MS_ENOMEM;
  ms_stream_t h = r == MS_OK ? (ms_stream_t)(d->streams.len - 1) : 0;
  sim_log(s, MS_SIM_OP_STREAM_CREATE, device, r, 0, 0, h);
  pthread_mutex_unlock(&s->mu);
  if (r == MS_OK) *out = h;
  return r;
}

static sim_stream_t *sim_stream(sim_device_t *d, ms_stream_t h) {
  if (h >= d->streams.len || !d->streams.ptr[h].live) return NULL;
  return &d->streams.ptr[h];
}

static int sim_stream_destroy(void *ctx, int device, ms_stream_t stream) {
  sim_t *s = ctx;
  MS_RETURN_IF(!sim_valid_device(s, device), MS_ENODEVICE);
  pthread_mutex_lock(&s->mu);
  sim_device_t *d = &s->dev[device];
  d->c.stream_destroys++;
  sim_stream_t *st = stream ? sim_stream(d, stream) : NULL;
  int r = st ? MS_OK : MS_EINVAL;
  if (st) {
    /* Destroying a stream lets its queued work finish (cudaStreamDestroy semantics). */
    st->completed = st->recorded;
    st->live = false;
  }
  sim_log(s, MS_SIM_OP_STREAM_DESTROY, device, r, 0, 0, stream);
  pthread_mutex_unlock(&s->mu);
  return r;
}

static sim_event_t *sim_event(sim_device_t *d, ms_event_t h) {
  if (h == 0 || h > d->events.len || !d->events.ptr[h - 1].live) return NULL;
  return &d->events.ptr[h - 1];
}

static bool sim_event_done(sim_device_t *d, const sim_event_t *e) {
  if (e->seq == 0) return true;
  return e->stream >= d->streams.len || d->streams.ptr[e->stream].completed >= e->seq;
}

static void sim_complete_event(sim_device_t *d, const sim_event_t *e) {
  if (e->seq == 0 || e->stream >= d->streams.len) return;
  sim_stream_t *st = &d->streams.ptr[e->stream];
  if (st->completed < e->seq) st->completed = e->seq;
}

static int sim_event_create(void *ctx, int device, ms_event_t *out) {
  sim_t *s = ctx;
  MS_RETURN_IF(!sim_valid_device(s, device), MS_ENODEVICE);
  pthread_mutex_lock(&s->mu);
  sim_device_t *d = &s->dev[device];
  d->c.event_creates++;
  int r = MS_OK;
  ms_event_t h = 0;
  sim_event_t ev = {0, 0, true};
  if (d->free_events.len) {
    uint64_t i = d->free_events.ptr[--d->free_events.len];
    d->events.ptr[i] = ev;
    h = i + 1;
  } else if (MS_VEC_PUSH(&d->events, ev) == 0) {
    h = d->events.len;
  } else {
    r = MS_ENOMEM;
  }
  sim_log(s, MS_SIM_OP_EVENT_CREATE, device, r, 0, 0, h);
  pthread_mutex_unlock(&s->mu);
  if (r == MS_OK) *out = h;
  return r;
}

static int sim_event_record(void *ctx, int device, ms_event_t event, ms_stream_t stream) {
  sim_t *s = ctx;
  MS_RETURN_IF(!sim_valid_device(s, device), MS_ENODEVICE);
  pthread_mutex_lock(&s->mu);
  sim_device_t *d = &s->dev[device];
  d->c.event_records++;
  sim_event_t *e = sim_event(d, event);
  sim_stream_t *st = sim_stream(d, stream);
  int r = e && st ? MS_OK : MS_EINVAL;
  if (r == MS_OK) {
    e->stream = stream;
    e->seq = ++st->recorded;
    if (s->auto_complete) st->completed = st->recorded;
  }
  sim_log(s, MS_SIM_OP_EVENT_RECORD, device, r, 0, stream, event);
  pthread_mutex_unlock(&s->mu);
  return r;
}

static int sim_event_query(void *ctx, int device, ms_event_t event, bool *done) {
  sim_t *s = ctx;
  MS_RETURN_IF(!sim_valid_device(s, device), MS_ENODEVICE);
  pthread_mutex_lock(&s->mu);
  sim_device_t *d = &s->dev[device];
  d->c.event_queries++;
  sim_event_t *e = sim_event(d, event);
  int r = e ? MS_OK : MS_EINVAL;
  bool dn = e && sim_event_done(d, e);
  sim_log(s, MS_SIM_OP_EVENT_QUERY, device, r, 0, dn, event);
  pthread_mutex_unlock(&s->mu);
  if (r == MS_OK) *done = dn;
  return r;
}

static int sim_event_synchronize(void *ctx, int device, ms_event_t event) {
  sim_t *s = ctx;
  MS_RETURN_IF(!sim_valid_device(s, device), MS_ENODEVICE);
  pthread_mutex_lock(&s->mu);
  sim_device_t *d = &s->dev[device];
  d->c.event_syncs++;
  sim_event_t *e = sim_event(d, event);
  int r = e ? MS_OK : MS_EINVAL;
  if (e) sim_complete_event(d, e);
  sim_log(s, MS_SIM_OP_EVENT_SYNCHRONIZE, device, r, 0, 0, event);
  pthread_mutex_unlock(&s->mu);
  return r;
}

static int sim_event_destroy(void *ctx, int device, ms_event_t event) {
  sim_t *s = ctx;
  MS_RETURN_IF(!sim_valid_device(s, device), MS_ENODEVICE);
  pthread_mutex_lock(&s->mu);
  sim_device_t *d = &s->dev[device];
  d->c.event_destroys++;
  sim_event_t *e = sim_event(d, event);
  int r = e ? MS_OK : MS_EINVAL;
  if (e) {
    if (MS_VEC_PUSH(&d->free_events, event - 1) == 0) e->live = false;
  }
  sim_log(s, MS_SIM_OP_EVENT_DESTROY, device, r, 0, 0, event);
  pthread_mutex_unlock(&s->mu);
  return r;
}

static int sim_device_synchronize(void *ctx, int device) {
  sim_t *s = ctx;
  MS_RETURN_IF(!sim_valid_device(s, device), MS_ENODEVICE);
  pthread_mutex_lock(&s->mu);
  sim_device_t *d = &s->dev[device];
  d->c.device_syncs++;
  for (size_t i = 0; i < d->streams.len; i++) d->streams.ptr[i].completed = d->streams.ptr[i].recorded;
  sim_log(s, MS_SIM_OP_DEVICE_SYNCHRONIZE, device, MS_OK, 0, 0, 0);
  pthread_mutex_unlock(&s->mu);
  return MS_OK;
}

static int sim_va_reserve(void *ctx, int device, size_t size, ms_devptr_t *out) {
  sim_t *s = ctx;
  MS_RETURN_IF(!sim_valid_device(s, device), MS_ENODEVICE);
  pthread_mutex_lock(&s->mu);
  sim_device_t *d = &s->dev[device];
  d->c.va_reserves++;
  ms_devptr_t addr = 0;
  size_t index;
  int r = size == 0 || size % MS_SIM_ALIGNMENT ? MS_EINVAL : MS_OK;
  if (r == MS_OK) {
    ms_devptr_t forced = d->next_addr;
    d->next_addr = 0;
    r = sim_place(d, device, size, forced, &addr, &index);
  }
  if (r == MS_OK) {
    sim_range_t rg = {addr, 0, size, 0, true, NULL};
    r = sim_insert_range(d, index, &rg);
  }
  sim_log(s, MS_SIM_OP_VA_RESERVE, device, r, r == MS_OK ? addr : 0, size, 0);
  pthread_mutex_unlock(&s->mu);
  if (r == MS_OK) *out = addr;
  return r;
}

static int sim_va_release(void *ctx, int device, ms_devptr_t addr, size_t size) {
  sim_t *s = ctx;
  MS_RETURN_IF(!sim_valid_device(s, device), MS_ENODEVICE);
  pthread_mutex_lock(&s->mu);
  sim_device_t *d = &s->dev[device];
  d->c.va_releases++;
  size_t i = sim_find_range(d, addr);
  int r = i != SIZE_MAX && d->ranges.ptr[i].is_va && d->ranges.ptr[i].span == size &&
                  d->ranges.ptr[i].mapped == 0
              ? MS_OK
              : MS_EINVAL;
  if (r == MS_OK) {
    memmove(&d->ranges.ptr[i], &d->ranges.ptr[i + 1], (d->ranges.len - i - 1) * sizeof(sim_range_t));
    d->ranges.len--;
  }
  sim_log(s, MS_SIM_OP_VA_RELEASE, device, r, addr, size, 0);
  pthread_mutex_unlock(&s->mu);
  return r;
}

/* Checks that [addr, addr+size) lies inside one VA reservation; @return its index or SIZE_MAX. */
static size_t sim_va_of(const sim_device_t *d, ms_devptr_t addr, size_t size) {
  if (size == 0 || size % MS_SIM_ALIGNMENT || addr % MS_SIM_ALIGNMENT) return SIZE_MAX;
  size_t i = sim_find_containing(d, addr);
  if (i == SIZE_MAX || !d->ranges.ptr[i].is_va) return SIZE_MAX;
  const sim_range_t *r = &d->ranges.ptr[i];
  return size <= r->addr + r->span - addr ? i : SIZE_MAX;
}

static int sim_mem_map(void *ctx, int device, ms_devptr_t addr, size_t size) {
  sim_t *s = ctx;
  MS_RETURN_IF(!sim_valid_device(s, device), MS_ENODEVICE);
  pthread_mutex_lock(&s->mu);
  sim_device_t *d = &s->dev[device];
  d->c.mem_maps++;
  size_t i = sim_va_of(d, addr, size);
  int r = i == SIZE_MAX ? MS_EINVAL : sim_charge(d, size);
  if (r == MS_OK) {
    d->ranges.ptr[i].mapped += size;
    sim_account(d, size);
  } else if (r == MS_EOOM) {
    d->c.malloc_ooms++;
  }
  sim_log(s, MS_SIM_OP_MEM_MAP, device, r, addr, size, 0);
  pthread_mutex_unlock(&s->mu);
  return r;
}

static int sim_mem_unmap(void *ctx, int device, ms_devptr_t addr, size_t size) {
  sim_t *s = ctx;
  MS_RETURN_IF(!sim_valid_device(s, device), MS_ENODEVICE);
  pthread_mutex_lock(&s->mu);
  sim_device_t *d = &s->dev[device];
  d->c.mem_unmaps++;
  size_t i = sim_va_of(d, addr, size);
  int r = i == SIZE_MAX || d->ranges.ptr[i].mapped < size ? MS_EINVAL : MS_OK;
  if (r == MS_OK) {
    d->ranges.ptr[i].mapped -= size;
    d->c.used_bytes -= size;
  }
  sim_log(s, MS_SIM_OP_MEM_UNMAP, device, r, addr, size, 0);
  pthread_mutex_unlock(&s->mu);
  return r;
}

static void sim_destroy(void *ctx) {
  sim_t *s = ctx;
  if (!s) return;
  for (int i = 0; i < MS_SIM_MAX_DEVICES; i++) {
    sim_device_t *d = &s->dev[i];
    for (size_t j = 0; j < d->ranges.len; j++) free(d->ranges.ptr[j].host);
    MS_VEC_FREE(&d->ranges);
    MS_VEC_FREE(&d->streams);
    MS_VEC_FREE(&d->events);
    MS_VEC_FREE(&d->free_events);
  }
  free(s->log);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

bool ms__backend_ops_are_sim(const ms_backend_ops_t *ops) {
  return ops && ops->device_count == sim_device_count;
}

int ms_backend_sim_create(const ms_sim_config_t *cfg, ms_backend_t **out) {
  MS_RETURN_IF(!out, MS_EINVAL);
  ms_sim_config_t c = cfg ? *cfg : (ms_sim_config_t){0};
  if (c.ndevices == 0) c.ndevices = 1;
  if (c.capacity == 0) c.capacity = MS_SIM_DEFAULT_CAPACITY;
  MS_RETURN_IF(c.ndevices < 0 || c.ndevices > MS_SIM_MAX_DEVICES, MS_EINVAL);
  MS_RETURN_IF(c.log_capacity > ((size_t)1 << 28), MS_EINVAL);
  sim_t *s = calloc(1, sizeof *s);
  MS_RETURN_IF(!s, MS_ENOMEM);
  pthread_mutex_init(&s->mu, NULL);
  s->ndevices = c.ndevices;
  s->host_memory = c.host_memory;
  s->auto_complete = c.auto_complete_events;
  int r = MS_OK;
  if (c.log_capacity) {
    s->log = calloc(c.log_capacity, sizeof *s->log);
    s->log_cap = c.log_capacity;
    if (!s->log) r = MS_ENOMEM;
  }
  for (int i = 0; i < s->ndevices && r == MS_OK; i++) {
    s->dev[i].capacity = c.capacity;
    sim_stream_t def = {0, 0, true};
    if (MS_VEC_PUSH(&s->dev[i].streams, def) != 0) r = MS_ENOMEM;
  }
  ms_backend_ops_t ops = {
      .name = "sim",
      .ctx = s,
      .device_count = sim_device_count,
      .malloc = sim_malloc,
      .free = sim_free,
      .mem_info = sim_mem_info,
      .stream_create = sim_stream_create,
      .stream_destroy = sim_stream_destroy,
      .event_create = sim_event_create,
      .event_record = sim_event_record,
      .event_query = sim_event_query,
      .event_synchronize = sim_event_synchronize,
      .event_destroy = sim_event_destroy,
      .device_synchronize = sim_device_synchronize,
      .va_reserve = sim_va_reserve,
      .va_release = sim_va_release,
      .mem_map = sim_mem_map,
      .mem_unmap = sim_mem_unmap,
      .destroy = sim_destroy,
  };
  if (r == MS_OK) r = ms_backend_create(&ops, out);
  if (r != MS_OK) sim_destroy(s);
  return r;
}

/* ---- sim-only controls ----------------------------------------------------------------------- */

static sim_t *sim_of(const ms_backend_t *b) {
  return b && ms__backend_ops_are_sim(&b->ops) ? b->ops.ctx : NULL;
}

bool ms_backend_is_sim(const ms_backend_t *b) { return sim_of(b) != NULL; }

#define SIM_ENTER(b, device)                                   \
  sim_t *s = sim_of(b);                                        \
  MS_RETURN_IF(!s, MS_EINVAL);                                 \
  MS_RETURN_IF(!sim_valid_device(s, (device)), MS_ENODEVICE);  \
  pthread_mutex_lock(&s->mu);                                  \
  sim_device_t *d = &s->dev[(device)]

int ms_sim_get_counters(const ms_backend_t *b, int device, ms_sim_counters_t *out) {
  MS_RETURN_IF(!out, MS_EINVAL);
  SIM_ENTER(b, device);
  *out = d->c;
  pthread_mutex_unlock(&s->mu);
  return MS_OK;
}

int ms_sim_reset_counters(ms_backend_t *b, int device) {
  SIM_ENTER(b, device);
  ms_sim_counters_t keep = d->c;
  memset(&d->c, 0, sizeof d->c);
  d->c.used_bytes = keep.used_bytes;
  d->c.peak_used_bytes = keep.used_bytes;
  d->c.live_allocations = keep.live_allocations;
  pthread_mutex_unlock(&s->mu);
  return MS_OK;
}

const char *ms_sim_op_name(ms_sim_op op) {
  static const char *const names[MS_SIM_OP_COUNT] = {
      "malloc",      "free",           "mem_info",          "stream_create",
      "stream_destroy", "event_create", "event_record",     "event_query",
      "event_synchronize", "event_destroy", "device_synchronize", "va_reserve",
      "va_release",  "mem_map",        "mem_unmap",
  };
  return (unsigned)op < MS_SIM_OP_COUNT ? names[op] : "?";
}

int ms_sim_get_log(const ms_backend_t *b, ms_sim_call_t *dst, size_t cap, size_t *n) {
  sim_t *s = sim_of(b);
  MS_RETURN_IF(!s || !n || (cap && !dst), MS_EINVAL);
  pthread_mutex_lock(&s->mu);
  size_t k = s->log_len < cap ? s->log_len : cap;
  for (size_t i = 0; i < k; i++) dst[i] = s->log[(s->log_head + i) % s->log_cap];
  pthread_mutex_unlock(&s->mu);
  *n = k;
  return MS_OK;
}

int ms_sim_clear_log(ms_backend_t *b) {
  sim_t *s = sim_of(b);
  MS_RETURN_IF(!s, MS_EINVAL);
  pthread_mutex_lock(&s->mu);
  s->log_len = 0;
  s->log_head = 0;
  pthread_mutex_unlock(&s->mu);
  return MS_OK;
}

int ms_sim_set_capacity(ms_backend_t *b, int device, size_t capacity) {
  MS_RETURN_IF(capacity > MS_SIM_DEVICE_STRIDE, MS_EINVAL);
  SIM_ENTER(b, device);
  d->capacity = capacity;
  pthread_mutex_unlock(&s->mu);
  return MS_OK;
}

int ms_sim_fail_nth_malloc(ms_backend_t *b, int device, uint64_t n) {
  SIM_ENTER(b, device);
  d->fail_countdown = n;
  pthread_mutex_unlock(&s->mu);
  return MS_OK;
}

int ms_sim_set_next_address(ms_backend_t *b, int device, ms_devptr_t addr) {
  SIM_ENTER(b, device);
  d->next_addr = addr;
  pthread_mutex_unlock(&s->mu);
  return MS_OK;
}

int ms_sim_set_auto_complete(ms_backend_t *b, bool on) {
  sim_t *s = sim_of(b);
  MS_RETURN_IF(!s, MS_EINVAL);
  pthread_mutex_lock(&s->mu);
  s->auto_complete = on;
  pthread_mutex_unlock(&s->mu);
  return MS_OK;
}

int ms_sim_stream_complete(ms_backend_t *b, int device, ms_stream_t stream) {
  SIM_ENTER(b, device);
  sim_stream_t *st = stream < d->streams.len ? &d->streams.ptr[stream] : NULL;
  if (st) st->completed = st->recorded;
  pthread_mutex_unlock(&s->mu);
  return st ? MS_OK : MS_EINVAL;
}

int ms_sim_event_complete(ms_backend_t *b, int device, ms_event_t event) {
  SIM_ENTER(b, device);
  sim_event_t *e = sim_event(d, event);
  if (e) sim_complete_event(d, e);
  pthread_mutex_unlock(&s->mu);
  return e ? MS_OK : MS_EINVAL;
}

int ms_sim_event_is_complete(const ms_backend_t *b, int device, ms_event_t event, bool *done) {
  MS_RETURN_IF(!done, MS_EINVAL);
  SIM_ENTER(b, device);
  sim_event_t *e = sim_event(d, event);
  bool dn = e && sim_event_done(d, e);
  pthread_mutex_unlock(&s->mu);
  if (!e) return MS_EINVAL;
  *done = dn;
  return MS_OK;
}

int ms_sim_host_ptr(const ms_backend_t *b, int device, ms_devptr_t ptr, void **out) {
  MS_RETURN_IF(!out, MS_EINVAL);
  SIM_ENTER(b, device);
  int r = MS_OK;
  void *h = NULL;
  if (!s->host_memory) {
    r = MS_EUNSUPPORTED;
  } else {
    size_t i = sim_find_containing(d, ptr);
    if (i == SIZE_MAX || d->ranges.ptr[i].is_va || ptr - d->ranges.ptr[i].addr >= d->ranges.ptr[i].size)
      r = MS_ENOTFOUND;
    else
      h = (char *)d->ranges.ptr[i].host + (ptr - d->ranges.ptr[i].addr);
  }
  pthread_mutex_unlock(&s->mu);
  if (r == MS_OK) *out = h;
  return r;
}

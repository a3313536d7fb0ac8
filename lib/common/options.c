/* SPDX-License-Identifier: MIT
 * memsnap core: the options table (include/memsnap/options.h). Each entry is {value, state,
 * id, name, kind}, indexed by enum ms_option_t (checked at compile time and by an assert); the
 * environment variable MS_<NAME> is read on first use. Reads take no lock once an option is
 * initialised; initialisation and updates are serialised by one mutex.
 */
#include <ctype.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/internal.h"
#include "memsnap/options.h"

enum options_state { OPTIONS_UNINIT = 0, OPTIONS_INITIALIZED = 1 };
/* Only booleans so far; a size kind (K/M/G suffixes, style §6) comes with the first size option. */
enum options_kind { OPTIONS_BOOL };

typedef struct options_desc_s {
  _Atomic int64_t value;
  _Atomic int state;
  ms_option_t id;
  const char *name;
  enum options_kind kind;
} options_desc_t;

static options_desc_t options_table[] = {
    {0, OPTIONS_UNINIT, MS_OPTION_VERBOSE, "verbose", OPTIONS_BOOL},
    {0, OPTIONS_UNINIT, MS_OPTION_TRACE_ERRORS, "trace_errors", OPTIONS_BOOL},
    {0, OPTIONS_UNINIT, MS_OPTION_REUSE_MEMORY, "reuse_memory", OPTIONS_BOOL},
};

_Static_assert(sizeof options_table / sizeof options_table[0] == MS_OPTION_LAST,
               "one entry per ms_option_t");

static pthread_mutex_t options_lock = PTHREAD_MUTEX_INITIALIZER;

static options_desc_t *options_desc(ms_option_t option) {
  if ((unsigned)option >= (unsigned)MS_OPTION_LAST) return NULL;
  options_desc_t *d = &options_table[option];
  ms_assert(d->id == option);
  return d;
}

/* "MS_" + the name in upper case. */
static void options_env_name(const options_desc_t *d, char *buf, size_t cap) {
  size_t k = 0;
  const char *prefix = "MS_";
  for (; *prefix && k + 1 < cap; prefix++) buf[k++] = *prefix;
  for (const char *s = d->name; *s && k + 1 < cap; s++)
    buf[k++] = (char)toupper((unsigned char)*s);
  buf[k] = '\0';
}

static bool options_parse_bool(const char *s, int64_t *v) {
  static const char *const yes[] = {"1", "TRUE", "YES", "ON"};
  static const char *const no[] = {"0", "FALSE", "NO", "OFF"};
  for (size_t i = 0; i < 4; i++) {
    if (strcasecmp(s, yes[i]) == 0) {
      *v = 1;
      return true;
    }
    if (strcasecmp(s, no[i]) == 0) {
      *v = 0;
      return true;
    }
  }
  return false;
}

static void options_init_one(options_desc_t *d) {
  char env[64];
  options_env_name(d, env, sizeof env);
  const char *s = getenv(env);
  int64_t v = 0;
  bool have = false, invalid = false;
  if (s != NULL) {
    /* Leading and trailing blanks are tolerated, as a shell user would expect. */
    char buf[64];
    while (isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1])) n--;
    if (n < sizeof buf) {
      memcpy(buf, s, n);
      buf[n] = '\0';
      have = options_parse_bool(buf, &v);
    }
    invalid = !have;
  }
  pthread_mutex_lock(&options_lock);
  bool first = atomic_load(&d->state) == OPTIONS_UNINIT;
  if (first) {
    if (have) atomic_store(&d->value, v);
    atomic_store(&d->state, OPTIONS_INITIALIZED);
  }
  int64_t kept = atomic_load(&d->value);
  pthread_mutex_unlock(&options_lock);
  if (first && invalid)
    ms__warning("environment option %s has an invalid value '%.40s' (expected 1/TRUE/YES/ON or "
                "0/FALSE/NO/OFF), keeping %lld",
                env, s, (long long)kept);
}

int64_t ms_option_get(ms_option_t option) {
  options_desc_t *d = options_desc(option);
  if (d == NULL) return 0;
  if (ms_unlikely(atomic_load_explicit(&d->state, memory_order_acquire) == OPTIONS_UNINIT))
    options_init_one(d);
  return atomic_load_explicit(&d->value, memory_order_relaxed);
}

bool ms_option_is_enabled(ms_option_t option) { return ms_option_get(option) != 0; }

void ms_option_set(ms_option_t option, int64_t value) {
  options_desc_t *d = options_desc(option);
  if (d == NULL) return;
  pthread_mutex_lock(&options_lock);
  atomic_store(&d->value, value);
  atomic_store(&d->state, OPTIONS_INITIALIZED);
  pthread_mutex_unlock(&options_lock);
}

void ms_option_set_default(ms_option_t option, int64_t value) {
  options_desc_t *d = options_desc(option);
  if (d == NULL) return;
  pthread_mutex_lock(&options_lock);
  if (atomic_load(&d->state) == OPTIONS_UNINIT) atomic_store(&d->value, value);
  pthread_mutex_unlock(&options_lock);
}

const char *ms_option_name(ms_option_t option) {
  options_desc_t *d = options_desc(option);
  return d ? d->name : NULL;
}

void ms_options_init(void) {
  for (int i = 0; i < MS_OPTION_LAST; i++) (void)ms_option_get((ms_option_t)i);
}

void ms_options_print(void) {
  if (!ms_option_is_enabled(MS_OPTION_VERBOSE)) return;
  for (int i = 0; i < MS_OPTION_LAST; i++) {
    options_desc_t *d = &options_table[i];
    char env[64];
    options_env_name(d, env, sizeof env);
    ms__message("memsnap: ", "option '%s': %lld (%s)", d->name,
                (long long)ms_option_get((ms_option_t)i), env);
  }
}

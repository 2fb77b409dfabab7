/*
 * ncfsm-info: what this ncfsm build finds on this machine.
 *
 *   ncfsm-info          human-readable report
 *   ncfsm-info --json   the same as one JSON object
 *
 * Reports the ncfsm version; the NCCL headers it was built with and the NCCL
 * runtime that dlopen finds (with its path); the CUDA runtime and driver;
 * the visible GPUs; which optional NCCL entry points exist (R6, R7); the
 * backend NCFSM_BACKEND=auto would pick and why; and every variable of the
 * settings table (core/settings.def, docs/settings.md): its effective value,
 * whether it comes from the environment or the default, and for a value the
 * table refuses, the error (secrets are never printed). Always exits 0 once the report is printed (no GPU is a
 * finding, not an error); 2 for bad arguments, 1 when the report could not
 * be produced.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "core/backend.h"
#include "core/log.h"
#include "core/nccl_dl.h" /* NCFSM__NCCL_OPTIONAL in every build; its functions with NCFSM_HAVE_NCCL */
#include "core/settings.h"
#include "ncfsm.h"

#define MAX_GPUS 64

typedef struct gpu {
  int ordinal;
  char name[256];
  char pci[32];
  unsigned long long mem;
  int cc_major, cc_minor;
  char note[256];
} gpu;

/* The optional NCCL entry points: the backend's table (core/nccl_dl.h). */
typedef struct optional_ep {
  const char *name;
  int since;
  unsigned bit; /* 0: reported, not used by ncfsm */
  const char *rule;
  const char *use;
} optional_ep;

static const optional_ep optionals[] = {
#define NCFSM_INFO_OPTIONAL(name, since, bit, rule, use) {#name, since, bit, rule, use},
    NCFSM__NCCL_OPTIONAL(NCFSM_INFO_OPTIONAL)
#undef NCFSM_INFO_OPTIONAL
};
#define N_OPTIONALS (sizeof optionals / sizeof optionals[0])

/* "yes", "no", "old" (exported, but the runtime is older than the version
 * that brought it: not used), "?" (no NCCL loaded). */
static const char *optional_status(int loaded, uint64_t exported, uint64_t used, size_t i) {
  if (!loaded) return "?";
  if (used & (1ull << i)) return "yes";
  return exported & (1ull << i) ? "old" : "no";
}

/* One environment variable of the settings table (core/settings.def). */
typedef struct setting {
  const ncfsm__setting *row;
  char value[160];  /* effective, as the table writes it; "invalid" when refused */
  const char *raw;  /* getenv, NULL when unset (never printed for a secret) */
  char error[400];  /* "" or why the table refuses raw */
} setting;

typedef struct report {
  int have_nccl_build;
  int header_nccl, header_cudart;
  int nccl_loaded, nccl_version;
  char nccl_path[1024], nccl_why[512];
  unsigned features;
  uint64_t opt_exported, opt_used; /* bit i: optionals[i] */
  int cudart_loaded, cudart_version, driver_version, has_stream_get_device;
  char cudart_path[1024], cudart_why[512];
  int ngpus;
  char gpu_why[512];
  gpu gpus[MAX_GPUS];
  int open_rc;
  char open_why[512];
  const char *auto_pick;
  char auto_why[640];
  const char *env_pick; /* what NCFSM_BACKEND as set resolves to (NULL: error) */
  char env_why[512];
  setting settings[NCFSM__SET_COUNT];
  int n_settings;
} report;

/* ---- helpers ----------------------------------------------------------------------------- */

static void cuda_ver(int v, char *buf, size_t len) {
  if (v <= 0) snprintf(buf, len, "none");
  else snprintf(buf, len, "%d.%d", v / 1000, v % 1000 / 10);
}

static void nccl_ver(int code, char *buf, size_t len) {
  if (code <= 0) snprintf(buf, len, "unknown");
  else if (code >= 10000) snprintf(buf, len, "%d.%d.%d", code / 10000, code % 10000 / 100, code % 100);
  else snprintf(buf, len, "%d.%d.%d", code / 1000, code % 1000 / 100, code % 100);
}

/* ---- gathering ----------------------------------------------------------------------------- */

/* Every variable of the table: its value from the environment, or the
 * default, or the table's error. */
static void gather_settings(report *r) {
  for (int i = 0; i < NCFSM__SET_COUNT; i++) {
    const ncfsm__setting *row = &ncfsm__settings[i];
    if (!row->env) continue; /* an option field without a variable */
    setting *s = &r->settings[r->n_settings++];
    ncfsm__setting_val v;
    s->row = row;
    s->raw = getenv(row->env);
    if (s->raw && !*s->raw) s->raw = NULL; /* empty is unset */
    if (ncfsm__setting_get(row, &v, s->error, sizeof s->error) == 0)
      ncfsm__setting_format(row, &v, s->value, sizeof s->value);
    else
      snprintf(s->value, sizeof s->value, "invalid");
  }
}

static void gather(report *r) {
  memset(r, 0, sizeof *r);
#ifdef NCFSM_HAVE_NCCL
  r->have_nccl_build = 1;
  ncfsm__nccl_info in;
  ncfsm__nccl_get_info(&in);
  r->header_nccl = in.header_nccl_version;
  r->header_cudart = in.header_cudart_version;
  r->nccl_loaded = in.nccl_loaded;
  r->nccl_version = in.nccl_version;
  snprintf(r->nccl_path, sizeof r->nccl_path, "%s", in.nccl_path);
  snprintf(r->nccl_why, sizeof r->nccl_why, "%s", in.nccl_why);
  r->features = in.features;
  r->opt_exported = in.opt_exported;
  r->opt_used = in.opt_used;
  r->cudart_loaded = in.cudart_loaded;
  r->cudart_version = in.cudart_version;
  r->driver_version = in.driver_version;
  r->has_stream_get_device = in.has_stream_get_device;
  snprintf(r->cudart_path, sizeof r->cudart_path, "%s", in.cudart_path);
  snprintf(r->cudart_why, sizeof r->cudart_why, "%s", in.cudart_why);
  r->open_rc = in.open_rc;
  snprintf(r->open_why, sizeof r->open_why, "%s", in.open_why);
  if (!in.cudart_loaded) snprintf(r->gpu_why, sizeof r->gpu_why, "%s", in.cudart_why);
  else if (in.device_count <= 0) snprintf(r->gpu_why, sizeof r->gpu_why, "%s", in.device_why);
  r->ngpus = in.device_count < MAX_GPUS ? in.device_count : MAX_GPUS;
  for (int i = 0; i < r->ngpus; i++) {
    ncfsm__nccl_device_info di;
    gpu *g = &r->gpus[i];
    ncfsm__nccl_device_info_get(i, &di, g->note, sizeof g->note);
    g->ordinal = i;
    snprintf(g->name, sizeof g->name, "%s", di.name);
    snprintf(g->pci, sizeof g->pci, "%s", di.pci_bus_id);
    g->mem = (unsigned long long)di.total_mem;
    g->cc_major = di.cc_major;
    g->cc_minor = di.cc_minor;
  }
  /* NCFSM_BACKEND=auto, as core/backend.c decides it. */
  if (!in.open_rc) {
    r->auto_pick = "nccl";
    char v[32];
    nccl_ver(in.nccl_version, v, sizeof v);
    snprintf(r->auto_why, sizeof r->auto_why, "NCCL %s loaded and %d CUDA device(s) visible", v, in.device_count);
  } else {
    r->auto_pick = "sim";
    snprintf(r->auto_why, sizeof r->auto_why, "nccl backend unavailable: %s", in.open_why);
  }
#else
  r->open_rc = 1;
  snprintf(r->open_why, sizeof r->open_why,
           "this build has no nccl backend (CUDA toolkit/NCCL not found at configure time)");
  snprintf(r->gpu_why, sizeof r->gpu_why, "no nccl backend in this build: GPUs are not probed");
  r->auto_pick = "sim";
  snprintf(r->auto_why, sizeof r->auto_why, "%s", r->open_why);
#endif
  /* What the environment as set resolves to (NCFSM_BACKEND may force one). */
  const ncfsm__backend *be = ncfsm__backend_get(NCFSM_BACKEND_AUTO, r->env_why, sizeof r->env_why);
  r->env_pick = be ? be->name : NULL;
  gather_settings(r);
}

/* ---- text ----------------------------------------------------------------------------------- */

static void print_text(const report *r) {
  char a[32], b[32];
  printf("ncfsm %d.%d.%d\n", NCFSM_VERSION_MAJOR, NCFSM_VERSION_MINOR, NCFSM_VERSION_PATCH);
  if (r->have_nccl_build) {
    nccl_ver(r->header_nccl, a, sizeof a);
    cuda_ver(r->header_cudart, b, sizeof b);
    printf("build:   nccl backend yes (NCCL headers %s, CUDA runtime headers %s; both loaded with dlopen)\n", a, b);
  } else {
    printf("build:   nccl backend no (CUDA toolkit/NCCL not found at configure time)\n");
  }

  printf("\nNCCL\n");
  if (!r->have_nccl_build) printf("  not probed (no nccl backend in this build)\n");
  else if (r->nccl_loaded) {
    nccl_ver(r->nccl_version, a, sizeof a);
    printf("  runtime  %s (ncclGetVersion %d)\n  library  %s\n", a, r->nccl_version, r->nccl_path);
    if (r->header_nccl != r->nccl_version) {
      nccl_ver(r->header_nccl, b, sizeof b);
      printf("  note     runtime %s differs from the headers %s: optional entry points are resolved at run time\n",
             a, b);
    }
  } else {
    printf("  not loaded: %s\n", r->nccl_why);
  }

  printf("\nCUDA\n");
  if (!r->have_nccl_build) printf("  not probed (no nccl backend in this build)\n");
  else if (r->cudart_loaded) {
    cuda_ver(r->cudart_version, a, sizeof a);
    cuda_ver(r->driver_version, b, sizeof b);
    printf("  runtime  %s (%s)\n  driver   %s%s\n", a, r->cudart_path, b,
           r->driver_version <= 0 ? " (no NVIDIA driver found)" : "");
    printf("  cudaStreamGetDevice  %s\n", r->has_stream_get_device ? "yes" : "no (CUDA < 12.8: stream devices are not checked)");
  } else {
    printf("  runtime not loaded: %s\n", r->cudart_why);
  }

  printf("\nGPUs\n");
  if (r->ngpus <= 0) printf("  no CUDA device visible%s%s\n", r->gpu_why[0] ? ": " : "", r->gpu_why);
  for (int i = 0; i < r->ngpus; i++) {
    const gpu *g = &r->gpus[i];
    printf("  %d  %-28s  pci %-14s  %6.1f GiB  sm_%d%d%s%s\n", g->ordinal, g->name[0] ? g->name : "(name unknown)",
           g->pci, (double)g->mem / (1024.0 * 1024.0 * 1024.0), g->cc_major, g->cc_minor,
           g->note[0] ? "  " : "", g->note);
  }

  printf("\nOptional NCCL entry points\n");
  for (size_t i = 0; i < N_OPTIONALS; i++) {
    const optional_ep *o = &optionals[i];
    nccl_ver(o->since, a, sizeof a);
    printf("  %-24s %-4s (NCCL >= %s%s%s)%s%s\n", o->name,
           optional_status(r->nccl_loaded, r->opt_exported, r->opt_used, i), a, o->rule[0] ? ", " : "", o->rule,
           o->bit ? "" : "  reported only: ", o->bit ? "" : o->use);
  }

  printf("\nBackend\n");
  printf("  NCFSM_BACKEND=auto picks  %s: %s\n", r->auto_pick, r->auto_why);
  if (r->env_pick)
    printf("  as configured             %s (NCFSM_BACKEND=%s)\n", r->env_pick,
           getenv("NCFSM_BACKEND") ? getenv("NCFSM_BACKEND") : "unset");
  else
    printf("  as configured             none: %s\n", r->env_why);

  printf("\nConfiguration (every variable of docs/settings.md: effective value; environment)\n");
  for (int i = 0; i < r->n_settings; i++) {
    const setting *s = &r->settings[i];
    int secret = s->row->type == NCFSM__T_SECRET;
    printf("  %-30s %-16s %s%s%s%s\n", s->row->env, s->value, s->raw ? "set" : "default",
           s->raw && !secret ? ": \"" : "", s->raw && !secret ? s->raw : "", s->raw && !secret ? "\"" : "");
    if (s->error[0]) printf("  %-30s %s\n", "", s->error);
  }
}

/* ---- json ------------------------------------------------------------------------------------ */

static json_t *jstr_or_null(const char *s) { return s && *s ? json_string(s) : json_null(); }

static json_t *to_json(const report *r) {
  char a[32];
  json_t *root = json_object();
  snprintf(a, sizeof a, "%d.%d.%d", NCFSM_VERSION_MAJOR, NCFSM_VERSION_MINOR, NCFSM_VERSION_PATCH);
  json_object_set_new(root, "ncfsm_version", json_string(a));

  json_t *build = json_object();
  json_object_set_new(build, "nccl_backend", json_boolean(r->have_nccl_build));
  if (r->have_nccl_build) {
    nccl_ver(r->header_nccl, a, sizeof a);
    json_object_set_new(build, "nccl_header_version", json_string(a));
    json_object_set_new(build, "nccl_header_version_code", json_integer(r->header_nccl));
    json_object_set_new(build, "cudart_header_version", json_integer(r->header_cudart));
  }
  json_object_set_new(root, "build", build);

  json_t *nccl = json_object();
  json_object_set_new(nccl, "loaded", json_boolean(r->nccl_loaded));
  if (r->nccl_loaded) {
    nccl_ver(r->nccl_version, a, sizeof a);
    json_object_set_new(nccl, "version", json_string(a));
    json_object_set_new(nccl, "version_code", json_integer(r->nccl_version));
    json_object_set_new(nccl, "library", json_string(r->nccl_path));
  } else {
    json_object_set_new(nccl, "error", jstr_or_null(r->have_nccl_build ? r->nccl_why : "not probed"));
  }
  json_t *opt = json_object();
  for (size_t i = 0; i < N_OPTIONALS; i++) {
    const optional_ep *e = &optionals[i];
    json_t *o = json_object();
    int exported = (r->opt_exported >> i) & 1, used = (r->opt_used >> i) & 1;
    json_object_set_new(o, "present", r->nccl_loaded ? json_boolean(used) : json_null());
    json_object_set_new(o, "exported", r->nccl_loaded ? json_boolean(exported) : json_null());
    nccl_ver(e->since, a, sizeof a);
    json_object_set_new(o, "since", json_string(a));
    json_object_set_new(o, "since_code", json_integer(e->since));
    if (e->rule[0]) json_object_set_new(o, "rule", json_string(e->rule));
    json_object_set_new(o, "used_by_ncfsm", json_boolean(e->bit != 0));
    json_object_set_new(o, "use", json_string(e->use));
    json_object_set_new(opt, e->name, o);
  }
  json_object_set_new(nccl, "optional", opt);
  json_object_set_new(root, "nccl", nccl);

  json_t *cuda = json_object();
  json_object_set_new(cuda, "loaded", json_boolean(r->cudart_loaded));
  if (r->cudart_loaded) {
    json_object_set_new(cuda, "runtime_version", json_integer(r->cudart_version));
    json_object_set_new(cuda, "driver_version", json_integer(r->driver_version));
    json_object_set_new(cuda, "library", json_string(r->cudart_path));
    json_object_set_new(cuda, "stream_get_device", json_boolean(r->has_stream_get_device));
  } else {
    json_object_set_new(cuda, "error", jstr_or_null(r->have_nccl_build ? r->cudart_why : "not probed"));
  }
  json_object_set_new(root, "cuda", cuda);

  json_t *gpus = json_array();
  for (int i = 0; i < r->ngpus; i++) {
    const gpu *g = &r->gpus[i];
    char cc[16];
    snprintf(cc, sizeof cc, "%d.%d", g->cc_major, g->cc_minor);
    json_t *o = json_object();
    json_object_set_new(o, "ordinal", json_integer(g->ordinal));
    json_object_set_new(o, "name", jstr_or_null(g->name));
    json_object_set_new(o, "pci_bus_id", jstr_or_null(g->pci));
    json_object_set_new(o, "memory_bytes", json_integer((json_int_t)g->mem));
    json_object_set_new(o, "compute_capability", json_string(cc));
    if (g->note[0]) json_object_set_new(o, "note", json_string(g->note));
    json_array_append_new(gpus, o);
  }
  json_object_set_new(root, "gpus", gpus);
  json_object_set_new(root, "gpus_error", r->ngpus > 0 ? json_null() : jstr_or_null(r->gpu_why));

  json_t *be = json_object();
  json_object_set_new(be, "auto", json_string(r->auto_pick));
  json_object_set_new(be, "auto_reason", json_string(r->auto_why));
  json_object_set_new(be, "configured", jstr_or_null(r->env_pick));
  if (!r->env_pick) json_object_set_new(be, "configured_error", json_string(r->env_why));
  json_object_set_new(root, "backend", be);

  json_t *cfg = json_object();
  for (int i = 0; i < r->n_settings; i++) {
    const setting *s = &r->settings[i];
    const ncfsm__setting *row = s->row;
    char acc[256];
    ncfsm__setting_accepted(row, acc, sizeof acc);
    json_t *o = json_object();
    json_object_set_new(o, "value", json_string(s->value));
    json_object_set_new(o, "env", !s->raw ? json_null()
                                  : json_string(row->type == NCFSM__T_SECRET ? "(not shown)" : s->raw));
    json_object_set_new(o, "source", json_string(s->raw ? "environment" : "default"));
    if (s->error[0]) json_object_set_new(o, "error", json_string(s->error));
    json_object_set_new(o, "type", json_string(ncfsm__setting_type_name(row->type)));
    json_object_set_new(o, "default", jstr_or_null(row->dflt));
    json_object_set_new(o, "accepted", json_string(acc));
    json_object_set_new(o, "field", jstr_or_null(row->field));
    json_object_set_new(o, "subsystem", json_string(ncfsm__subsystems[row->subsys].id));
    json_object_set_new(o, "effect", json_string(row->effect));
    json_object_set_new(cfg, row->env, o);
  }
  json_object_set_new(root, "config", cfg);
  return root;
}

static void usage(FILE *f) {
  fprintf(f, "usage: ncfsm-info [--json]\n"
             "  prints the ncfsm version, the NCCL and CUDA runtimes found with dlopen, the visible\n"
             "  GPUs, the optional NCCL entry points, the backend NCFSM_BACKEND=auto would pick and\n"
             "  the effective NCFSM_* configuration\n"
             "  --json  one JSON object instead of text\n");
}

int main(int argc, char **argv) {
  int json = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--json")) json = 1;
    else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "ncfsm-info: unknown argument '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  report *r = calloc(1, sizeof *r);
  if (!r) {
    fprintf(stderr, "ncfsm-info: out of memory\n");
    return 1;
  }
  gather(r);
  int rc = 0;
  if (json) {
    json_t *root = to_json(r);
    char *s = root ? json_dumps(root, JSON_INDENT(2)) : NULL;
    if (s) {
      printf("%s\n", s);
      free(s);
    } else {
      fprintf(stderr, "ncfsm-info: could not encode JSON\n");
      rc = 1;
    }
    json_decref(root);
  } else {
    print_text(r);
  }
  free(r);
  return rc;
}

/*
 * Element types and reductions of the sim backend: the 10 NCCL data types and
 * the 5 built-in reduction operators, on host memory.
 *
 * Integers reduce in their own type with wrap-around (as NCCL's FuncSum<T>),
 * AVG is the wrapped sum divided by the number of ranks, truncating toward
 * zero (NCCL's FuncSumPostDiv). float32 reduces in float, float64 in double,
 * float16 and bfloat16 in float, rounded once to nearest-even at the end.
 * Buffers may be unaligned: every element is read and written with memcpy.
 */
#include <string.h>

#include "core/sim/sim-internal.h"

size_t ncfsm__sim_dtype_size(int dtype) {
  static const size_t sz[NCFSM_DTYPE_COUNT] = {
#define SIM__DT(name, v, size) [v] = size,
      NCFSM_DTYPE_MAP(SIM__DT)
#undef SIM__DT
  };
  return (dtype >= 0 && dtype < NCFSM_DTYPE_COUNT) ? sz[dtype] : 0;
}

/* ---- float16 / bfloat16 ------------------------------------------------- */

float ncfsm__sim_half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, u;
  float f;
  if (exp == 0) {
    f = (float)mant * 0x1p-24f; /* zero or subnormal: mant * 2^-24, exact */
    memcpy(&u, &f, sizeof u);
    u |= sign;
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13); /* inf / nan */
  } else {
    u = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Round to nearest even (F. Giesen's float_to_half_fast3_rtne). */
uint16_t ncfsm__sim_float_to_half(float fl) {
  const uint32_t f32infty = 255u << 23, f16max = (127u + 16u) << 23;
  const uint32_t denorm_magic_u = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  uint32_t u;
  uint16_t o;
  memcpy(&u, &fl, sizeof u);
  uint32_t sign = u & 0x80000000u;
  u ^= sign;
  if (u >= f16max) {
    o = (u > f32infty) ? 0x7e00 : 0x7c00; /* nan -> qnan, overflow -> inf */
  } else if (u < (113u << 23)) {
    /* subnormal or zero: align the 10 mantissa bits with a float add (RNE) */
    float f, magic;
    memcpy(&f, &u, sizeof f);
    memcpy(&magic, &denorm_magic_u, sizeof magic);
    f += magic;
    memcpy(&u, &f, sizeof u);
    o = (uint16_t)(u - denorm_magic_u);
  } else {
    uint32_t mant_odd = (u >> 13) & 1u;
    u += ((uint32_t)(15 - 127) << 23) + 0xfffu;
    u += mant_odd;
    o = (uint16_t)(u >> 13);
  }
  return (uint16_t)(o | (sign >> 16));
}

float ncfsm__sim_bf16_to_float(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t ncfsm__sim_float_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet nan */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* ---- reductions ------------------------------------------------------------ */

typedef void (*sim_red_fn)(void *out, const void *const *in, int nin, size_t n, int op);

/* Integers: T the type, UT its unsigned twin (defined wrap-around), WT the
 * 64-bit type of the same signedness for AVG's division. */
#define SIM_RED_INT(NAME, T, UT, WT)                                                    \
  static void red_##NAME(void *out, const void *const *in, int nin, size_t n, int op) { \
    for (size_t i = 0; i < n; i++) {                                                    \
      T a, b;                                                                           \
      memcpy(&a, (const char *)in[0] + i * sizeof(T), sizeof(T));                       \
      for (int k = 1; k < nin; k++) {                                                   \
        memcpy(&b, (const char *)in[k] + i * sizeof(T), sizeof(T));                     \
        switch (op) {                                                                   \
        case NCFSM_OP_PROD: a = (T)((UT)a * (UT)b); break;                              \
        case NCFSM_OP_MAX: a = a > b ? a : b; break;                                    \
        case NCFSM_OP_MIN: a = a < b ? a : b; break;                                    \
        default: a = (T)((UT)a + (UT)b); break; /* SUM, AVG */                          \
        }                                                                               \
      }                                                                                 \
      if (op == NCFSM_OP_AVG) a = (T)((WT)a / (WT)nin);                                 \
      memcpy((char *)out + i * sizeof(T), &a, sizeof(T));                               \
    }                                                                                   \
  }

SIM_RED_INT(i8, int8_t, uint8_t, int64_t)
SIM_RED_INT(u8, uint8_t, uint8_t, uint64_t)
SIM_RED_INT(i32, int32_t, uint32_t, int64_t)
SIM_RED_INT(u32, uint32_t, uint32_t, uint64_t)
SIM_RED_INT(i64, int64_t, uint64_t, int64_t)
SIM_RED_INT(u64, uint64_t, uint64_t, uint64_t)

static float ld_f16(const void *p) {
  uint16_t h;
  memcpy(&h, p, sizeof h);
  return ncfsm__sim_half_to_float(h);
}
static void st_f16(void *p, float v) {
  uint16_t h = ncfsm__sim_float_to_half(v);
  memcpy(p, &h, sizeof h);
}
static float ld_bf16(const void *p) {
  uint16_t h;
  memcpy(&h, p, sizeof h);
  return ncfsm__sim_bf16_to_float(h);
}
static void st_bf16(void *p, float v) {
  uint16_t h = ncfsm__sim_float_to_bf16(v);
  memcpy(p, &h, sizeof h);
}
static float ld_f32(const void *p) {
  float v;
  memcpy(&v, p, sizeof v);
  return v;
}
static void st_f32(void *p, float v) { memcpy(p, &v, sizeof v); }
static double ld_f64(const void *p) {
  double v;
  memcpy(&v, p, sizeof v);
  return v;
}
static void st_f64(void *p, double v) { memcpy(p, &v, sizeof v); }

/* Floating point: ES the element size, ACC the accumulator type. */
#define SIM_RED_FLT(NAME, ES, ACC, LD, ST)                                              \
  static void red_##NAME(void *out, const void *const *in, int nin, size_t n, int op) { \
    for (size_t i = 0; i < n; i++) {                                                    \
      ACC a = LD((const char *)in[0] + i * (ES));                                       \
      for (int k = 1; k < nin; k++) {                                                   \
        ACC b = LD((const char *)in[k] + i * (ES));                                     \
        switch (op) {                                                                   \
        case NCFSM_OP_PROD: a = a * b; break;                                           \
        case NCFSM_OP_MAX: a = a > b ? a : b; break;                                    \
        case NCFSM_OP_MIN: a = a < b ? a : b; break;                                    \
        default: a = a + b; break; /* SUM, AVG */                                       \
        }                                                                               \
      }                                                                                 \
      if (op == NCFSM_OP_AVG) a = a / (ACC)nin;                                         \
      ST((char *)out + i * (ES), a);                                                    \
    }                                                                                   \
  }

SIM_RED_FLT(f16, 2, float, ld_f16, st_f16)
SIM_RED_FLT(f32, 4, float, ld_f32, st_f32)
SIM_RED_FLT(f64, 8, double, ld_f64, st_f64)
SIM_RED_FLT(bf16, 2, float, ld_bf16, st_bf16)

void ncfsm__sim_reduce(void *out, const void *const *in, int nin, size_t n, int dtype, int redop) {
  static const sim_red_fn fns[NCFSM_DTYPE_COUNT] = {
      [NCFSM_INT8] = red_i8,       [NCFSM_UINT8] = red_u8,     [NCFSM_INT32] = red_i32,
      [NCFSM_UINT32] = red_u32,    [NCFSM_INT64] = red_i64,    [NCFSM_UINT64] = red_u64,
      [NCFSM_FLOAT16] = red_f16,   [NCFSM_FLOAT32] = red_f32,  [NCFSM_FLOAT64] = red_f64,
      [NCFSM_BFLOAT16] = red_bf16,
  };
  if (dtype < 0 || dtype >= NCFSM_DTYPE_COUNT || nin < 1) return; /* checked before posting */
  fns[dtype](out, in, nin, n, redop);
}

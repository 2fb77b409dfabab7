/* Data types, reduction operators and operation kinds. The numeric values
 * equal NCCL's (ncclDataType_t, ncclRedOp_t) so the nccl backend passes them
 * through unchanged. */
#ifndef NCFSM_TYPES_H
#define NCFSM_TYPES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NCFSM_DTYPE_MAP(X) \
  X(INT8, 0, 1)            \
  X(UINT8, 1, 1)           \
  X(INT32, 2, 4)           \
  X(UINT32, 3, 4)          \
  X(INT64, 4, 8)           \
  X(UINT64, 5, 8)          \
  X(FLOAT16, 6, 2)         \
  X(FLOAT32, 7, 4)         \
  X(FLOAT64, 8, 8)         \
  X(BFLOAT16, 9, 2)

typedef enum ncfsm_dtype {
#define NCFSM__DT(name, v, size) NCFSM_##name = v,
  NCFSM_DTYPE_MAP(NCFSM__DT)
#undef NCFSM__DT
  NCFSM_DTYPE_COUNT
} ncfsm_dtype_t;

#define NCFSM_REDOP_MAP(X) \
  X(SUM, 0)                \
  X(PROD, 1)               \
  X(MAX, 2)                \
  X(MIN, 3)                \
  X(AVG, 4)

typedef enum ncfsm_redop {
#define NCFSM__RO(name, v) NCFSM_OP_##name = v,
  NCFSM_REDOP_MAP(NCFSM__RO)
#undef NCFSM__RO
  NCFSM_REDOP_COUNT
} ncfsm_redop_t;

/* Operation kinds (collectives of NCCL 2.28 plus point-to-point). */
#define NCFSM_OPKIND_MAP(X) \
  X(ALLREDUCE)              \
  X(BROADCAST)              \
  X(REDUCE)                 \
  X(ALLGATHER)              \
  X(REDUCESCATTER)          \
  X(ALLTOALL)               \
  X(GATHER)                 \
  X(SCATTER)                \
  X(SEND)                   \
  X(RECV)

typedef enum ncfsm_opkind {
#define NCFSM__OK(name) NCFSM_KIND_##name,
  NCFSM_OPKIND_MAP(NCFSM__OK)
#undef NCFSM__OK
  NCFSM_OPKIND_COUNT
} ncfsm_opkind_t;

/* Size in bytes of one element; 0 for an unknown dtype. */
size_t ncfsm_dtype_size(ncfsm_dtype_t t);
const char *ncfsm_dtype_name(ncfsm_dtype_t t);
const char *ncfsm_redop_name(ncfsm_redop_t op);
const char *ncfsm_opkind_name(ncfsm_opkind_t k);

/* The fingerprint of one operation (R11): equal on every rank for the k-th
 * collective of a communicator. peer is -1 for collectives; root is -1 where
 * the operation has none; redop is -1 where it has none. */
typedef struct ncfsm_fingerprint {
  uint64_t seq;
  int32_t op;    /* ncfsm_opkind_t */
  int32_t dtype; /* ncfsm_dtype_t */
  uint64_t count;
  int32_t root;
  int32_t redop;
  int32_t peer;
  int32_t pad_;
} ncfsm_fingerprint_t;

#ifdef __cplusplus
}
#endif
#endif

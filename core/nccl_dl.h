/*
 * What the nccl backend found when it loaded NCCL and the CUDA runtime with
 * dlopen (core/nccl_load.c). For tools (ncfsm-info) and diagnostics; the
 * engine only uses the ncfsm__backend table. Plain C: no CUDA or NCCL types,
 * so a program can include it without the CUDA include directory.
 *
 * Only declared in builds with NCFSM_HAVE_NCCL (the functions live in
 * core/nccl_load.c and core/nccl_device.c).
 */
#ifndef NCFSM_CORE_NCCL_DL_H
#define NCFSM_CORE_NCCL_DL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NCFSM__NCCL_PATH_MAX 1024
#define NCFSM__NCCL_WHY_MAX 512

typedef struct ncfsm__nccl_info {
  /* Build time: the headers the backend was compiled with. */
  int header_nccl_version;   /* NCCL_VERSION_CODE */
  int header_cudart_version; /* CUDART_VERSION */

  /* libnccl.so.2 */
  int nccl_loaded;                     /* dlopen and the required symbols succeeded */
  int nccl_version;                    /* ncclGetVersion; 0 when not loaded */
  char nccl_path[NCFSM__NCCL_PATH_MAX]; /* the file dlopen found ("" when not loaded) */
  char nccl_why[NCFSM__NCCL_WHY_MAX];   /* why not loaded ("" when loaded) */
  unsigned features;                   /* NCFSM__HAS_* (core/backend.h) */

  /* libcudart */
  int cudart_loaded;
  int cudart_version;                    /* cudaRuntimeGetVersion; 0 when unknown */
  int driver_version;                    /* cudaDriverGetVersion; 0 when no driver */
  char cudart_path[NCFSM__NCCL_PATH_MAX];
  char cudart_why[NCFSM__NCCL_WHY_MAX];
  int has_stream_get_device;             /* cudaStreamGetDevice (CUDA >= 12.8) resolved */

  /* cudaGetDeviceCount */
  int device_count;                      /* 0 on error */
  int device_count_rc;                   /* its cudaError_t (0 = success) */
  char device_why[NCFSM__NCCL_WHY_MAX];  /* cudaGetErrorString text when it failed */

  /* The backend's open(): 0 when usable, else why (the first failure above). */
  int open_rc;
  char open_why[NCFSM__NCCL_WHY_MAX];
} ncfsm__nccl_info;

/* Loads the libraries (as open() does, once per process) and fills *out. */
void ncfsm__nccl_get_info(ncfsm__nccl_info *out);

typedef struct ncfsm__nccl_device_info {
  int ordinal;
  char name[256];        /* cuDeviceGetName ("" when the driver API is unavailable) */
  char pci_bus_id[32];   /* cudaDeviceGetPCIBusId, "domain:bus:device.function" */
  uint64_t total_mem;    /* bytes, cuDeviceTotalMem (0 when unavailable) */
  int cc_major, cc_minor;/* compute capability */
} ncfsm__nccl_device_info;

/* Describes visible device `ordinal` without creating a CUDA context. 0 on
 * success; else nonzero with the reason in why. */
int ncfsm__nccl_device_info_get(int ordinal, ncfsm__nccl_device_info *out, char *why, size_t why_len);

/* "2.28.9" for 22809 (also the pre-2.9 encoding X*1000+Y*100+Z). */
void ncfsm__nccl_version_str(int code, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif

/*
 * Device descriptions for ncfsm-info (core/nccl_dl.h): the PCI bus id and the
 * compute capability from the CUDA runtime, the name and the memory size
 * from the driver API (libcuda.so.1, loaded with dlopen on first use),
 * without creating a CUDA context.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/nccl_internal.h"

/* Driver API: only for device names and memory sizes. */
static struct {
  __typeof__(&cuInit) cuInit;
  __typeof__(&cuDeviceGet) cuDeviceGet;
  __typeof__(&cuDeviceGetName) cuDeviceGetName;
  __typeof__(&cuDeviceTotalMem) cuDeviceTotalMem; /* cuDeviceTotalMem_v2 */
} drv;

static pthread_once_t drv_once = PTHREAD_ONCE_INIT;
static int drv_ok;
static char drv_why[256];

static void load_driver(void) {
  (void)dlerror();
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(drv_why, sizeof drv_why, "libcuda.so.1 not found: %s", ncfsm__nccl_dl_error());
    return;
  }
  drv.cuInit = (__typeof__(drv.cuInit))dlsym(h, "cuInit");
  drv.cuDeviceGet = (__typeof__(drv.cuDeviceGet))dlsym(h, "cuDeviceGet");
  drv.cuDeviceGetName = (__typeof__(drv.cuDeviceGetName))dlsym(h, "cuDeviceGetName");
  drv.cuDeviceTotalMem = (__typeof__(drv.cuDeviceTotalMem))dlsym(h, "cuDeviceTotalMem_v2");
  if (!drv.cuInit || !drv.cuDeviceGet || !drv.cuDeviceGetName || !drv.cuDeviceTotalMem) {
    snprintf(drv_why, sizeof drv_why, "libcuda.so.1 lacks cuInit/cuDeviceGet/cuDeviceGetName/cuDeviceTotalMem_v2");
    return;
  }
  CUresult r = drv.cuInit(0);
  if (r != CUDA_SUCCESS) {
    snprintf(drv_why, sizeof drv_why, "cuInit failed (CUresult %d)", (int)r);
    return;
  }
  drv_ok = 1;
}

int ncfsm__nccl_device_info_get(int ordinal, ncfsm__nccl_device_info *out, char *why, size_t why_len) {
  ncfsm__nccl_load();
  memset(out, 0, sizeof *out);
  out->ordinal = ordinal;
  if (!ncfsm__nccl_found.cudart_loaded) {
    snprintf(why, why_len, "%s", ncfsm__nccl_found.cudart_why);
    return 1;
  }
  if (ordinal < 0 || ordinal >= ncfsm__nccl_found.device_count) {
    snprintf(why, why_len, "device %d is not visible (%d device(s))", ordinal, ncfsm__nccl_found.device_count);
    return 1;
  }
  why[0] = '\0';
  cudaError_t e = ncfsm__rt.cudaDeviceGetPCIBusId(out->pci_bus_id, (int)sizeof out->pci_bus_id, ordinal);
  if (e != cudaSuccess) {
    snprintf(out->pci_bus_id, sizeof out->pci_bus_id, "?");
    (void)ncfsm__rt.cudaGetLastError();
  }
  if (ncfsm__rt.cudaDeviceGetAttribute(&out->cc_major, cudaDevAttrComputeCapabilityMajor, ordinal) != cudaSuccess ||
      ncfsm__rt.cudaDeviceGetAttribute(&out->cc_minor, cudaDevAttrComputeCapabilityMinor, ordinal) != cudaSuccess) {
    out->cc_major = out->cc_minor = 0;
    (void)ncfsm__rt.cudaGetLastError();
  }
  pthread_once(&drv_once, load_driver);
  if (!drv_ok) {
    snprintf(why, why_len, "%s", drv_why);
    return 0; /* partial: bus id and compute capability only */
  }
  CUdevice d;
  if (drv.cuDeviceGet(&d, ordinal) == CUDA_SUCCESS) {
    if (drv.cuDeviceGetName(out->name, (int)sizeof out->name, d) != CUDA_SUCCESS) out->name[0] = '\0';
    size_t bytes = 0;
    if (drv.cuDeviceTotalMem(&bytes, d) == CUDA_SUCCESS) out->total_mem = bytes;
  }
  return 0;
}

